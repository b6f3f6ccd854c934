"""`graphmode adapt`: one target, from the command line (and its graphmode.toml) to a running session.

Everything that can be refused from the arguments and the file system alone is refused before torch, transformers or
the workflow is imported (`_refuse_bad_usage`); then the target's interpreter is checked, the target resolved
(agent.targets.resolve: a harness folder, `--hf`, a convention named by graphmode.toml) and the session started.
"""
from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from graphmode.agent.cli.consoles import console
from graphmode.agent.cli.terminal import drive
from graphmode.agent.errors import UserError
from graphmode.runners.backends import BACKEND_NAMES
from graphmode.runners.run_settings import SETTINGS

if TYPE_CHECKING:
    from graphmode.agent.targets.target_file import TargetFile


def run_adapt(args: argparse.Namespace) -> int:
    return start_adapt(args)[0]


def start_adapt(args: argparse.Namespace) -> tuple[int, str]:
    """Runs a session to its end, or to confirmation without --yes: its exit status and its id."""
    from graphmode.agent.targets.resolve import TargetSpec, resolve as resolve_target
    from graphmode.runners.backends import BackendUnavailable, resolve

    file = _merge_target_file(args)
    _refuse_bad_usage(args)
    interpreter = _target_interpreter(args, file)
    target = resolve_target(TargetSpec(path=args.path, hf=args.hf, tiny=args.tiny, steps=args.steps, out=args.out,
                                       file=file, rewrite=getattr(args, "rewrite", False)), interpreter, _say)
    from graphmode.agent.workflow.state import RunOptions, RunState

    buckets = _batch_buckets(args.batch_buckets)
    try:
        backend, why = resolve(args.backend)
    except BackendUnavailable as error:
        raise UserError(str(error)) from None
    _check_writable(args.out, target.run_dir)

    options = RunOptions(target=str(target.folder), run_dir=str(target.run_dir), backend=backend.name,
                         steps=args.steps, runs=args.runs, similarity=args.similarity,
                         compile_cache=args.compile_cache, batch_buckets=buckets, auto_approve=args.yes,
                         rounds=args.rounds,
                         timeout_s=args.timeout, hf=target.hf_summary(), sources=target.sources,
                         interpreter=interpreter.to_dict(),
                         python=interpreter.path if interpreter.path != sys.executable else None)
    state = RunState(session_id=uuid.uuid4().hex[:8], options=options)
    console.print(f"graphmode: adapting [bold]{target.folder}[/] (session {state.session_id})")
    if options.python:
        console.print(f"the model runs under {interpreter.path} (Python {interpreter.python}, "
                      f"torch {interpreter.torch}, transformers {interpreter.transformers or 'not installed'})",
                      soft_wrap=True)
    console.print(f"backend {backend.name}: {why}")
    from graphmode.agent.output import run_folder_lock
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer

    with open_checkpointer() as checkpointer, run_folder_lock(target.run_dir, state.session_id):
        _say_what_is_replaced(target.run_dir)
        state.options.target = str(target.materialize(_say))
        graph = build_graph(checkpointer)
        return drive(graph, state, state.session_id, interactive=not args.yes and sys.stdin.isatty()), \
            state.session_id


def _say(line: str) -> None:
    console.print(line, soft_wrap=True)


def _merge_target_file(args: argparse.Namespace) -> "TargetFile | None":
    """A graphmode.toml named by PATH (or in the PATH folder) fills what the command line left unsaid."""
    from graphmode.agent.targets import target_file

    found = target_file.find(args.path.resolve()) if args.path is not None else None
    file = target_file.load(found) if found is not None else None
    run = file.run if file else {}
    # What the command line left unsaid: the file's [run], else the setting's default.
    for key, setting in SETTINGS.items():
        if getattr(args, key) is None:
            value = run.get(key, setting.default)
            if key == "out":
                value = Path(value)
            elif key == "batch_buckets" and value is not None:
                value = ",".join(map(str, value))
            setattr(args, key, value)
    if file is None:
        return None
    console.print(f"target file: {file.path}", soft_wrap=True)
    target = file.target
    if "hf" in target:
        if args.hf is not None:
            raise UserError(f"{file.path} names hf = {target['hf']!r}, and the command line --hf {args.hf}; give one")
        local = file.relative(target["hf"])
        args.hf = str(local) if local.exists() else target["hf"]
        args.tiny = args.tiny or target.get("tiny", False)
        args.rewrite = getattr(args, "rewrite", False) or target.get("rewrite", False)
        args.path = None
    else:
        harness = file.relative(target.get("harness", "harness.py"))
        if harness.name != "harness.py":
            raise UserError(f"{file.path}: [target] harness must name a file called harness.py, got {harness.name}")
        args.path = harness.parent
    return file


def _refuse_bad_usage(args: argparse.Namespace) -> None:
    """The checks that need nothing but the arguments and the file system, made before anything heavy is imported
    or started (an interpreter probe, torch, the workflow): a usage error is refused in a blink."""
    _refuse_bad_target(args)
    for key in ("steps", "runs", "similarity", "timeout", "rounds", "compile_cache"):
        value = getattr(args, key)
        problem = SETTINGS[key].problem(value)
        if problem:
            raise UserError(f"{SETTINGS[key].flag} {value if isinstance(value, str) else format(value, 'g')}: "
                            f"{problem}")
    _batch_buckets(args.batch_buckets)
    if args.backend not in BACKEND_NAMES:
        raise UserError(f"--backend {args.backend}: unknown; valid names: {', '.join(BACKEND_NAMES)}")
    _check_out_folder(args.out)


def _refuse_bad_target(args: argparse.Namespace) -> None:
    """_refuse_bad_usage's part for the target: exactly one of a folder and --hf, and an output outside it."""
    if args.hf is not None and args.path is not None:
        raise UserError(f"give a target folder ({args.path}) or --hf {args.hf}, not both")
    if args.hf is not None:
        from graphmode.agent.targets.hf import refuse_missing_path

        refuse_missing_path(args.hf)
        return
    if args.path is None:
        raise UserError("no target: give a folder with a harness.py, or --hf MODEL_TYPE|CONFIG|FOLDER")
    if args.tiny:
        raise UserError("--tiny goes with --hf (a Hugging Face model built from its config)")
    if getattr(args, "rewrite", False):
        raise UserError("--rewrite goes with --hf (a model type transformers implements, its modeling file copied and "
                        "rewritten)")
    from graphmode.agent.targets.resolve import target_folder

    target = target_folder(args.path)
    if (args.out.resolve() / target.name) == target or target in args.out.resolve().parents:
        raise UserError(f"--out {args.out}: the output must be outside the target folder")


def _target_interpreter(args: argparse.Namespace, file: "TargetFile | None"):
    """The interpreter the model runs under (--python, else the target file's python, else graphmode's own), checked
    before anything runs: one that cannot run graphmode's workers is bad input, said with the fix."""
    from graphmode.runners.environments import AUTO
    from graphmode.runners.interpreter import InterpreterError, check, own_interpreter

    if args.python is not None:
        named, said_by = args.python, "--python"
    elif file is not None and file.python() is not None:
        named, said_by = file.python(), f"{file.path}: [target] python"
    else:
        return own_interpreter()
    if named == AUTO:
        from graphmode.agent.targets.auto_python import auto_python

        named = auto_python(args.path, args.hf, said_by, lambda line: console.print(line, soft_wrap=True))
        if named is None:
            return own_interpreter()
    try:
        return check(named, said_by)
    except InterpreterError as error:
        raise UserError(str(error)) from None


def _say_what_is_replaced(run_dir: Path) -> None:
    """A finished session's report in the folder is replaced by this run's: say so, before any work."""
    import json

    report = run_dir / "report.json"
    if report.is_file():
        try:
            earlier = json.loads(report.read_text(encoding="utf-8")).get("session_id", "an earlier session")
        except (OSError, ValueError):
            earlier = "an earlier session"
        console.print(f"[yellow]note:[/] {run_dir} holds the report of session {earlier}; this run replaces it "
                      "(give --out another folder to keep both)", soft_wrap=True)


def _check_out_folder(out: Path) -> None:
    """--out names a folder, or a path where one can be made: no file on the way."""
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                raise UserError(f"--out {out}: {folder} is a file, not a folder")
            break


def _check_writable(out: Path, run_dir: Path) -> None:
    """The output folder can be made and written, checked before any analysis runs."""
    import tempfile

    _check_out_folder(out)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as error:
        raise UserError(f"--out {out}: cannot write to {error.filename or run_dir}: {error.strerror}") from None


def _batch_buckets(text: str | None) -> list[int]:
    """--batch-buckets as sorted sizes; [] when not given."""
    from graphmode.runners.run_settings import parse_buckets

    if text is None:
        return []
    try:
        return parse_buckets(text)
    except ValueError as error:
        raise UserError(f"--batch-buckets {text!r}: {error}") from None
