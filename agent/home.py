"""Where graphmode keeps its state: one SQLite file for every session and batch of this user.

A module of its own, with nothing but the standard library, so that commands that only read or write that state
(`graphmode batch` on a finished manifest) start without loading the workflow (langgraph takes seconds to import).
"""
from __future__ import annotations

from pathlib import Path

from graphmode.runners.interpreter import graphmode_home


def sessions_db() -> Path:
    """One database for every session of this user; GRAPHMODE_HOME moves it (tests, CI)."""
    home = graphmode_home()
    home.mkdir(parents=True, exist_ok=True)
    return home / "sessions.sqlite"
