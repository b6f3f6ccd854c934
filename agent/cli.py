"""`graphmode`: the command line.

    graphmode adapt PATH [--yes] [--backend NAME] [--out DIR] [--runs N] [--batch-buckets 1,2,4,8]
                                                                design, confirm, implement, verify, report
    graphmode resume ID [--approve C1,C3 | --reject-all]        finish a session stopped at confirmation
    graphmode sessions                                          list sessions
    graphmode scan PATH... [--format text|json|sarif] [--check-fixes]  static findings only; no model runs
    graphmode fix PATH... [--diff] [--jobs N] [--out DIR]       the rewrites alone: adapted copies and diffs
    graphmode init PATH [--convention NAME] [--force]           write PATH/harness.py from the model's own code
    graphmode adapt --hf MODEL_TYPE|CONFIG|FOLDER [--tiny] ...  a Hugging Face model, no harness to write
    graphmode batch MANIFEST [--jobs N] [--retry-failed] [--fail-on manual,speedup<X] [--executor ray]
                                                                every target of a manifest, resumable; summary
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from graphmode.agent.errors import UserError
from graphmode.runners.backends import BACKEND_NAMES, help_text as backend_help
from graphmode.runners.run_settings import SETTINGS, help_with_default

if TYPE_CHECKING:
    from graphmode.agent.state import RunState
    from graphmode.agent.target_file import TargetFile
# The workflow (langgraph, libcst, pydantic) is imported by the commands that run it, not at start-up:
# `graphmode scan` needs none of it and must stay fast.

# Exit status (README, `graphmode --help`): 0 verified, 1 not verified, 2 bad input, 3 internal error,
# 4 stopped for confirmation (the session is saved; `graphmode resume ID` continues it), 130 interrupted.
EXIT_STOPPED = 4
EXIT_INTERRUPTED = 130

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphmode",
        description="Adapt PyTorch LLM inference code so its Decode step runs in graph mode, and prove it with a "
                    "measured report. A target is a folder holding the model sources and a harness.py "
                    "(see examples/legacy_llm/harness.py for the contract; `graphmode init` writes one), a "
                    "graphmode.toml target file, or a Hugging Face model (`adapt --hf`).",
        epilog="Exit status: 0 verified (scan: no findings), 1 not verified (scan: findings), 2 bad input, "
               "3 internal error, 4 stopped for confirmation (the session is saved), 130 interrupted.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    adapt = commands.add_parser("adapt", help="scan, design, confirm, rewrite, verify and report on one target",
                                description="Runs the whole workflow on one target. It imports and runs the "
                                            "target's harness.py, and so the model code, already during analysis, "
                                            "before anything is confirmed. Without --yes it stops at the "
                                            "confirmation step (or asks, at a terminal) and prints a session id.")
    adapt.add_argument("path", type=Path, nargs="?",
                       help="the target folder (or its harness.py), or a graphmode.toml target file (a folder with "
                            "one reads it too); not with --hf. The file's [target] says what to build and rewrite, "
                            "its [run] gives defaults for the options below, which the command line overrides")
    adapt.add_argument("--hf", metavar="MODEL_TYPE|CONFIG|FOLDER",
                       help="a Hugging Face model instead of a harness folder: a model type the installed transformers "
                            "knows (llama, qwen2, gpt2, ...), a config.json, or a local model folder (weights are read "
                            "from it; remote code named by config.json's auto_map is loaded from it and rewritten). "
                            "Models transformers implements are not rewritten: their own static-cache path is driven "
                            "and verified. graphmode writes the harness into the run folder; nothing is downloaded and "
                            "nothing is written into FOLDER")
    adapt.add_argument("--tiny", action="store_true",
                       help="with --hf: a tiny model (2 layers, hidden size 64, vocabulary 256) with random weights "
                            "from a fixed seed, built from the config; the folder's weights are not read")
    adapt.add_argument("--python", metavar="PATH", default=None,
                       help="the Python interpreter the target's model runs under, e.g. a venv with the transformers "
                            "release its code needs (python -m venv DIR && DIR/bin/pip install torch==... "
                            "transformers==X); every worker runs there, graphmode itself stays here. It needs torch, "
                            "not graphmode (default: graphmode.toml's [target] python, else graphmode's own)")
    adapt.add_argument("--yes", action="store_true", default=None, help=help_with_default("yes"))
    adapt.add_argument("--backend", default=None, help=backend_help())
    adapt.add_argument("--out", type=Path, default=None, help=help_with_default("out"))
    adapt.add_argument("--steps", type=int, default=None, help=help_with_default("steps"))
    adapt.add_argument("--runs", type=int, default=None, help=help_with_default("runs"))
    adapt.add_argument("--similarity", type=float, default=None, help=help_with_default("similarity"))
    adapt.add_argument("--compile-cache", default=None, metavar="DIR|off", help=help_with_default("compile_cache"))
    adapt.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help=help_with_default("timeout"))
    adapt.add_argument("--batch-buckets", metavar="1,2,4,8", help=help_with_default("batch_buckets"))

    resume = commands.add_parser("resume", help="continue a session that stopped at confirmation",
                                 description="Continues a session. Without --approve or --reject-all it asks at a "
                                             "terminal, and otherwise approves every change in the design.")
    resume.add_argument("session", help="the session id printed by `graphmode adapt`")
    choice = resume.add_mutually_exclusive_group()
    choice.add_argument("--approve", help="comma-separated change ids to apply, e.g. C1,C3")
    choice.add_argument("--reject-all", action="store_true", help="apply nothing (verification then shows why)")

    commands.add_parser("sessions", help="list sessions and where they stand")

    scan = commands.add_parser(
        "scan", help="report graph-mode hazards in source files without running anything",
        description="Runs the static rules over files and folders (recursively). Needs no harness and imports no "
                    "torch. Exit status: 1 when findings remain, 2 when files could not be scanned, else 0.")
    scan.add_argument("paths", type=Path, nargs="+", metavar="PATH", help="Python files or folders")
    scan.add_argument("--format", choices=("text", "json", "sarif"), default="text",
                      help="text for people, json (a list of findings) or sarif for tools")
    scan.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    scan.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per core)")
    scan.add_argument("--check-fixes", action="store_true",
                      help="also run the codemods over each file with findings (slower; imports libcst) and "
                           "mark autofix exactly on the findings they fix; without it a finding only names the "
                           "codemods that may fix it")
    scan.add_argument("--entry-class", metavar="NAME", default=None,
                      help="with --check-fixes: the model class a harness would build, the one `adapt` gives "
                           "prefill/decode entries (default: none, so split_decode fixes nothing)")
    fix = commands.add_parser(
        "fix", help="rewrite files with the codemods alone, no harness and nothing run; copies and diffs",
        description="Runs every codemod over each file, as `graphmode adapt` plans them without a traced run, and "
                    "writes adapted copies of the files they change, changes.diff and fix.json into --out (the "
                    "originals are never touched), or with --diff prints the diffs and writes nothing. Items a "
                    "person must finish are printed as file:line: CODEMOD reason. Exit status: 0 nothing left, 1 "
                    "items for a person, 2 files that could not be read or parsed, 3 a codemod failed on a file "
                    "(a graphmode bug; the other files are still done).")
    fix.add_argument("paths", type=Path, nargs="+", metavar="PATH", help="Python files or folders (recursively)")
    fix.add_argument("--diff", action="store_true", help="print the diffs instead of writing anything")
    fix.add_argument("--out", type=Path, default=Path("graphmode-fix"),
                     help="where the copies go, replaced whole once complete (default: ./graphmode-fix)")
    fix.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per core)")
    fix.add_argument("--entry-class", metavar="NAME", default=None,
                     help="the model class that gets prefill/decode entries (default: each file's shortest-named "
                          "*ForCausalLM or *LMHeadModel class, if it has one)")
    from graphmode.transforms.conventions import CONVENTIONS  # stdlib `ast` only: no torch, no libcst

    init = commands.add_parser(
        "init", help="write PATH/harness.py for a model folder, in the model's own calling convention",
        description="Reads the model sources in PATH (statically: nothing is imported or run), finds the model "
                    "class and its calling convention, and writes PATH/harness.py: SOURCES, MAX_SEQ_LEN, "
                    "build_model(), make_prompt(), prefill() and decode(). Conventions: hf (forward takes "
                    "past_key_values and/or cache_position), start_pos (Meta style: forward(tokens, start_pos), "
                    "caches made in __init__), input_pos (gpt-fast style: forward(idx, input_pos) after "
                    "setup_caches(...)), full-sequence (no cache: the whole sequence is run again every step). "
                    "The file's header says which was chosen and why; every line to check or fill is marked "
                    "TODO(graphmode). Exit status: 0 written, 2 refused (nothing written).")
    init.add_argument("path", type=Path, help="the folder with the model's .py files")
    init.add_argument("--convention", choices=CONVENTIONS, default=None,
                      help="the calling convention to write, instead of the detected one (needed when detection "
                           "says unknown)")
    init.add_argument("--force", action="store_true",
                      help="replace an existing harness.py (the old one is kept as harness.py.orig)")
    from graphmode.agent.batch_cli import add_batch_parser  # its options live beside the batch modules

    add_batch_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # `kill` (SIGTERM) unwinds like Ctrl-C, so the workers' clean-up runs (runners.subprocess_run).
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if args.command == "adapt":
            return _adapt(args)
        if args.command == "resume":
            return _resume(args)
        if args.command == "scan":
            return _scan(args)
        if args.command == "init":
            return _init(args)
        if args.command == "batch":
            from graphmode.agent.batch_cli import run_batch

            return run_batch(args, console)
        if args.command == "fix":
            return _fix(args)
        return _sessions()
    except UserError as error:
        from rich.markup import escape  # a message's own brackets ("[target] python") are text, not markup

        errors.print(f"[red]graphmode: error:[/] {escape(str(error))}", soft_wrap=True)
        return 2
    except BrokenPipeError:  # `graphmode scan ... | head`: the reader has seen enough
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:
        errors.print("[yellow]graphmode: interrupted[/]")
        return EXIT_INTERRUPTED
    except Exception as error:  # anything else is our bug: one line, the traceback on request
        if os.environ.get("GRAPHMODE_DEBUG"):
            traceback.print_exc()
        errors.print(f"[red]graphmode: internal error:[/] {type(error).__name__}: {error} "
                      "(set GRAPHMODE_DEBUG=1 for the traceback)", soft_wrap=True)
        return 3


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt




def _merge_target_file(args: argparse.Namespace) -> "TargetFile | None":
    """A graphmode.toml named by PATH (or in the PATH folder) fills what the command line left unsaid."""
    from graphmode.agent import target_file

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
        args.path = None
    else:
        harness = file.relative(target.get("harness", "harness.py"))
        if harness.name != "harness.py":
            raise UserError(f"{file.path}: [target] harness must name a file called harness.py, got {harness.name}")
        args.path = harness.parent
    return file


def _adapt(args: argparse.Namespace) -> int:
    from graphmode.runners.backends import BackendUnavailable, resolve

    file = _merge_target_file(args)
    _refuse_bad_usage(args)
    interpreter = _target_interpreter(args, file)
    hf_target = None
    if args.hf is not None:
        from graphmode.agent.hf_target import resolve as resolve_hf

        _check_hf_release(args.hf, interpreter)
        hf_target = resolve_hf(args.hf, args.tiny, _hf_max_seq_len(args.steps))
        hf_target.transformers_version = interpreter.transformers or hf_target.transformers_version
        target = (args.out / hf_target.name / "target").resolve()
    else:
        target = _target_folder(args.path)
        convention = file.target.get("convention") if file else None
        if not (target / "harness.py").is_file() and convention is None:
            raise UserError(f"{args.path}: no harness.py there (a target is a folder with the model sources and a "
                            "harness.py, which `graphmode init` writes; or give a Hugging Face model with --hf, or a "
                            "calling convention in graphmode.toml)")
    from graphmode.agent.state import RunOptions, RunState

    declared = _declared_max_seq_len(target / "harness.py") if hf_target is None else None
    if declared is not None and args.steps >= declared:
        raise UserError(f"--steps {args.steps}: the harness's MAX_SEQ_LEN is {declared}, which must hold the prompt "
                        "and every Decode step")
    buckets = _batch_buckets(args.batch_buckets)
    try:
        backend, why = resolve(args.backend)
    except BackendUnavailable as error:
        raise UserError(str(error)) from None
    run_dir = (args.out / (hf_target.name if hf_target else target.name)).resolve()
    written_harness = None
    if hf_target is None and not (target / "harness.py").is_file():  # a convention named by the target file
        from graphmode.agent.convention_target import convention_harness

        written_harness, found = convention_harness(target, file.target["convention"], file.path)
        console.print(f"no harness.py in {target}: graphmode writes one for convention {found.convention} "
                      f"({'named' if found.named else 'detected'}) into the run folder", soft_wrap=True)
    sources = file.sources_in(target) if file is not None else None
    _check_writable(args.out, run_dir)

    options = RunOptions(target=str(target), run_dir=str(run_dir), backend=backend.name, steps=args.steps,
                         runs=args.runs, similarity=args.similarity, compile_cache=args.compile_cache,
                         batch_buckets=buckets, auto_approve=args.yes, timeout_s=args.timeout,
                         hf=_hf_summary(hf_target), sources=sources, interpreter=interpreter.to_dict(),
                         python=interpreter.path if interpreter.path != sys.executable else None)
    state = RunState(session_id=uuid.uuid4().hex[:8], options=options)
    console.print(f"graphmode: adapting [bold]{target}[/] (session {state.session_id})")
    if options.python:
        console.print(f"the model runs under {interpreter.path} (Python {interpreter.python}, "
                      f"torch {interpreter.torch}, transformers {interpreter.transformers or 'not installed'})",
                      soft_wrap=True)
    console.print(f"backend {backend.name}: {why}")
    from graphmode.agent.output import run_folder_lock
    from graphmode.agent.workflow import build_graph, open_checkpointer

    with open_checkpointer() as checkpointer, run_folder_lock(run_dir, state.session_id):
        _say_what_is_replaced(run_dir)
        if hf_target is not None:
            _write_hf_target(hf_target, args.hf, target, _hf_max_seq_len(args.steps))
        if written_harness is not None:
            from graphmode.agent.convention_target import write_convention_target

            target = write_convention_target(target, run_dir / "target", written_harness)
            state.options.target = str(target)
        graph = build_graph(checkpointer)
        return _drive(graph, state, state.session_id, interactive=not args.yes and sys.stdin.isatty())


def _refuse_bad_usage(args: argparse.Namespace) -> None:
    """The checks that need nothing but the arguments and the file system, made before anything heavy is imported
    or started (an interpreter probe, torch, the workflow): a usage error is refused in a blink."""
    if args.hf is not None and args.path is not None:
        raise UserError(f"give a target folder ({args.path}) or --hf {args.hf}, not both")
    if args.hf is not None:
        from graphmode.agent.hf_target import refuse_missing_path

        refuse_missing_path(args.hf)
    else:
        if args.path is None:
            raise UserError("no target: give a folder with a harness.py, or --hf MODEL_TYPE|CONFIG|FOLDER")
        if args.tiny:
            raise UserError("--tiny goes with --hf (a Hugging Face model built from its config)")
        target = _target_folder(args.path)
        if (args.out.resolve() / target.name) == target or target in args.out.resolve().parents:
            raise UserError(f"--out {args.out}: the output must be outside the target folder")
    for key in ("steps", "runs", "similarity", "timeout"):
        problem = SETTINGS[key].problem(getattr(args, key))
        if problem:
            raise UserError(f"{SETTINGS[key].flag} {getattr(args, key):g}: {problem}")
    if args.backend not in BACKEND_NAMES:
        raise UserError(f"--backend {args.backend}: unknown; valid names: {', '.join(BACKEND_NAMES)}")
    _check_out_folder(args.out)


def _target_folder(path: Path) -> Path:
    """The target folder PATH names (the folder itself, or its harness.py), which must exist."""
    target = path.resolve()
    if target.name == "harness.py":
        target = target.parent
    if not target.exists():
        raise UserError(f"{path}: no such file or folder")
    return target


def _target_interpreter(args: argparse.Namespace, file: "TargetFile | None"):
    """The interpreter the model runs under (--python, else the target file's python, else graphmode's own), checked
    before anything runs: one that cannot run graphmode's workers is bad input, said with the fix."""
    from graphmode.runners.interpreter import InterpreterError, check, own_interpreter

    if args.python is not None:
        named, said_by = args.python, "--python"
    elif file is not None and file.python() is not None:
        named, said_by = file.python(), f"{file.path}: [target] python"
    else:
        return own_interpreter()
    try:
        return check(named, said_by)
    except InterpreterError as error:
        raise UserError(str(error)) from None


def _check_hf_release(spec: str, interpreter) -> None:
    """--hf runs the model on the interpreter's transformers: it must have one, recent enough for the path driven."""
    from graphmode.runners.releases import hf_release_problem

    problem = hf_release_problem(spec, interpreter.path, interpreter.transformers)
    if problem:
        raise UserError(f"--hf {spec}: {problem}")


def _hf_summary(hf_target) -> dict | None:
    from graphmode.agent.hf_target import summary

    return summary(hf_target) if hf_target is not None else None


def _hf_max_seq_len(steps: int) -> int:
    """The static cache of an --hf run: the 8-token prompt and every Decode step, at least 64."""
    return max(64, 8 + steps + 8)


def _write_hf_target(hf_target, spec: str, target: Path, max_seq_len: int) -> None:
    from graphmode.agent.hf_target import write_target

    path = Path(spec).expanduser()
    write_target(hf_target, path if path.exists() else None, target, max_seq_len)
    if hf_target.package:
        what = (f"its own code ({', '.join(hf_target.sources)}) is what gets rewritten, in a copy under "
                f"{target} (the same lines as in {path})")
    else:
        what = "transformers' code is not rewritten: graphmode drives its static-cache path"
    weights = "tiny random weights" if hf_target.tiny else f"weights from {hf_target.weights_folder}"
    console.print(f"{hf_target.model_type} with transformers {hf_target.transformers_version}, {weights}; {what}. "
                  f"Harness: {target / 'harness.py'}", soft_wrap=True)
    for note in hf_target.notes:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)


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


def _declared_max_seq_len(harness: Path) -> int | None:
    """`MAX_SEQ_LEN = N` at the top of the harness, read without running it; None when not written so."""
    import ast

    try:
        tree = ast.parse(harness.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # analysis reports the harness's own problem with its file and line
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MAX_SEQ_LEN" for t in node.targets) \
                and isinstance(node.value, ast.Constant) and type(node.value.value) is int:
            return node.value.value
    return None


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
    from graphmode.runners.batch_buckets import parse_buckets

    if text is None:
        return []
    try:
        return parse_buckets(text)
    except ValueError as error:
        raise UserError(f"--batch-buckets {text!r}: {error}") from None


def _resume(args: argparse.Namespace) -> int:
    from graphmode.agent.home import session_saved, sessions_db as saved_in

    if session_saved(args.session) is False:
        raise UserError(f"no session {args.session} (sessions are kept in {saved_in()})")
    from langgraph.types import Command

    from graphmode.agent.output import run_folder_lock
    from graphmode.agent.workflow import build_graph, open_checkpointer, saved_state, sessions_db

    with open_checkpointer() as checkpointer:
        graph = build_graph(checkpointer)
        config = _config(args.session)
        snapshot = graph.get_state(config)
        if not snapshot.values:
            raise UserError(f"no session {args.session} (sessions are kept in {sessions_db()})")
        state = saved_state(args.session, snapshot.values)
        if not snapshot.next:
            console.print(f"session {args.session} has finished; its report: {state.report_path}")
            return 0
        if "confirm" not in snapshot.next:  # interrupted (Ctrl-C) in another step: carry on from there
            if args.approve is not None or args.reject_all:
                raise UserError(f"session {args.session} stopped before confirmation (at {', '.join(snapshot.next)}); "
                                "resume it without --approve/--reject-all, then choose")
            with run_folder_lock(Path(state.options.run_dir), args.session):
                return _drive(graph, None, args.session, interactive=sys.stdin.isatty())
        if args.approve is not None:
            from graphmode.agent.choices import choice_problem

            answer = [c.strip().upper() for c in args.approve.split(",") if c.strip()]
            # Checked here, before the session sees it: a wrong answer leaves the session as it was.
            problem = choice_problem(state.plan, answer)
            if problem:
                raise UserError(f"--approve {args.approve}: {problem} (session {args.session} is unchanged; the "
                                f"design: {state.design_path})")
        elif args.reject_all:
            answer = []
        elif sys.stdin.isatty():
            answer = _ask(state)
        else:
            console.print(f"approving all {len(state.plan)} changes of {state.design_path}")
            answer = "all"
        if answer is None:
            return EXIT_STOPPED
        with run_folder_lock(Path(state.options.run_dir), args.session):
            return _drive(graph, Command(resume=answer), args.session, interactive=False)


def _config(session: str) -> dict:
    return {"configurable": {"thread_id": session}}


def _drive(graph, payload, session: str, interactive: bool) -> int:
    """Streams the workflow with one progress line per step; stops (or asks) at confirmation. Ctrl-C says which
    session to resume."""
    config = _config(session)
    try:
        return _stream(graph, payload, session, config, interactive)
    except KeyboardInterrupt:
        errors.print(f"[yellow]graphmode: interrupted.[/] Session [bold]{session}[/] keeps every step that finished; "
                     f"continue it with `graphmode resume {session}`.", soft_wrap=True)
        return EXIT_INTERRUPTED


def _stream(graph, payload, session: str, config: dict, interactive: bool) -> int:
    from langgraph.types import Command

    from graphmode.agent.progress import listening
    from graphmode.agent.workflow import STEPS, saved_state

    while True:
        started = time.perf_counter()
        with console.status("working…") as status, listening(_progress_listener(status)):
            for update in graph.stream(payload, config, stream_mode="updates"):
                for step, change in update.items():
                    if step == "__interrupt__":
                        continue
                    elapsed = time.perf_counter() - started
                    console.print(f"[green]✓[/] {step} ({elapsed:.1f} s): {_describe(step, change or {})}",
                                  soft_wrap=True)
                    started = time.perf_counter()
                    following = STEPS.index(step) + 1
                    if following < len(STEPS):
                        status.update(f"{STEPS[following]}…")
        snapshot = graph.get_state(config)
        state = saved_state(session, snapshot.values)
        if not snapshot.next:
            return _finish(state)
        # Stopped at confirmation.
        answer = _ask(state) if interactive else None
        if answer is None:
            console.print(f"\nDesign document: {state.design_path}")
            console.print(f"Stopped for confirmation. Session: [bold]{session}[/]")
            console.print(f"  apply every change:  graphmode resume {session}")
            if len(state.plan) > 1:
                console.print(f"  choose changes:      graphmode resume {session} --approve {_example_choice(state)}")
            console.print(f"  apply nothing:       graphmode resume {session} --reject-all")
            return EXIT_STOPPED
        payload = Command(resume=answer)


_DIFFS_SHOWN_UP_TO = 80  # lines; longer diffs are paged on request


def _show_diffs(changes) -> None:
    from rich.rule import Rule
    from rich.syntax import Syntax

    for change in changes:
        console.print(Rule(f"{change.id}. {change.title}", align="left"))
        if change.diff:
            console.print(Syntax(change.diff, "diff", theme="ansi_dark", word_wrap=False))
        else:
            console.print("(no lines of its own: it changes what other changes' lines do)")


def _example_choice(state: RunState) -> str:
    """A choice to show in the hint that graphmode accepts: the last change (the entry points, usually) with
    what it needs."""
    from graphmode.agent.choices import unmet_needs

    last = state.plan[-1].id
    return ",".join(unmet_needs(state.plan, [last]) + [last])


def _progress_listener(status):
    """Where a long step's lines go: the spinner's text at a terminal (with the time since its first line, which
    the step says as it begins), else one printed line per finished run."""
    began: list[float] = []

    def listen(line: str) -> None:
        began[:] = began or [time.perf_counter()]
        elapsed = time.perf_counter() - began[0]
        if console.is_terminal:
            status.update(f"verify: {line} ({elapsed:.0f} s in)")
        elif not line.endswith(": running"):
            console.print(f"  verify: {line} ({elapsed:.0f} s in)", soft_wrap=True)
    return listen


def _ask(state: RunState):
    """Asks which changes to apply. Returns 'all', a list of ids, or None to stop here."""
    from graphmode.agent.choices import needs_of, unmet_needs

    table = Table(title=f"Planned changes (details: {state.design_path})")
    for column in ("id", "change", "files", "fixes", "needs"):
        table.add_column(column)
    for change in state.plan:
        table.add_row(change.id, change.title, ", ".join(change.files), str(len(change.fixes)),
                      ", ".join(needs_of(state.plan, change.id)))
    # The diffs before the question: in full when they fit a screen or two, else on request through a pager.
    total = sum(change.diff.count("\n") for change in state.plan)
    if total <= _DIFFS_SHOWN_UP_TO:
        _show_diffs(state.plan)
    console.print(table)
    console.print(f"Diffs: `d` pages through every change's ({total} lines), `d C3` one change's"
                  + (f"; all of them applied together: {state.planned_diff_path}" if state.planned_diff_path else ""))
    while True:
        try:
            reply = console.input("Apply which changes? [bold]all[/], none, ids (C1,C3), d \\[ids] for diffs, "
                                  "or later: ").strip().lower()
        except EOFError:  # Ctrl-D: the same as "later"
            console.print()
            return None
        if reply in ("all", "a", "y", "yes", ""):
            return "all"
        if reply in ("none", "n", "no"):
            return []
        if reply in ("later", "l", "q", "quit"):
            return None
        if reply == "d" or reply == "diff" or reply.startswith(("d ", "diff ")):
            wanted = {part.strip().upper() for part in reply.split(None, 1)[1].split(",")} if " " in reply else None
            shown = [c for c in state.plan if wanted is None or c.id in wanted]
            if not shown:
                console.print(f"[yellow]unknown id in {reply!r}[/]")
                continue
            with console.pager(styles=True):
                _show_diffs(shown)
            continue
        chosen = [part.strip().upper() for part in reply.split(",") if part.strip()]
        if not all(c in {change.id for change in state.plan} for c in chosen):
            console.print(f"[yellow]unknown id in {reply!r}[/]")
            continue
        missing = unmet_needs(state.plan, chosen)
        if not missing:
            return chosen
        # Never drop what the person chose, and never apply what they did not: ask.
        try:
            add = console.input(f"{', '.join(chosen)} need{'s' if len(chosen) == 1 else ''} "
                                f"{', '.join(missing)} too. Add {'it' if len(missing) == 1 else 'them'}? "
                                "[bold]yes[/]/no: ").strip().lower()
        except EOFError:
            console.print()
            return None
        if add in ("", "y", "yes"):
            return [c.id for c in state.plan if c.id in set(chosen) | set(missing)]


def _finish(state: RunState) -> int:
    v = state.verification
    console.print(f"\nReport: [bold]{state.report_path}[/]")
    if v is not None and v.passed:
        console.print("[green]Verified:[/] identical tokens, 0 graph breaks, 0 recompiles in Decode.")
        return 0
    console.print("[red]Not verified:[/] " + "; ".join(v.problems if v is not None else ["no verification"]))
    return 1


def _describe(step: str, change: dict) -> str:
    if step == "analyze":
        base = change["baseline"]
        figures = base.headline or f"{base.graph_breaks} graph breaks, {base.recompiles} recompiles"
        return (f"{len(change.get('findings', []))} findings in {len(change.get('sources', []))} file(s); the "
                f"unmodified Decode under Dynamo: {figures}")
    if step == "design":
        return f"{len(change.get('plan', []))} changes planned, {len(change.get('manual', []))} items for a person " \
               f"-> {change.get('design_path')}"
    if step == "confirm":
        return "approved " + (", ".join(change.get("approved") or []) or "nothing")
    if step == "implement":
        return f"applied {', '.join(change.get('applied', [])) or 'nothing'} -> {change.get('adapted_dir')}"
    if step == "verify":
        v = change["verification"]
        if not v.ran:
            return "not run: " + "; ".join(v.problems)
        return (f"tokens equal: {v.tokens_equal}, graph breaks {v.graph_breaks}, recompiles "
                f"{v.recompiles}, Decode {v.eager.decode_ms_per_token:.3f} -> "
                f"{v.graph.decode_ms_per_token:.3f} ms/token (warm-up {v.graph.warmup_s:.1f} s), "
                f"median of {v.runs} run(s) per side" + _describe_buckets(v.bucket_sweep))
    if step == "report":
        return str(change.get("report_path"))
    return ""


def _describe_buckets(sweep: dict) -> str:
    buckets = sweep.get("buckets", [])
    if not buckets:
        return ""
    unchanged = all(b["tokens_equal"] for b in buckets)
    return (f"; batch buckets {','.join(str(b['bucket']) for b in buckets)}: real rows "
            f"{'unchanged' if unchanged else 'CHANGED'} by padding, "
            f"{sum(b['captures'] for b in buckets)} capture(s)")


def _fix(args: argparse.Namespace) -> int:
    from graphmode.agent.fix_command import run_fix

    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: at least 1")
    return run_fix(args.paths, args.out, args.diff, args.jobs, args.entry_class, console, errors)


def _scan(args: argparse.Namespace) -> int:
    import json
    from importlib.metadata import PackageNotFoundError, version

    from graphmode.transforms.sarif import to_sarif
    from graphmode.transforms.scan import finding_record, fix_note, may_fix, scan_paths

    if args.entry_class and not args.check_fixes:
        raise UserError("--entry-class is used only with --check-fixes")
    try:
        result = scan_paths(args.paths, jobs=args.jobs, check_fixes=args.check_fixes, entry_class=args.entry_class)
    except FileNotFoundError as error:
        raise UserError(str(error)) from None
    for problem in result.errors:
        errors.print(f"{problem.path}: error: {problem.message}", soft_wrap=True, markup=False)
    if args.format == "json":
        print(json.dumps([finding_record(f, result) for f in result.findings], indent=2))
    elif args.format == "sarif":
        try:
            tool_version = version("graphmode")
        except PackageNotFoundError:
            tool_version = "0"
        print(json.dumps(to_sarif(result, tool_version), indent=2))
    else:
        for f in result.findings:
            note = fix_note(f, result)
            console.print(f"{f.location}: {f.code} {f.message}{f' ({note})' if note else ''}", soft_wrap=True,
                          markup=False)
        if result.fixes_checked:
            fixes = f"{len(result.fixed_by)} fixed by a codemod, checked by running them"
        else:
            fixes = (f"{sum(bool(may_fix(f.code)) for f in result.findings)} of a kind a codemod may fix; "
                     "--check-fixes runs them to tell which they do")
        console.print(f"{len(result.findings)} findings ({fixes}) in {result.files} files: {result.parsed} "
                      f"checked by the rules, {result.spared} with no model step or compile call (parsed only), "
                      f"{len(result.errors)} could not be scanned; {result.seconds:.2f} s", soft_wrap=True)
    if result.findings:
        return 1
    return 2 if result.errors else 0


def _init(args: argparse.Namespace) -> int:
    """`graphmode init`: refuses (exit 2, nothing written) without model files, over an existing harness.py unless
    --force, and when the convention is unknown and none was named."""
    import shutil

    from graphmode.agent.output import write_atomic
    from graphmode.transforms.conventions import HARNESS_FILE, model_files

    folder = args.path
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (graphmode init takes the folder with the model's .py files)")
    if not model_files(folder):
        raise UserError(f"{folder}: no .py model file there (graphmode init reads the model's own sources)")
    harness = folder / HARNESS_FILE
    if harness.exists() and not args.force:
        raise UserError(f"{harness} exists; --force replaces it (keeping the old one as {HARNESS_FILE}.orig)")
    from graphmode.agent.convention_target import render_harness
    from graphmode.agent.hf_target import init_harness, is_hub_folder

    if is_hub_folder(folder) and args.convention is None:
        # A Hub folder's files import each other relatively (`from .configuration_x import ...`): its harness
        # imports the folder as a package and drives the model as its generate() does, as `--hf FOLDER --tiny`.
        text, target = init_harness(folder)
        if harness.exists():
            shutil.copyfile(harness, harness.with_name(HARNESS_FILE + ".orig"))
        write_atomic(harness, text)
        console.print(f"wrote {harness}: {' or '.join(target.model_refs)} from config.json's auto_map, the folder "
                      "imported as a package; tiny random weights", soft_wrap=True, markup=False)
        console.print(f"then: python {harness} (one greedy run), and graphmode adapt {folder}", soft_wrap=True,
                      markup=False)
        return 0
    text, found, todo = render_harness(folder, args.convention)
    if harness.exists():
        shutil.copyfile(harness, harness.with_name(HARNESS_FILE + ".orig"))
    write_atomic(harness, text)
    how = "named" if found.named else "detected"
    console.print(f"wrote {harness}: {found.model_class} ({found.file}), convention {found.convention} ({how})",
                  soft_wrap=True, markup=False)
    console.print(f"{todo} line(s) marked TODO(graphmode) to fill or check" if todo else
                  "nothing is left to fill in; check the sizes", soft_wrap=True, markup=False)
    console.print(f"then: python {harness} (one greedy run), and graphmode adapt {folder}", soft_wrap=True,
                  markup=False)
    return 0


def _sessions() -> int:
    from graphmode.agent.workflow import build_graph, open_checkpointer, saved_target, sessions_db

    with open_checkpointer() as checkpointer:
        graph = build_graph(checkpointer)
        table = Table(title=f"Sessions in {sessions_db()}")
        for column in ("session", "target", "stands at", "report"):
            table.add_column(column)
        # Read the ids first: the saver holds its lock while listing, and get_state needs it too.
        sessions = dict.fromkeys(c.config["configurable"]["thread_id"] for c in checkpointer.list(None))
        rows = []
        for session in sessions:
            snapshot = graph.get_state(_config(session))
            values = snapshot.values
            rows.append((session, saved_target(values), ", ".join(snapshot.next) or "finished",
                         values.get("report_path", "")))
        if not console.is_terminal:  # piped or redirected: whole paths, one session per line, tab-separated
            print("\t".join(("session", "target", "stands at", "report")))
            for row in rows:
                print("\t".join(row))
            return 0
        for row in rows:
            table.add_row(*row)
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
