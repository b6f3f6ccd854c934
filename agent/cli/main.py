"""`graphmode`: the command line.

    graphmode adapt PATH [--yes] [--backend NAME] [--out DIR] [--runs N] [--batch-buckets 1,2,4,8]
                                                                design, confirm, implement, verify, report
    graphmode resume ID [--approve C1,C3 | --reject-all | --revise C4.max_seq_len=4096]
                                                                finish a session stopped at confirmation
    graphmode sessions                                          list sessions
    graphmode verify ORIGINAL ADAPTED [--backend NAME] [--runs N]  verify and report alone, on adapted sources
    graphmode mcp [--root DIR]... [--out DIR]                   the tools above as an MCP server over stdio
    graphmode scan PATH... [--format text|json|sarif] [--check-fixes]  static findings only; no model runs
    graphmode fix PATH... [--diff] [--jobs N] [--out DIR]       the rewrites alone: adapted copies and diffs
    graphmode init PATH [--convention NAME] [--force]           write PATH/harness.py from the model's own code
    graphmode adapt --hf MODEL_TYPE|CONFIG|FOLDER [--tiny] [--rewrite] ...  a Hugging Face model, no harness to write
    graphmode batch MANIFEST [--jobs N] [--retry-failed] [--fail-on manual,speedup<X] [--executor ray]
                                                                every target of a manifest, resumable; summary
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from pathlib import Path

from graphmode.agent.cli.consoles import EXIT_INTERRUPTED, console, errors
from graphmode.agent.errors import UserError
from graphmode.runners.backends import help_text as backend_help
from graphmode.runners.run_settings import help_with_default

# Each command lives in a module of its own, imported when it runs: `graphmode scan` and a refused usage must start
# without the workflow (langgraph, libcst, pydantic) or torch.


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
                            "Models transformers implements are not rewritten (unless --rewrite): their own "
                            "static-cache path is driven and verified. graphmode writes the harness into the run "
                            "folder; nothing is downloaded and "
                            "nothing is written into FOLDER")
    adapt.add_argument("--tiny", action="store_true",
                       help="with --hf: a tiny model (2 layers, hidden size 64, vocabulary 256) with random weights "
                            "from a fixed seed, built from the config; the folder's weights are not read")
    adapt.add_argument("--rewrite", action="store_true", default=False,
                       help="with --hf MODEL_TYPE (or a folder of a type transformers implements): instead of driving "
                            "transformers' own static-cache path, copy the installed release's modeling file "
                            "(models/TYPE/modeling_TYPE.py) into the run folder, its relative imports made absolute "
                            "and every line where it was, and rewrite and verify that copy as graphmode does any "
                            "model's code; the installed file is not touched. For a type whose static path breaks "
                            "the graph or recompiles (a mask or positions built from the cache's length, experts "
                            "dispatched with nonzero/tolist). Chosen by itself where the release has no static path "
                            "for the type")
    adapt.add_argument("--python", metavar="PATH", default=None,
                       help="the Python interpreter the target's model runs under, e.g. a venv with the transformers "
                            "release its code needs (python -m venv DIR && DIR/bin/pip install torch==... "
                            "transformers==X); every worker runs there, graphmode itself stays here. It needs torch, "
                            "not graphmode (default: graphmode.toml's [target] python, else graphmode's own). "
                            "`auto`: graphmode reads the transformers names the code uses and, where its own "
                            "release cannot run them, makes a venv with one that can (kept under GRAPHMODE_HOME/envs "
                            "and reused)")
    adapt.add_argument("--yes", action="store_true", default=None, help=help_with_default("yes"))
    adapt.add_argument("--backend", default=None, help=backend_help())
    adapt.add_argument("--out", type=Path, default=None, help=help_with_default("out"))
    adapt.add_argument("--steps", type=int, default=None, help=help_with_default("steps"))
    adapt.add_argument("--runs", type=int, default=None, help=help_with_default("runs"))
    adapt.add_argument("--similarity", type=float, default=None, help=help_with_default("similarity"))
    adapt.add_argument("--compile-cache", default=None, metavar="DIR|off", help=help_with_default("compile_cache"))
    adapt.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help=help_with_default("timeout"))
    adapt.add_argument("--batch-buckets", metavar="1,2,4,8", help=help_with_default("batch_buckets"))
    adapt.add_argument("--rounds", type=int, default=None, metavar="N", help=help_with_default("rounds"))

    resume = commands.add_parser("resume", help="continue a session that stopped at confirmation",
                                 description="Continues a session. Without --approve or --reject-all it asks at a "
                                             "terminal, and otherwise approves every change in the design.")
    resume.add_argument("session", help="the session id printed by `graphmode adapt`")
    choice = resume.add_mutually_exclusive_group()
    choice.add_argument("--approve", help="comma-separated change ids to apply, e.g. C1,C3")
    choice.add_argument("--reject-all", action="store_true", help="apply nothing (verification then shows why)")
    choice.add_argument("--revise", action="append", metavar="C4.max_seq_len=4096",
                        help="change a parameter a planned change is built with (the design lists each change's: "
                             "max_seq_len, max_batch_size, entry_class, fused_ops) and make the design again, to be "
                             "confirmed as the first was (asked at a terminal, else the session stops again). Repeat "
                             "it for several")

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
    fix.add_argument("--diff", action="store_true",
                     help="print the diffs instead of writing anything, each file's once it and the files before it "
                          "(by path) are done")
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
    from graphmode.agent.cli.batch import add_batch_parser  # its options live beside the batch modules

    add_batch_parser(commands)
    from graphmode.agent.cli.verify import add_verify_parser

    add_verify_parser(commands)
    from graphmode.agent.cli.mcp import add_mcp_parser

    add_mcp_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # `kill` (SIGTERM) unwinds like Ctrl-C, so the workers' clean-up runs (runners.subprocess_run).
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if args.command == "adapt":
            from graphmode.agent.cli.adapt import run_adapt

            return run_adapt(args)
        if args.command == "resume":
            from graphmode.agent.cli.sessions import run_resume

            return run_resume(args)
        if args.command == "scan":
            from graphmode.agent.cli.scan import run_scan

            return run_scan(args)
        if args.command == "init":
            from graphmode.agent.cli.init import run_init

            return run_init(args)
        if args.command == "batch":
            from graphmode.agent.cli.batch import run_batch

            return run_batch(args, console)
        if args.command == "verify":
            from graphmode.agent.cli.verify import run_verify

            return run_verify(args)
        if args.command == "mcp":
            from graphmode.agent.cli.mcp import run_mcp

            return run_mcp(args)
        if args.command == "fix":
            from graphmode.agent.cli.fix import run_fix

            if args.jobs is not None and args.jobs < 1:
                raise UserError(f"--jobs {args.jobs}: at least 1")
            return run_fix(args.paths, args.out, args.diff, args.jobs, args.entry_class, console, errors)
        from graphmode.agent.cli.sessions import run_sessions

        return run_sessions()
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


if __name__ == "__main__":
    sys.exit(main())
