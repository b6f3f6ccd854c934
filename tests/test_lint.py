"""The project's own code is held to the same lint as the code it writes: `ruff check` over the repository (the
`[tool.ruff]` settings in pyproject.toml, which leave out tests/fixtures and tests/corpus/shims) finds nothing."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    executable = shutil.which("ruff")
    if executable is None:
        pytest.skip("ruff is not installed (neither `python -m ruff` nor a `ruff` on PATH): pip install -e '.[dev]'")
    return [executable]


def test_ruff_check_finds_nothing():
    done = subprocess.run([*_ruff(), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff check failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
