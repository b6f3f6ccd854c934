"""`graphmode verify ORIGINAL ADAPTED`: verify and report alone, on a target folder and a folder of adapted sources
(perhaps edited by hand since graphmode wrote it); agent.workflow.verify_only does the work. Exit status as for
`graphmode adapt`: 0 verified, 1 not verified, 2 bad input."""
from __future__ import annotations

import argparse
import uuid
from pathlib import Path

from graphmode.agent.cli.consoles import console
from graphmode.agent.errors import UserError
from graphmode.runners.backends import BACKEND_NAMES, help_text as backend_help
from graphmode.runners.run_settings import SETTINGS, help_with_default

OPTIONS = ("backend", "out", "steps", "runs", "similarity", "timeout")


def add_verify_parser(commands) -> None:
    verify = commands.add_parser(
        "verify", help="verify and report on a folder of adapted sources, edited by hand or not",
        description="Runs `graphmode adapt`'s verify and report steps alone: the original target eagerly against the "
                    "adapted sources with Decode compiled, the same workers and equivalence battery, and the same "
                    "report. The adapted files are laid over a copy of the target in the run folder; neither folder "
                    "is changed. When ADAPTED is a folder graphmode wrote (adapted/ of a run folder, or `graphmode "
                    "fix`'s output), the report lists the files that differ from what it wrote. Exit status: 0 "
                    "verified, 1 not verified, 2 bad input, 3 internal error.")
    verify.add_argument("original", type=Path, metavar="ORIGINAL",
                        help="the target folder (with its harness.py), as `graphmode adapt` was given it")
    verify.add_argument("adapted", type=Path, metavar="ADAPTED", help="the folder of adapted sources")
    verify.add_argument("--backend", default=None, help=backend_help())
    verify.add_argument("--out", type=Path, default=None,
                        help=help_with_default("out") + "; the report goes to OUT/<target>-verify")
    for key in ("steps", "runs", "similarity", "timeout"):
        kind = float if key in ("similarity", "timeout") else int
        verify.add_argument(SETTINGS[key].flag, type=kind, default=None, help=help_with_default(key))


def run_verify(args: argparse.Namespace) -> int:
    state = verified(args)
    console.print(f"\nReport: [bold]{state.report_path}[/]")
    from graphmode.agent.cli.terminal import finished_status

    status = finished_status(state)
    v = state.verification
    console.print("[green]Verified.[/]" if status == 0 else
                  "[red]Not verified:[/] " + "; ".join(v.problems if v is not None else ["no verification"]),
                  soft_wrap=True)
    return status


def verified(args: argparse.Namespace):
    """The arguments checked (bad input is a UserError), then verify and report: the finished state."""
    from graphmode.agent.workflow.verify_only import check_folders, check_run_dir

    values = {key: getattr(args, key) if getattr(args, key) is not None else SETTINGS[key].default for key in OPTIONS}
    for key in ("steps", "runs", "similarity", "timeout"):
        problem = SETTINGS[key].problem(values[key])
        if problem:
            raise UserError(f"{SETTINGS[key].flag} {format(values[key], 'g')}: {problem}")
    if values["backend"] not in BACKEND_NAMES:
        raise UserError(f"--backend {values['backend']}: unknown; valid names: {', '.join(BACKEND_NAMES)}")
    target, adapted = check_folders(args.original, args.adapted)
    run_dir = Path(values["out"]) / f"{target.name}-verify"
    check_run_dir(run_dir, target, adapted)
    return start(target, adapted, run_dir.resolve(), values)


def start(target: Path, adapted: Path, run_dir: Path, values: dict):
    """Verifies and reports, saying each verify run as it finishes; the finished state."""
    from graphmode.agent.output import run_folder_lock
    from graphmode.agent.workflow.progress import listening
    from graphmode.agent.workflow.state import RunOptions
    from graphmode.agent.workflow.verify_only import prepare, verify_and_report
    from graphmode.runners.backends import BackendUnavailable, resolve

    try:
        backend, why = resolve(values["backend"])
    except BackendUnavailable as error:
        raise UserError(str(error)) from None
    options = RunOptions(target=str(target), run_dir=str(run_dir), backend=backend.name, steps=values["steps"],
                         runs=values["runs"], similarity=values["similarity"], timeout_s=values["timeout"])
    console.print(f"graphmode: verifying [bold]{adapted}[/] against [bold]{target}[/]", soft_wrap=True)
    console.print(f"backend {backend.name}: {why}", soft_wrap=True)
    session = uuid.uuid4().hex[:8]
    with run_folder_lock(run_dir, session), \
            listening(lambda line: console.print(line, soft_wrap=True, markup=False)):
        return verify_and_report(prepare(target, adapted, options, session))
