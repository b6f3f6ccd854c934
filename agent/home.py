"""Where graphmode keeps its state: one SQLite file for every session and batch of this user.

A module of its own, with nothing but the standard library, so that commands that only read or write that state
(`graphmode batch` on a finished manifest) start without loading the workflow (langgraph takes seconds to import).
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from graphmode.runners.interpreter import graphmode_home


def sessions_db() -> Path:
    """One database for every session of this user; GRAPHMODE_HOME moves it (tests, CI)."""
    home = graphmode_home()
    home.mkdir(parents=True, exist_ok=True)
    return home / "sessions.sqlite"


def session_saved(session: str) -> bool | None:
    """Whether a session of that id was saved, read straight from the database so that `graphmode resume` refuses an
    unknown id without importing the workflow; None when the database does not say (langgraph's table is absent or
    laid out otherwise), and the workflow decides."""
    path = sessions_db()
    if not path.exists():
        return False
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            row = connection.execute("SELECT 1 FROM checkpoints WHERE thread_id = ? LIMIT 1", (session,)).fetchone()
    except sqlite3.Error:
        return None
    return row is not None
