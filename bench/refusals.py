"""The CPU time `graphmode` takes to refuse a usage error, beside the time importing torch takes.

    python bench/refusals.py [--repeat 3]

Each usage error runs the command line in a fresh interpreter, as a person at the terminal does; its CPU time (user +
system, read from the child's resource usage, so a loaded machine does not inflate it as it does wall time) is the
median over the repeats. A refusal is meant to take under 0.5 s of CPU: it must not wait on torch, transformers,
langgraph or libcst (tests/test_refusals.py checks that none of them is imported). Prints one line per case and
the reference figures of a bare interpreter and of `import torch`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "legacy_llm"
LIMIT_CPU_S = 0.5

# (what the person typed wrong, the arguments); {file} is a plain file, {tmp} an empty folder, {config} a config.json
# that is not JSON.
CASES = (
    ("--out names a file", ["adapt", str(EXAMPLE), "--out", "{file}"]),
    ("--compile-cache names a file", ["adapt", str(EXAMPLE), "--compile-cache", "{file}"]),
    ("the target does not exist", ["adapt", "{tmp}/nothing-here"]),
    ("--steps below the minimum", ["adapt", str(EXAMPLE), "--steps", "4"]),
    ("an unknown backend", ["adapt", str(EXAMPLE), "--backend", "no-such-backend"]),
    ("bad --batch-buckets", ["adapt", str(EXAMPLE), "--batch-buckets", "2,x"]),
    ("--hf folder without config.json", ["adapt", "--hf", str(EXAMPLE)]),
    ("--hf config.json that is not JSON", ["adapt", "--hf", "{config}", "--tiny"]),
    ("resume of an unknown session", ["resume", "nosuchid"]),
    ("fix of a missing file", ["fix", "{tmp}/missing.py"]),
    ("batch of a missing manifest", ["batch", "{tmp}/missing.toml"]),
)


def cpu_seconds(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, exit status) of one run of `python argv...`."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - started, proc.returncode


def median_run(argv: list[str], cwd: Path, env: dict[str, str], repeat: int) -> tuple[float, float, int]:
    runs = [cpu_seconds(argv, cwd, env) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), runs[-1][2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the median is shown (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="graphmode-refusals-") as tmp:
        folder = Path(tmp)
        (folder / "not-a-folder").write_text("")
        (folder / "broken").mkdir()
        (folder / "broken" / "config.json").write_text('{"model_type": "llama",')
        env = {**os.environ, "GRAPHMODE_HOME": str(folder / "home")}
        print(f"{'case':<36} {'exit':>4} {'CPU s':>7} {'wall s':>7}")
        slow = []
        for name, argv in CASES:
            argv = [a.format(file=folder / "not-a-folder", tmp=folder, config=folder / "broken" / "config.json")
                    for a in argv]
            cpu, wall, status = median_run(["-m", "graphmode.agent.cli", *argv], folder, env, args.repeat)
            print(f"{name:<36} {status:>4} {cpu:>7.3f} {wall:>7.3f}")
            if cpu >= LIMIT_CPU_S or status != 2:
                slow.append(name)
        for name, code in (("reference: python -c pass", "pass"), ("reference: import torch", "import torch")):
            cpu, wall, _ = median_run(["-c", code], folder, env, args.repeat)
            print(f"{name:<36} {'':>4} {cpu:>7.3f} {wall:>7.3f}")
    if slow:
        print(f"not refused with exit status 2 within {LIMIT_CPU_S} s of CPU: {', '.join(slow)}")
        return 1
    print(f"every case refused with exit status 2 within {LIMIT_CPU_S} s of CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
