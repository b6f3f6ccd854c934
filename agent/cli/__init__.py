"""The `graphmode` command line: one module per command, and the terminal session. `main` is the entry point
(`graphmode`, `python -m graphmode.agent.cli`)."""
from graphmode.agent.cli.main import main

__all__ = ["main"]
