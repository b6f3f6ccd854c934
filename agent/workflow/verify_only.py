"""`graphmode verify`: the workflow's verify and report steps alone, on a target folder and a folder of adapted sources
that a person may have edited after graphmode wrote it.

The two folders are only read. The adapted files are laid over a copy of the target in the run folder (a folder
`graphmode fix` wrote holds only the files it changed), and that copy is what the workers run, so neither folder
gets so much as a __pycache__. The adapted side runs as a session's own would: the same verify node, workers,
equivalence battery and report (agent.workflow.nodes). When the adapted folder is `adapted/` of a `graphmode adapt`
run folder whose session is saved, that session's design, choices and probe of the original fill the report; the
report then also says which files differ from what graphmode wrote (agent.workflow.hand_edits).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from graphmode.agent.errors import UserError
from graphmode.agent.output import write_overlaid_tree
from graphmode.agent.workflow import nodes
from graphmode.agent.workflow.hand_edits import edited_files
from graphmode.agent.workflow.state import Baseline, RunOptions, RunState

FIX_MARKER = "fix.json"  # agent.cli.fix writes it beside its copies
NOT_PROBED = ("not measured: `graphmode verify` runs no probe of the original (`graphmode adapt` does, and its "
              "report has it)")


@dataclass
class Origin:
    """Who wrote an adapted folder, and what that tells: where its files lie, the diff they were written with, the
    codemods applied and the session."""

    written_by: str | None  # "graphmode adapt", "graphmode fix", or None: not known
    root: Path  # the folder whose files go over the target's
    changes_diff: Path | None = None
    prefix: str = ""  # where changes.diff puts root's files
    applied: list[str] = field(default_factory=list)
    session: RunState | None = None


def check_folders(original: Path, adapted: Path) -> tuple[Path, Path]:
    """Both folders resolved: the target (a folder with a harness.py, or the harness itself) and the adapted folder,
    two different folders that exist. Bad input is a UserError with the command line's wording."""
    from graphmode.agent.targets.resolve import target_folder

    target = target_folder(original)
    if not (target / "harness.py").is_file():
        raise UserError(f"{original}: no harness.py in {target} (the target folder `graphmode adapt` was given)")
    folder = adapted.resolve()
    if not folder.exists():
        raise UserError(f"{adapted}: no such file or folder")
    if not folder.is_dir():
        raise UserError(f"{adapted}: not a folder (give the folder of adapted sources)")
    if folder == target or target in folder.parents or folder in target.parents:
        raise UserError(f"{adapted}: the adapted folder must be apart from the target folder {target}")
    return target, folder


def check_run_dir(run_dir: Path, target: Path, adapted: Path) -> None:
    """The run folder is where verify writes; it may lie in neither folder it reads."""
    run_dir = run_dir.resolve()
    for folder in (target, adapted):
        if run_dir == folder or folder in run_dir.parents or run_dir in folder.parents:
            raise UserError(f"--out {run_dir.parent}: the output must be outside {folder}")


def origin_of(target: Path, adapted: Path) -> Origin:
    """What the adapted folder says of who wrote it: fix.json in it (`graphmode fix`), or changes.diff beside it in
    a run folder (`graphmode adapt`, with its session when report.json names one that is saved)."""
    if (adapted / FIX_MARKER).is_file():
        nested = adapted / target.name  # `graphmode fix FOLDER` puts the copies under the folder's name
        root, prefix = (nested, f"{target.name}/") if nested.is_dir() else (adapted, "")
        try:
            results = json.loads((adapted / FIX_MARKER).read_text(encoding="utf-8")).get("results", [])
        except (OSError, ValueError):
            results = []
        applied = list(dict.fromkeys(name for r in results for name in r.get("applied", [])))
        diff = adapted / "changes.diff"
        return Origin("graphmode fix", root, diff if diff.is_file() else None, prefix, applied)
    diff = adapted.parent / "changes.diff"
    if adapted.name == "adapted" and diff.is_file():
        session = _saved_session(adapted.parent)
        return Origin("graphmode adapt", adapted, diff, "", list(session.applied) if session else [], session)
    return Origin(None, adapted)


def _saved_session(run_dir: Path) -> RunState | None:
    """The session whose report is in `run_dir`, when it is saved and finished in this layout; None otherwise."""
    try:
        session = json.loads((run_dir / "report.json").read_text(encoding="utf-8")).get("session_id")
    except (OSError, ValueError):
        return None
    if not isinstance(session, str):
        return None
    from graphmode.agent.home import session_saved
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer, saved_state

    if session_saved(session) is False:
        return None
    with open_checkpointer() as checkpointer:
        values = build_graph(checkpointer).get_state({"configurable": {"thread_id": session}}).values
    try:
        return saved_state(session, values) if values else None
    except (UserError, ValueError):
        return None


def prepare(target: Path, adapted: Path, options: RunOptions, session_id: str) -> RunState:
    """The state the verify and report steps need, with the adapted files laid over a copy of the target in
    `options.run_dir`/adapted."""
    origin = origin_of(target, adapted)
    run_dir = Path(options.run_dir)
    copy = run_dir / "adapted"
    write_overlaid_tree(target, origin.root, copy, skip=(FIX_MARKER, "changes.diff"))
    files = edited_files(target, origin.root, origin.changes_diff, origin.prefix) if origin.changes_diff else None
    fields = {"session_id": session_id, "options": options, "adapted_dir": str(copy),
              "hand_edits": {"folder": str(adapted), "written_by": origin.written_by, "files": files}}
    if origin.session is None:
        return RunState(**fields, applied=origin.applied, baseline=Baseline(headline=NOT_PROBED))
    # The session's design, choices and probe; its verification, rounds and fusion side are its own, not this one's.
    return origin.session.model_copy(update={
        **fields, "rounds": [], "round": 1, "verification": None, "report_path": "", "unfused_dir": "",
        "stopped": "", "offers": [], "revising": False,
        "options": options.model_copy(update={"python": origin.session.options.python,
                                              "interpreter": origin.session.options.interpreter,
                                              "hf": origin.session.options.hf})})


def verify_and_report(state: RunState) -> RunState:
    """The workflow's verify and report steps on `state`; the finished state (report_path set)."""
    state = state.model_copy(update=nodes.verify(state))
    return state.model_copy(update=nodes.report(state))
