"""The workflow (LangGraph), its state, its outputs and the `graphmode` command line."""
