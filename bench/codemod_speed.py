"""Time of the codemod pipeline (every codemod in chain order, as `adapt` runs it) per source file.

    python bench/codemod_speed.py TARGET_OR_FILE... [--repeats N]

A TARGET is a folder with a harness.py: its SOURCES are timed, with the entry class read from the harness's
model class when `--entry-class` is not given (else every class is a candidate: the name only matters to
split_decode). Files are timed without runtime evidence (what `graphmode scan --check-fixes` does); the
traced run itself is timed by `graphmode adapt` (analyze) and costs a few seconds per target. Prints one line
per file (best of N wall and CPU seconds, lines, codemods applied) and the totals.
"""
from __future__ import annotations

import argparse
import ast
import time
from pathlib import Path

from graphmode.transforms.codemods import Options
from graphmode.transforms.fix import entry_class_of
from graphmode.transforms.pipeline import adapt_source


def _files(paths: list[Path]) -> list[tuple[Path, str | None]]:
    found = []
    for path in paths:
        if path.is_dir():
            harness = path / "harness.py"
            declared = None
            if harness.is_file():
                for node in ast.parse(harness.read_text()).body:
                    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SOURCES" for t in node.targets):
                        declared = ast.literal_eval(node.value)
            names = declared or sorted(p.name for p in path.glob("*.py") if p.name != "harness.py")
            found += [(path / name, _entry_class(path / name)) for name in names]
        else:
            found.append((path, _entry_class(path)))
    return found


def _entry_class(path: Path) -> str | None:
    """The class a causal-LM harness would build (what `graphmode fix` assumes), else the file's last class."""
    source = path.read_text()
    classes = [n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    return entry_class_of(source) or (classes[-1] if classes else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    total = total_cpu = 0.0
    for path, entry in _files(args.paths):
        source = path.read_text(encoding="utf-8")
        best = best_cpu = float("inf")
        for _ in range(args.repeats):
            started, started_cpu = time.perf_counter(), time.process_time()
            result = adapt_source(source, path.name, None, Options(entry_class=entry))
            best = min(best, time.perf_counter() - started)
            best_cpu = min(best_cpu, time.process_time() - started_cpu)
        total += best
        total_cpu += best_cpu
        print(f"{best:7.2f} s  {best_cpu:7.2f} s cpu  {source.count(chr(10)):6d} lines  {path}  "
              f"applied: {', '.join(result.applied) or '-'}")
    # CPU seconds beside wall seconds: on a shared machine the wall figure also counts the others' work.
    print(f"{total:7.2f} s  {total_cpu:7.2f} s cpu  total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
