"""One batch target's run: a `graphmode adapt` process with a time limit, and what it left behind.

The same function runs a job on this machine (one thread per job slot) and inside a Ray task on another node
(agent.batch.ray_executor), so everything it needs travels in the job (the target file's text too) and everything the
summary needs comes back in the outcome (report.json's contents, not only its path). Standard library only.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from graphmode.runners.child_process import die_with_parent

LOG_NAME = "adapt.log"
# A stopped run gets SIGTERM first, so adapt unwinds as on Ctrl-C (its own workers killed, its session saved), and
# SIGKILL after this long.
_GRACE_S = 10.0
_POLL_S = 0.2
# adapt's one-line error: "graphmode: error: MESSAGE" (bad input) or "graphmode: internal error: MESSAGE".
_ERROR_LINE = re.compile(r"^graphmode: ((?:internal )?error: .*)$", re.MULTILINE)
_SESSION = re.compile(r"\(session ([0-9a-f]+)\)")


@dataclass
class BatchJob:
    name: str
    folder: str  # the target's own batch folder: emptied, then it holds `files`, the log and the run folder
    args: list[str]  # what follows `python` (-m graphmode.agent.cli adapt ...)
    files: dict[str, str] = field(default_factory=dict)  # written into `folder` before the run
    timeout_s: float = 3600.0
    env: dict[str, str] = field(default_factory=dict)  # added to the environment (which devices it sees, ...)


@dataclass
class JobOutcome:
    name: str
    exit_code: int | None  # None: stopped (timed out or interrupted) before it exited by itself
    timed_out: bool = False
    interrupted: bool = False
    seconds: float = 0.0
    report: dict | None = None  # the run folder's report.json
    report_path: str | None = None
    error: str | None = None  # the run's own one-line error, or the last line it printed
    session: str | None = None
    host: str = ""


def run_job(job: BatchJob, stop: threading.Event | None = None,
            progress: Callable[[str], None] | None = None) -> JobOutcome:
    """Runs the job to its end, its time limit, or `stop`; whatever happens, no process of it outlives this call.
    `progress` is handed each line the run prints, as it prints it (read back from its log between polls)."""
    folder = Path(job.folder)
    _empty(folder)  # an earlier attempt's report must never be read as this one's
    for name, text in job.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    log = folder / LOG_NAME
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as handle:
        # Its own session, so the whole group can be stopped (start_new_session), and it dies with us if we are
        # killed outright (die_with_parent); cwd is its folder, which exists wherever the job runs.
        proc = subprocess.Popen([sys.executable, *job.args], stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=folder, env={**os.environ, **job.env},
                                start_new_session=True, preexec_fn=die_with_parent)
        try:
            timed_out, interrupted = _watch(proc, _LogLines(log, progress), started, job.timeout_s, stop)
        except BaseException:
            _stop(proc, 0.0)
            raise
    seconds = time.perf_counter() - started
    text = log.read_text(encoding="utf-8", errors="replace")
    report_path = _report(folder)
    report = _read_report(report_path) if report_path is not None else None
    stopped = timed_out or interrupted
    session = _SESSION.search(text)
    return JobOutcome(name=job.name, exit_code=None if stopped else proc.returncode, timed_out=timed_out,
                      interrupted=interrupted, seconds=seconds, report=report,
                      report_path=str(report_path) if report_path else None,
                      error=None if proc.returncode == 0 and not stopped else _error(text),
                      session=session.group(1) if session else None, host=socket.gethostname())


def _watch(proc: subprocess.Popen, lines: _LogLines, started: float, timeout_s: float,
           stop: threading.Event | None) -> tuple[bool, bool]:
    """(timed out, interrupted): polls the run, reading its log, until it exits, passes its time limit or `stop` is
    set; a run stopped either way has its process group stopped here."""
    while True:
        try:
            proc.wait(timeout=_POLL_S)
            lines.read()
            return False, False
        except subprocess.TimeoutExpired:
            lines.read()
        timed_out = time.perf_counter() - started > timeout_s
        interrupted = not timed_out and stop is not None and stop.is_set()
        if timed_out or interrupted:
            _stop(proc, _GRACE_S)
            return timed_out, interrupted


def _read_report(path: Path) -> dict | None:
    """The run's report.json, None when it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class _LogLines:
    """The lines a run has added to its log since the last read, each handed to `progress` once it is whole."""

    def __init__(self, log: Path, progress: Callable[[str], None] | None):
        self._log, self._progress = log, progress
        self._offset, self._partial = 0, b""

    def read(self) -> None:
        if self._progress is None:
            return
        with open(self._log, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        self._offset += len(data)
        *whole, self._partial = (self._partial + data).split(b"\n")
        for line in whole:
            self._progress(line.decode("utf-8", errors="replace"))


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the run's process group, then SIGKILL if it has not exited within `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        if grace_s <= 0 and sig == signal.SIGTERM:
            continue
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _report(folder: Path) -> Path | None:
    """The run folder's report.json: adapt writes it into OUT/<run folder>/, and OUT is this job's folder."""
    found = sorted(folder.glob("*/report.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _error(text: str) -> str | None:
    """adapt's own one-line error ("graphmode: error: ..."), else the last line it printed."""
    said = _ERROR_LINE.findall(text)
    if said:
        return said[-1].strip().removeprefix("error: ")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


def _empty(folder: Path) -> None:
    """The folder, emptied (read-only entries made writable first: adapted copies keep no modes, but be sure)."""
    def retry(function, name, _):
        os.chmod(os.path.dirname(name) or ".", stat.S_IRWXU)
        function(name)

    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, onerror=retry)
    folder.mkdir(parents=True, exist_ok=True)
