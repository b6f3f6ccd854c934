"""`graphmode fix` over every `modeling_*.py` of the installed transformers, and the checks on its output.

    python bench/fix_zoo.py [--jobs 2] [--keep DIR] [--limit N]

Runs the command as a user would (a subprocess), over a folder of links to the files, one sub-folder per model.
Then checks what the issue asks: no crash, every adapted copy compiles, and `graphmode fix` over the adapted
copies changes nothing. Prints the counts, the wall time of both runs, and the slowest files (their own seconds,
measured inside the workers, from fix.json).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _zoo(folder: Path, limit: int | None) -> int:
    import transformers

    files = sorted(Path(transformers.__file__).parent.joinpath("models").glob("*/modeling_*.py"))[:limit]
    for path in files:
        (folder / path.parent.name).mkdir(exist_ok=True)
        (folder / path.parent.name / path.name).symlink_to(path)
    return len(files)


def _fix(paths: list[Path], out: Path, jobs: int) -> tuple[float, dict, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "graphmode.agent.cli", "fix", *map(str, paths), "--out", str(out),
                           "--jobs", str(jobs)], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if not (out / "fix.json").is_file():
        raise SystemExit(f"graphmode fix wrote no fix.json (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, json.loads((out / "fix.json").read_text()), done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep the output here (default: a temporary folder)")
    parser.add_argument("--limit", type=int, help="only the first N files (a quick look)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fix-zoo-") as temporary:
        base = args.keep or Path(temporary)
        zoo = base / "zoo"
        zoo.mkdir(parents=True)
        count = _zoo(zoo, args.limit)
        lines = sum(p.read_text().count("\n") for p in zoo.glob("*/*.py"))
        first_s, first, stderr = _fix([zoo], base / "fixed", args.jobs)
        counts = first["counts"]
        results = first["results"]
        crashed = [r for r in results if r["status"] == "crashed"]
        copies = sorted((base / "fixed").glob("**/*.py"))
        not_compiling = []
        for copy in copies:
            try:
                compile(copy.read_text(), str(copy), "exec")
            except SyntaxError as error:
                not_compiling.append(f"{copy}: {error}")
        again_s, again, _ = _fix([base / "fixed" / "zoo"], base / "again", args.jobs) if copies else (0.0, None, "")
        changed_again = [r["relative"] for r in again["results"] if r["status"] == "rewritten"] if again else []
        per_file = sorted(results, key=lambda r: r["seconds"])
        print(f"files: {count} ({lines} lines), jobs {args.jobs}")
        print(f"first run: {first_s:.0f} s wall; {counts['rewritten']} rewritten, {counts['unchanged']} unchanged, "
              f"{counts['unreadable']} unreadable, {counts['crashed']} crashed; {counts['manual_items']} items for a "
              "person")
        print(f"per file (in the worker): median {statistics.median(r['seconds'] for r in results):.2f} s, "
              f"max {per_file[-1]['seconds']:.2f} s ({per_file[-1]['relative']}); "
              f"{sum(r['seconds'] for r in results) / max(lines, 1) * 1400:.2f} s per 1,400 lines on average")
        print(f"adapted copies compiling: {len(copies) - len(not_compiling)} of {len(copies)}")
        print(f"second run over the copies: {again_s:.0f} s wall; changed {len(changed_again)} files")
        for row in per_file[-5:][::-1]:
            print(f"  slow: {row['seconds']:6.2f} s  {row['relative']}  applied: {', '.join(row['applied']) or '-'}")
        for row in crashed:
            print(f"  crashed: {row['relative']}: {row['error']}")
        for row in not_compiling:
            print(f"  does not compile: {row}")
        for name in changed_again:
            print(f"  changed by a second run: {name}")
        if crashed or not_compiling or changed_again:
            print(stderr[-2000:], file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
