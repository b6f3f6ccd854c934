"""`python -m graphmode.agent.cli`: the `graphmode` command."""
import sys

from graphmode.agent.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
