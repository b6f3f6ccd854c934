"""Where the command line writes, and the exit statuses its commands share.

Exit status (README, `graphmode --help`): 0 verified, 1 not verified, 2 bad input, 3 internal error, 4 stopped for
confirmation (the session is saved; `graphmode resume ID` continues it), 130 interrupted.
"""
from __future__ import annotations

from rich.console import Console

EXIT_STOPPED = 4
EXIT_INTERRUPTED = 130

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)
