"""ruff's pyflakes findings in a text, for holding adapted code to its original (test_adapted_lint, the test bed)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter

import pytest


def _ruff() -> list[str]:
    try:
        import ruff  # noqa: F401  (only whether the module is there)
        return [sys.executable, "-m", "ruff"]
    except ImportError:
        found = shutil.which("ruff")
        if found is None:
            pytest.skip("ruff is not installed (pip install -e '.[dev]')")
        return [found]


def findings(text: str, name: str, ignore: tuple[str, ...] = ()) -> Counter:
    """ruff's pyflakes findings in `text`, as (code, message) with their counts: lines move when code is added."""
    command = [*_ruff(), "check", "--isolated", "--no-cache", "--select", "F,E9", "--output-format", "json",
               "--stdin-filename", name, "-"]
    if ignore:
        command += ["--ignore", ",".join(ignore)]
    done = subprocess.run(command, input=text, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return Counter((f["code"], f["message"]) for f in json.loads(done.stdout))


def own_limit(original: str) -> int:
    """The line length a file keeps to: its longest line, at least 79 (transforms.output.line_wrap wraps to it)."""
    return max([79, *(len(line) for line in original.splitlines())])


def too_long(text: str, limit: int, original: str = "") -> list[int]:
    """The lines of `text` ruff finds longer than `limit` (E501), by number; a line of `original` that the rewrite
    only moved into a guard (the same text, indented further) is the model's own and is not counted."""
    command = [*_ruff(), "check", "--isolated", "--no-cache", "--select", "E501", "--line-length", str(limit),
               "--output-format", "json", "-"]
    done = subprocess.run(command, input=text, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    own = {line.strip() for line in original.splitlines()}
    lines = text.splitlines()
    return [f["location"]["row"] for f in json.loads(done.stdout) if lines[f["location"]["row"] - 1].strip() not in own]
