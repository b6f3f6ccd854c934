"""The LangGraph workflow: its graph, its typed state, one function per step, and the helpers of the steps."""
