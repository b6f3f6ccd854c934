"""`graphmode resume` and `graphmode sessions`: the saved sessions, carried on or listed."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.table import Table

from graphmode.agent.cli.consoles import EXIT_STOPPED, console
from graphmode.agent.cli.terminal import ask, drive, finished_status, session_config
from graphmode.agent.errors import UserError


def run_resume(args: argparse.Namespace) -> int:
    from graphmode.agent.home import session_saved, sessions_db

    if session_saved(args.session) is False:
        raise UserError(f"no session {args.session} (sessions are kept in {sessions_db()})")
    from langgraph.types import Command

    from graphmode.agent.output import run_folder_lock
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer

    with open_checkpointer() as checkpointer:
        graph = build_graph(checkpointer)
        snapshot, state = load(graph, args.session)
        if not snapshot.next:
            # The session's own verdict, as `graphmode adapt` gave it: a script reading the status must not take a
            # finished but unverified session for a verified one.
            status = finished_status(state)
            console.print(f"session {args.session} has finished, {'verified' if status == 0 else 'not verified'}; "
                          f"its report: {state.report_path}", soft_wrap=True)
            return status
        if "confirm" not in snapshot.next:  # interrupted (Ctrl-C) in another step: carry on from there
            if args.approve is not None or args.reject_all or args.revise:
                raise UserError(f"session {args.session} stopped before confirmation (at {', '.join(snapshot.next)}); "
                                "resume it without --approve/--reject-all/--revise, then choose")
            with run_folder_lock(Path(state.options.run_dir), args.session):
                return drive(graph, None, args.session, interactive=sys.stdin.isatty())
        if args.approve is not None:
            from graphmode.agent.workflow.choices import choice_problem

            answer = [c.strip().upper() for c in args.approve.split(",") if c.strip()]
            # Checked here, before the session sees it: a wrong answer leaves the session as it was.
            problem = choice_problem(state.plan, answer)
            if problem:
                raise UserError(f"--approve {args.approve}: {problem} (session {args.session} is unchanged; the "
                                f"design: {state.design_path})")
        elif args.reject_all:
            answer = []
        elif args.revise:
            answer = {"revise": _revisions(args, state)}
        elif sys.stdin.isatty():
            answer = ask(state)
        elif state.round > 1:  # a later round: what a person declined before stays out unless chosen by id
            from graphmode.agent.workflow.choices import proposed_choice

            proposed = proposed_choice(state.plan, state.declined)
            console.print(f"round {state.round}: approving {', '.join(proposed) or 'nothing'} of "
                          f"{state.design_path} (what you declined before stays out; --approve to choose)")
            answer = "proposed"
        else:
            console.print(f"approving all {len(state.plan)} changes of {state.design_path}")
            answer = "all"
        if answer is None:
            return EXIT_STOPPED
        with run_folder_lock(Path(state.options.run_dir), args.session):
            # At a terminal, a later confirmation (a revised design, a repair round) is asked there too.
            return drive(graph, Command(resume=answer), args.session, interactive=sys.stdin.isatty())


def load(graph, session: str):
    """A saved session's snapshot (where it stands: `snapshot.next`) and state; an unknown id is bad input."""
    from graphmode.agent.home import sessions_db
    from graphmode.agent.workflow.graph import saved_state

    snapshot = graph.get_state(session_config(session))
    if not snapshot.values:
        raise UserError(f"no session {session} (sessions are kept in {sessions_db()})")
    return snapshot, saved_state(session, snapshot.values)


def _revisions(args: argparse.Namespace, state) -> dict:
    """--revise C4.max_seq_len=4096 ... as {parameter: value}, each checked against the design before the session
    sees it."""
    from graphmode.agent.workflow.adaptation import fused_ops_for
    from graphmode.agent.workflow.revisions import parse_revision, source_classes

    values = {}
    for text in args.revise:
        try:
            name, value = parse_revision(state.plan, text, source_classes(state), fused_ops_for(state.options.backend))
        except ValueError as error:
            raise UserError(f"--revise {error} (session {args.session} is unchanged; the design: "
                            f"{state.design_path})") from None
        values[name] = value
    return values


def run_sessions() -> int:
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer, sessions_db

    with open_checkpointer() as checkpointer:
        rows = session_rows(build_graph(checkpointer), checkpointer)
        table = Table(title=f"Sessions in {sessions_db()}")
        for column in ("session", "target", "stands at", "report"):
            table.add_column(column)
        if not console.is_terminal:  # piped or redirected: whole paths, one session per line, tab-separated
            print("\t".join(("session", "target", "stands at", "report")))
            for row in rows:
                print("\t".join(row))
            return 0
        for row in rows:
            table.add_row(*row)
        console.print(table)
    return 0


def session_rows(graph, checkpointer) -> list[tuple[str, str, str, str]]:
    """Every saved session as (id, target, the steps it stands at or "finished", report path)."""
    from graphmode.agent.workflow.graph import saved_target

    # Read the ids first: the saver holds its lock while listing, and get_state needs it too.
    sessions = dict.fromkeys(c.config["configurable"]["thread_id"] for c in checkpointer.list(None))
    rows = []
    for session in sessions:
        snapshot = graph.get_state(session_config(session))
        values = snapshot.values
        rows.append((session, saved_target(values), ", ".join(snapshot.next) or "finished",
                     values.get("report_path", "")))
    return rows
