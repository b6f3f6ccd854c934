"""Running a worker module in a fresh Python process, with a timeout and kept logs.

User code runs only in these children: a crash, a hang or a leaked Dynamo cache there
cannot take down the caller, and each child starts from an identical, clean state.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from graphmode.runners.child_process import die_with_parent as _die_with_parent
from graphmode.runners.interpreter import worker_environment, worker_python
from graphmode.runners.measure.shared_cores import claim, without_claim
from graphmode.runners.workers.common import ERROR_PREFIX


class WorkerError(RuntimeError):
    """A worker failed or timed out; the message is one line, the worker's own if it gave one."""


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # The checkout's top-level folders never go on PYTHONPATH: `agent` or `templates` must not shadow a harness's own
    # packages of the same name. graphmode's interpreter imports the installed package; a target's own interpreter
    # (runners.interpreter) gets a folder holding `graphmode/` alone.
    return worker_environment(without_claim({**os.environ, **(extra or {})}))


def _kill_group(proc: subprocess.Popen) -> None:
    """Kills the child's whole process group (the group we created for it, named by its id)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _error_line(stderr: str) -> str | None:
    lines = [line for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    return lines[-1][len(ERROR_PREFIX):].strip() if lines else None


def run_worker(module: str, args: list[str], *, name: str, timeout_s: float,
               log_dir: Path | None = None, error: type[WorkerError] = WorkerError,
               env: dict[str, str] | None = None, cores_alone: bool = False) -> float:
    """Runs `python -m module args...` (with `env` added to this process's environment) under the interpreter the
    target's model runs under (runners.interpreter); returns the wall seconds from spawn to exit; raises `error`
    with a one-line message on failure. In a batch whose targets share the cores (runners.measure.shared_cores) it first
    waits for its claim on them: alone for a timing run (`cores_alone`), shared otherwise; the timeout and the
    seconds returned start once it holds them."""
    with claim(alone=cores_alone):
        return _run(module, args, name=name, timeout_s=timeout_s, log_dir=log_dir, error=error, env=env)


def _run(module: str, args: list[str], *, name: str, timeout_s: float, log_dir: Path | None,
         error: type[WorkerError], env: dict[str, str] | None) -> float:
    command = [worker_python(), "-m", module, *args]
    started = time.perf_counter()
    # A new session so a timeout can kill the whole group (Inductor may fork compile workers). Being in its own
    # session, the child does not get the terminal's Ctrl-C: the parent kills the group on every way out. Its stdin
    # is not the terminal either, so nothing in it can change the terminal's modes under the person's keys.
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_child_env(env), start_new_session=True, preexec_fn=_die_with_parent)
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        stdout, stderr = proc.communicate()
    except BaseException:  # Ctrl-C, SIGTERM (the CLI raises it as Ctrl-C): no worker outlives graphmode
        _kill_group(proc)
        proc.wait()
        raise
    seconds = time.perf_counter() - started
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{name}.stdout.log").write_text(stdout)
        (log_dir / f"{name}.stderr.log").write_text(stderr)
    if timed_out:
        raise error(f"the {name} worker ({' '.join(command[2:4])}) timed out after {timeout_s:g} s"
                    f"{_last_words(stdout, stderr)} (--timeout sets the limit)")
    if proc.returncode != 0:
        raise error(f"the {name} worker failed: {_failure(proc.returncode, stderr)}")
    return seconds


def _last_words(stdout: str, stderr: str) -> str:
    """The last line a stopped worker printed (its stdout first), for the message."""
    said = [line.strip() for line in stdout.splitlines() if line.strip()] \
        or [line.strip() for line in stderr.splitlines() if line.strip()]
    return f"; the last line it printed: {said[-1][:200]}" if said else "; it printed nothing"


def _failure(returncode: int, stderr: str) -> str:
    """The error line a failed worker wrote, else its exit status and last line."""
    message = _error_line(stderr)
    if message is not None:
        return message
    tail = [line for line in stderr.splitlines() if line.strip()]
    return f"exit status {returncode}" + (f": {tail[-1].strip()}" if tail else "")
