"""`graphmode mcp`: graphmode's commands as Model Context Protocol tools, over stdio (the `mcp` extra)."""
