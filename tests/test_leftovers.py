"""Which leftover items the adapted Decode runs: the line tracer, and the mapping from original lines."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from agent.leftovers import mark_decode_runs
from runners.line_trace import lines_run

MODEL = '''import torch


def step(x, flash=False):
    if flash:
        return x.sum().item()  # another path
    y = x * 2
    return y + 1
'''


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def test_the_tracer_records_the_lines_run_in_the_folder_only(tmp_path):
    (tmp_path / "tiny_model.py").write_text(MODEL)
    module = _load(tmp_path / "tiny_model.py")
    result, lines = lines_run(lambda: module.step(torch.ones(2)), tmp_path)
    assert torch.equal(result, torch.full((2,), 3.0))
    assert set(lines) == {"tiny_model.py"}  # torch's own files are not traced
    run = set(lines["tiny_model.py"])
    assert {5, 7, 8} <= run and 6 not in run


def test_items_are_marked_through_the_adapted_line_numbers(tmp_path):
    target, adapted = tmp_path / "target", tmp_path / "adapted"
    target.mkdir(), adapted.mkdir()
    (target / "model.py").write_text(MODEL)
    # The adapted copy has two lines inserted at the top: original line N is adapted line N + 2.
    (adapted / "model.py").write_text("# added\n# added\n" + MODEL)
    manual = [{"path": "model.py", "line": 6, "kind": "finding"}, {"path": "model.py", "line": 7, "kind": "finding"}]
    marked = mark_decode_runs(manual, {"model.py": [7, 9, 10]}, target, adapted)
    assert [m["decode_runs"] for m in marked] == [False, True]
    assert [m["decode_runs"] for m in mark_decode_runs(manual, {}, target, adapted)] == [None, None]
