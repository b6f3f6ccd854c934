"""What each `graphmode mcp` tool does, as plain functions: the command line's own code (agent.cli), given arguments
the server has checked against its folders (agent.mcp_server.paths), returning JSON-ready dicts. Bad input is a
UserError with the command line's message. A session is the command line's too: one started here is resumed by
`graphmode resume` and the other way round.

Heavy modules (torch, the workflow) are imported by the functions that need them, never at import.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from graphmode.agent.errors import UserError
from graphmode.agent.mcp_server.paths import Folders

_SESSION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def scan(folders: Folders, paths: list[str], check_fixes: bool = False) -> dict[str, Any]:
    """The static rules over files and folders: the findings as `graphmode scan --format json` gives them."""
    from graphmode.transforms.scan import finding_record, scan_paths

    if not paths:
        raise UserError("paths: give at least one file or folder")
    checked = [folders.readable(path, "paths") for path in paths]
    result = scan_paths(checked, jobs=1, check_fixes=check_fixes)
    return {"findings": [finding_record(f, result) for f in result.findings], "files": result.files,
            "errors": [{"path": str(e.path), "message": e.message} for e in result.errors],
            "seconds": round(result.seconds, 3)}


def design(folders: Folders, target: str, backend: str | None = None, steps: int | None = None,
           runs: int | None = None) -> dict[str, Any]:
    """`graphmode adapt TARGET` without --yes: analyze and design, then the session stops for confirmation."""
    from graphmode.agent.cli.adapt import start_adapt

    path = folders.readable(target, "target")
    _hold_target_file(folders, path)
    args = argparse.Namespace(path=path, hf=None, tiny=False, python=None, yes=False,
                              backend=backend, out=folders.out, steps=steps, runs=runs, similarity=None,
                              compile_cache=None, timeout=None, batch_buckets=None, rounds=None)
    _, session = start_adapt(args)
    return session_result(folders, session)


def _hold_target_file(folders: Folders, target: Path) -> None:
    """A graphmode.toml in the target (or the target itself) may name a harness elsewhere, a local --hf folder and
    the sources to rewrite: adapt would read and run them, so each is held to the roots as the target is, before
    anything runs."""
    from graphmode.agent.targets import target_file

    found = target_file.find(target)
    if found is None:
        return
    file = target_file.load(found)
    harness = file.relative(file.target.get("harness", "harness.py"))
    folders.within(harness, f"{found}: [target] harness")
    for name in file.target.get("sources") or []:
        folders.within(harness.parent / name, f"{found}: [target] sources")
    hf = file.target.get("hf")
    if hf is not None and file.relative(hf).exists():  # else a model type ("llama"), as adapt reads it
        folders.within(file.relative(hf), f"{found}: [target] hf")


def apply(folders: Folders, session: str, approve: list[str] | None = None, decline_all: bool = False,
          revise: dict[str, str] | None = None) -> dict[str, Any]:
    """`graphmode resume SESSION` with the person's answer: the changes to apply (all when none is named), none, or
    revised parameters ({"C4.max_seq_len": "4096"}: the design is made again and the session stops again)."""
    from graphmode.agent.cli.sessions import run_resume

    _saved(folders, session)
    if sum((approve is not None, decline_all, bool(revise))) > 1:
        raise UserError("give one of approve, decline_all and revise")
    run_resume(argparse.Namespace(session=session, approve=",".join(approve) if approve is not None else None,
                                  reject_all=decline_all,
                                  revise=[f"{key}={value}" for key, value in (revise or {}).items()] or None))
    return session_result(folders, session)


def verify(folders: Folders, original: str, adapted: str, backend: str | None = None, steps: int | None = None,
           runs: int | None = None) -> dict[str, Any]:
    """`graphmode verify ORIGINAL ADAPTED`: verify and report alone."""
    from graphmode.agent.cli.verify import verified

    state = verified(argparse.Namespace(original=folders.readable(original, "original"),
                                        adapted=folders.readable(adapted, "adapted"), backend=backend,
                                        out=folders.out, steps=steps, runs=runs, similarity=None, timeout=None))
    return report_result(state)


def report(folders: Folders, session: str) -> dict[str, Any]:
    """A finished session's report."""
    snapshot, state = _saved(folders, session)
    if snapshot.next or not state.report_path:
        raise UserError(f"session {session} has no report yet: it stands at {', '.join(snapshot.next)}")
    return report_result(state)


def sessions(folders: Folders) -> dict[str, Any]:
    """Every saved session on a target under the roots and where it stands, as `graphmode sessions` lists them; the
    others (the command line's on other folders) are left out, as the other tools refuse them."""
    from graphmode.agent.cli.sessions import session_rows
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer, sessions_db

    with open_checkpointer() as checkpointer:
        rows = session_rows(build_graph(checkpointer), checkpointer)
    return {"sessions_db": str(sessions_db()),
            "sessions": [dict(zip(("session", "target", "stands_at", "report_md"), row)) for row in rows
                         if row[1] and folders.holds(row[1])]}


def session_result(folders: Folders, session: str) -> dict[str, Any]:
    """Where a session stands: its design and what a person is asked, when it stopped for confirmation; its report
    once finished."""
    snapshot, state = _saved(folders, session)
    if not snapshot.next:
        return report_result(state)
    from graphmode.agent.workflow.adaptation import parameter_values
    from graphmode.agent.workflow.revisions import parameters_of

    values = parameter_values(state)
    return {
        "session": session, "stands_at": list(snapshot.next), "round": state.round,
        "run_dir": state.options.run_dir, "design_md": state.design_path, "planned_diff": state.planned_diff_path,
        "baseline": state.baseline.headline or None,
        "changes": [{"id": c.id, "codemod": c.codemod, "title": c.title, "description": c.description,
                     "skill": c.skill, "files": c.files, "requires": c.requires, "diff_path": c.diff_path,
                     "findings_fixed": len(c.fixes), "parameters": {name: values[name] for name in parameters_of(c)}}
                    for c in state.plan],
        "items_for_a_person": [{"path": m.path, "line": m.line, "kind": m.kind, "code": m.code or m.codemod,
                                "message": m.message or m.reason, "why": m.why} for m in state.manual],
        "findings": [f.to_dict() for f in state.findings],
        "declined_before": state.declined,
    }


def report_result(state) -> dict[str, Any]:
    """report.json's fields, with the paths of the report and its run folder and the exit status the command line
    gives (0 verified, 1 not verified)."""
    from graphmode.agent.cli.terminal import finished_status

    report_md = Path(state.report_path)
    fields = json.loads((report_md.parent / "report.json").read_text(encoding="utf-8"))
    return {**fields, "session": state.session_id, "stands_at": [], "exit_status": finished_status(state),
            "report_md": str(report_md), "report_json": str(report_md.parent / "report.json"),
            "run_dir": state.options.run_dir, "adapted_dir": state.adapted_dir}


def _saved(folders: Folders, session: str):
    """A saved session's snapshot and state; an unknown id, or a session on a target outside the server's folders,
    is bad input."""
    from graphmode.agent.cli.sessions import load
    from graphmode.agent.home import sessions_db
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer

    if not isinstance(session, str) or not _SESSION.fullmatch(session):
        raise UserError(f"no session {session} (sessions are kept in {sessions_db()})")
    with open_checkpointer() as checkpointer:
        snapshot, state = load(build_graph(checkpointer), session)
    folders.within(state.options.target, f"session {session}'s target")
    return snapshot, state
