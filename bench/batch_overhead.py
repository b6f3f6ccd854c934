"""The bookkeeping cost of `graphmode batch`, beside the model runs it schedules.

    python bench/batch_overhead.py [--targets 20] [--jobs 1] [--no-real]

Builds a manifest of N small targets (copies of examples/legacy_llm) and runs the batch on it with each target's
`graphmode adapt` replaced by a stub process that writes an adapt-like report.json and exits: what is left of the
batch's wall time once the stubs' own time is taken away is its bookkeeping (the manifest, the store's writes,
the summary rewritten after every target, the chart, starting and watching the processes). Then it times the
command line on the finished manifest (a resume that runs nothing), and, unless --no-real, one real adapt of the
example (eager backend, one run per side) for the scale of a model run. Prints one line per figure.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "legacy_llm"

# A stand-in for `graphmode adapt TARGET_FILE --out FOLDER`: an adapt-like run folder with a report.json.
STUB = """
import json, sys
from pathlib import Path
folder = Path(sys.argv[sys.argv.index("--out") + 1]) / "run"
folder.mkdir(parents=True, exist_ok=True)
for name in ("design.md", "planned.diff", "report.md"):
    (folder / name).write_text(name)
(folder / "report.json").write_text(json.dumps({
    "passed": True, "graph_breaks": 0, "recompiles": 0, "tokens_equal": True, "decode_speedup": 1.5,
    "warmup_s": 1.0, "manual_items": 1, "findings": 9, "findings_fixed": 8, "changes_applied": ["a", "b"],
    "backend": "eager", "problems": []}))
print("graphmode: adapting (session 0123abcd)")
"""


def _manifest(root: Path, targets: int) -> Path:
    for n in range(targets):
        shutil.copytree(EXAMPLE, root / f"model{n:03d}", ignore=shutil.ignore_patterns("__pycache__"))
    text = "[defaults]\nbackend = \"eager\"\nruns = 1\n" + "".join(
        f"\n[[target]]\npath = \"model{n:03d}\"\n" for n in range(targets))
    path = root / "manifest.toml"
    path.write_text(text)
    return path


def _stubbed_batch(manifest: Path, out: Path, jobs: int) -> tuple[float, float, int]:
    """(batch wall seconds, the stubs' seconds summed, targets recorded)."""
    from rich.console import Console

    from graphmode.agent.batch import run as batch_run
    from graphmode.agent.batch import job as batch_job
    from graphmode.agent.batch.manifest import load_manifest

    real_job, real_run = batch_run._job, batch_job.run_job
    stub_seconds: list[float] = []

    def stub_job(manifest, target):
        job = real_job(manifest, target)
        return replace(job, args=["-c", STUB, *job.args[job.args.index("--out"):]])

    def timed_run(job, stop=None):
        outcome = real_run(job, stop)
        stub_seconds.append(outcome.seconds)
        return outcome

    batch_run._job, batch_run.run_job = stub_job, timed_run
    try:
        started = time.perf_counter()
        status = batch_run.run(load_manifest(manifest, out=out), batch_run.BatchOptions(jobs=jobs),
                               Console(file=open(os.devnull, "w")))
        wall = time.perf_counter() - started
    finally:
        batch_run._job, batch_run.run_job = real_job, real_run
    assert status == 0, status
    return wall, sum(stub_seconds), len(stub_seconds)


def _command(*args: str, cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "COLUMNS": "200"})
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--no-real", action="store_true", help="skip timing one real adapt of the example")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="graphmode-batch-bench-") as tmp:
        root = Path(tmp)
        os.environ["GRAPHMODE_HOME"] = str(root / "home")  # a store of its own
        manifest = _manifest(root, args.targets)
        out = root / "out"
        wall, stubs, ran = _stubbed_batch(manifest, out, args.jobs)
        busy = stubs / args.jobs  # the stubs' share of the wall time, run `jobs` at a time
        overhead = wall - busy
        print(f"{ran} targets, {args.jobs} job(s): batch {wall:.2f} s, of which the stub processes {busy:.2f} s; "
              f"bookkeeping {overhead:.2f} s = {overhead / ran * 1000:.0f} ms per target")
        resume = _command("batch", str(manifest), "--out", str(out), cwd=root)
        print(f"a second run of the finished manifest (the command line, nothing to run): {resume:.2f} s")
        if not args.no_real:
            real = _command("adapt", str(EXAMPLE), "--yes", "--backend", "eager", "--runs", "1", "--out",
                            str(root / "real"), cwd=root)
            print(f"one real adapt of {EXAMPLE.name} (eager, 1 run per side): {real:.1f} s; the bookkeeping per "
                  f"target is {overhead / ran / real * 100:.2f}% of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
