"""Where a batch keeps what each target came to: a table of its own in the sessions' SQLite file (agent.home).

A batch is known by its output folder: the results live there, so the same manifest run into the same folder
resumes, and another folder starts afresh. One row per target, written when it starts (`running`) and when it
ends (its status and its summary row). Every write is one short transaction on a connection of its own, with a
busy timeout, so concurrent jobs (and the adapt sessions checkpointing into the same file) wait their turn rather
than fail.
"""
from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from graphmode.agent.home import sessions_db

RUNNING = "running"
VERIFIED = "verified"
# Every status a finished target can have; a target with none of them (no row, or `running` left by a batch that
# was killed) has yet to run.
FINISHED = (VERIFIED, "not_verified", "bad_input", "error", "stopped", "timeout")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_targets (
    out TEXT NOT NULL,       -- the batch's output folder, resolved: one batch's state
    name TEXT NOT NULL,      -- the target's name in the manifest
    key TEXT NOT NULL,       -- what its result depends on (agent.batch.manifest.BatchTarget.key)
    status TEXT NOT NULL,    -- running, or one of FINISHED
    row TEXT NOT NULL,       -- its summary row (JSON); {} while running
    updated REAL NOT NULL,   -- seconds since the epoch
    PRIMARY KEY (out, name)
)
"""


@contextmanager
def _connection(db: Path | None = None) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(db or sessions_db(), timeout=60)
    try:
        connection.execute(_SCHEMA)
        with connection:  # one transaction: committed on success, rolled back on error
            yield connection
    finally:
        connection.close()


def finished_rows(out: Path) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """name -> (key, status, row) of every finished target of the batch in `out`."""
    with _connection() as db:
        found = db.execute("SELECT name, key, status, row FROM batch_targets WHERE out = ? AND status != ?",
                           (str(out), RUNNING)).fetchall()
    return {name: (key, status, json.loads(row)) for name, key, status, row in found}


def mark_running(out: Path, name: str, key: str) -> None:
    with _connection() as db:
        db.execute("INSERT OR REPLACE INTO batch_targets VALUES (?, ?, ?, ?, '{}', ?)",
                   (str(out), name, key, RUNNING, time.time()))


def record(out: Path, name: str, key: str, status: str, row: dict[str, Any]) -> None:
    """A finished target's status and summary row."""
    assert status in FINISHED, status
    with _connection() as db:
        db.execute("INSERT OR REPLACE INTO batch_targets VALUES (?, ?, ?, ?, ?, ?)",
                   (str(out), name, key, status, json.dumps(row), time.time()))


def forget_running(out: Path, names: list[str] | None = None) -> None:
    """Targets that were running when the batch stopped (or was killed) are pending again: never marked done."""
    with _connection() as db:
        if names is None:
            db.execute("DELETE FROM batch_targets WHERE out = ? AND status = ?", (str(out), RUNNING))
        else:
            db.executemany("DELETE FROM batch_targets WHERE out = ? AND name = ? AND status = ?",
                           [(str(out), name, RUNNING) for name in names])
