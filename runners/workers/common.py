"""What every worker process shares: one-line errors on stderr and exit status 2.

The parent (verify, probe) reads the single `graphmode-worker-error:` line and shows it to
the user; a traceback is only noise there, so it is printed only with GRAPHMODE_DEBUG=1.
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Callable, TypeVar

from graphmode.runners.harness import describe_exception

T = TypeVar("T")

ERROR_PREFIX = "graphmode-worker-error: "
ERROR_EXIT = 2


class WorkerFailure(RuntimeError):
    """A failure with a complete one-line message for the parent process.

    Defined here, not in the worker module: run as `python -m`, that module is `__main__`.
    """


def call_user(what: str, folder: Path, call: Callable[[], T]) -> T:
    """Runs user code; its failure becomes one line naming the user's file:line."""
    try:
        return call()
    except Exception as exc:
        raise WorkerFailure(f"{what} raised {describe_exception(exc, folder)}") from exc


def run_main(main: Callable[[], None]) -> int:
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - every failure must become one line
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        if isinstance(exc, SystemExit) and isinstance(exc.code, int):
            return exc.code  # argparse usage errors already printed their message
        if os.environ.get("GRAPHMODE_DEBUG") == "1":
            traceback.print_exc()
        sys.stderr.write(f"{ERROR_PREFIX}{_one_line(exc)}\n")
        sys.stderr.flush()
        return ERROR_EXIT
    return 0


def _one_line(exc: BaseException) -> str:
    """The failure as the one line a worker's parent reads: the exception's type where its text lacks it, and the
    releases that have what this transformers lacks where that is why it failed."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if not str(exc).startswith(type(exc).__name__) and not _is_ours(exc):
        message = f"{type(exc).__name__}: {message}"
    diagnosis = _release_diagnosis(exc)
    return f"{message}. {diagnosis[0].upper()}{diagnosis[1:]}" if diagnosis else message


def _release_diagnosis(exc: BaseException) -> str | None:
    """When the model's code failed for something this interpreter's transformers lacks: what, and which releases
    have it (runners.releases). Every worker's failure passes here, so no call site has to ask."""
    from graphmode.runners.measure.env_info import package_version
    from graphmode.runners.probe.crash import exception_chain
    from graphmode.runners.releases import diagnose

    try:
        return diagnose(exception_chain(exc), package_version("transformers"))
    except Exception:  # noqa: BLE001 - a diagnosis must never hide the failure it explains
        return None


def _is_ours(exc: BaseException) -> bool:
    # Our own errors (HarnessError, WorkerFailure) already carry a complete sentence.
    return type(exc).__module__.startswith(("graphmode.runners.", "runners."))
