"""What every child process graphmode starts shares, with the standard library only (no torch: the batch
command, which only starts and watches processes, imports it too)."""
from __future__ import annotations

import signal
import sys


def die_with_parent() -> None:
    """In the child, before it runs: the kernel kills it if graphmode itself is killed (SIGKILL cannot be caught,
    so no clean-up in the parent would run). Linux only; elsewhere the parent's clean-up is all there is."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
