"""The `graphmode batch` command's options and entry, kept here so agent.cli.main only names them."""
from __future__ import annotations

import argparse
from pathlib import Path

from graphmode.agent.errors import UserError


def add_batch_parser(commands) -> None:
    """`graphmode batch MANIFEST [options]` on the command line's subcommands."""
    batch = commands.add_parser(
        "batch", help="adapt every target of a manifest, each in its own process; resumable",
        description="Runs `graphmode adapt --yes` on every target of a manifest (a TOML file: [defaults] with the "
                    "[run] options all targets share, and one [[target]] table per target, with the keys of a "
                    "graphmode.toml [target] table plus name, path and run = {...}). Each target runs in its own "
                    "process with a time limit; a crash or a hang in one never stops the others. Running the same "
                    "command again skips the targets already done (their spec and options unchanged). Writes "
                    "OUT/<target>/ for each target (design.md, planned.diff, report.md, report.json) and "
                    "OUT/summary.md, summary.json and speedups.png.",
        epilog="Exit status: 0 every target verified (and no --fail-on condition met), 1 a target not verified, "
               "failed or timed out, or a --fail-on condition met, 2 bad manifest or options, 130 interrupted "
               "(finished targets are kept; the same command carries on).")
    batch.add_argument("manifest", type=Path, help="the manifest (TOML); its paths are relative to its folder")
    batch.add_argument("--out", type=Path, default=None,
                       help="the batch's output folder (default: [defaults] out, else graphmode-out/<manifest name>); "
                            "it also names the batch: the same manifest into the same folder resumes")
    batch.add_argument("--jobs", type=int, default=None,
                       help="targets run side by side (default 1; with --executor ray, as many as the cluster "
                            "takes); on an accelerator host one per device, each job seeing only its own "
                            "(CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES)")
    batch.add_argument("--retry-failed", action="store_true",
                       help="run the targets that finished without being verified again (default: skip them too)")
    batch.add_argument("--fail-on", action="append", default=[], metavar="manual|speedup<X",
                       help="also exit 1 when any target has an item left for a person (manual) or a Decode "
                            "speed-up below X (speedup<1.2); comma-separated or repeated")
    batch.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="the most one target's whole run may take (default: target_timeout in the manifest, "
                            "else 3600); a target that takes longer is stopped and reported as timeout")
    batch.add_argument("--executor", choices=("local", "ray"), default="local",
                       help="local: processes on this machine; ray: one Ray task per target, each asking for one "
                            "device (a GPU, an NPU, else a CPU), on the cluster RAY_ADDRESS names or a local one "
                            "(pip install -e \".[ray]\")")
    for option, kind in (("--backend", str), ("--runs", int), ("--steps", int)):
        batch.add_argument(option, type=kind, default=None,
                           help=f"every target's {option[2:]}, over the manifest's (as `graphmode adapt {option}`)")


def run_batch(args: argparse.Namespace, console) -> int:
    from graphmode.agent.batch.manifest import load_manifest
    from graphmode.agent.batch.run import BatchOptions, run
    from graphmode.agent.batch.summary import parse_fail_on

    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout:g}: a number of seconds above 0")
    conditions = parse_fail_on(args.fail_on)
    if args.backend is not None:
        from graphmode.runners.backends import BACKEND_NAMES  # the registry only: no torch

        if args.backend not in BACKEND_NAMES:
            raise UserError(f"--backend {args.backend!r}: valid names: {', '.join(BACKEND_NAMES)}")
    manifest = load_manifest(args.manifest, out=args.out, target_timeout=args.timeout,
                             overrides={"backend": args.backend, "runs": args.runs, "steps": args.steps})
    return run(manifest, BatchOptions(jobs=args.jobs, retry_failed=args.retry_failed, executor=args.executor,
                                      fail_on=conditions), console)
