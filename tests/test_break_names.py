"""A graph break inside library code is named at the model's own line and construct (issue 39): the model's file is
found from its module classes wherever it is installed, and a break in torch.nn or in a library helper module reads
as the model line that reached it, with what Dynamo said and where it stopped; so does an error a worker reports
(cpmant's static Prefill: a shape error raised in torch, from the model's own line)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from graphmode.runners.harness import describe_exception
from graphmode.runners.measure.dynamo_watch import explain_breaks, model_files, parse_recompile_message
from graphmode.runners.verify.verify import _breaks_problem

HELPER = '''import torch


class Scale(torch.nn.Module):
    """A leaf helper, as a library ships one (an activation): its break is the caller's construct."""

    def forward(self, x):
        torch._dynamo.graph_break()
        return x * 2
'''

MODEL = '''import torch

from helperlib import Scale


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.scale = Scale()
        self.table = torch.nn.Buffer(torch.ones(4), persistent=False)

    def forward(self, x):
        x = self.scale(self.proj(x))  # helper
        self.table = self.table.to(dtype=x.dtype)  # setattr
        return x * self.table
'''


def _load(tmp_path: Path, monkeypatch) -> torch.nn.Module:
    # Both files lie outside the adapted folder, under a site-packages folder, as transformers' modeling files do.
    installed = tmp_path / "site-packages"
    (installed / "helperlib").mkdir(parents=True)
    (installed / "helperlib" / "__init__.py").write_text(HELPER)
    (installed / "tinymodel").mkdir()
    (installed / "tinymodel" / "modeling_tiny.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(installed))
    file = installed / "tinymodel" / "modeling_tiny.py"
    spec = importlib.util.spec_from_file_location("tinymodel.modeling_tiny", file)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # as an import leaves it: inspect finds a class's file there
    spec.loader.exec_module(module)
    return module.Block()


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(MODEL.splitlines(), start=1) if text.endswith(f"# {marker}"))


def test_breaks_in_torch_and_in_a_library_helper_are_named_at_the_models_line(tmp_path, monkeypatch):
    model = _load(tmp_path, monkeypatch)
    adapted = tmp_path / "adapted"  # the run's folder: here, as with --hf, no line of the model lies in it
    adapted.mkdir()
    own = model_files(model)
    assert {Path(f).name for f in own} == {"modeling_tiny.py"}  # the leaf helper's file is not the model's
    torch._dynamo.reset()
    count, reasons = explain_breaks(model, torch.randn(1, 4), root=adapted, own=own)
    assert count >= 2
    by_line = {r.line: r for r in reasons}
    helper, setattr_ = by_line[_line("helper")], by_line[_line("setattr")]
    for reason in (helper, setattr_):
        assert reason.file.endswith("site-packages/tinymodel/modeling_tiny.py") and reason.function == "forward"
    assert helper.code == "x = self.scale(self.proj(x)) # helper" and helper.inside.startswith("helperlib/")
    assert setattr_.code.startswith("self.table = self.table.to(")
    assert setattr_.inside.startswith("torch/nn/modules/module.py:")

    rows = [{"reason": r.reason, "file": r.file, "line": r.line, "code": r.code, "inside": r.inside}
            for r in [setattr_, helper]]
    problem = _breaks_problem(count, rows)
    assert problem.startswith(f"{count} graph break(s) in Decode at tinymodel/modeling_tiny.py:{_line('setattr')} "
                              "(`self.table = self.table.to(dtype=x.dtype) # setattr`): ")
    assert f"{setattr_.reason}, inside torch/nn/modules/module.py:" in problem
    assert problem.endswith(f"; also at tinymodel/modeling_tiny.py:{_line('helper')}")


def test_a_break_in_the_adapted_sources_keeps_its_relative_line():
    row = {"reason": "Data-dependent branching", "file": "model.py", "line": 12, "code": "if x.sum() > 0:",
           "inside": ""}
    assert _breaks_problem(1, [row]) == ("1 graph break(s) in Decode at model.py:12 (`if x.sum() > 0:`, lines of "
                                         "the adapted sources): Data-dependent branching")
    assert _breaks_problem(2, []) == "2 graph break(s) in Decode"


def test_a_recompile_guard_is_named_at_the_models_line_with_its_code():
    message = (
        "Recompiling function forward in /x/site-packages/tinymodel/modeling_tiny.py:10\n"
        "    triggered by the following guard failure(s):\n"
        "    - 1/1: L['x'].size()[1] == 9\n"
        '    -   File "/x/site-packages/tinymodel/modeling_tiny.py", line 14, in forward\n'
        "    -     x = self.scale(self.proj(x))\n"
        '    -   File "/usr/lib/torch/nn/modules/module.py", line 1775, in _call_impl\n')
    reason = parse_recompile_message(message, root=Path("/y"), own={"/x/site-packages/tinymodel/modeling_tiny.py"})
    assert (reason.file, reason.line) == ("/x/site-packages/tinymodel/modeling_tiny.py", 14)
    assert reason.code == "x = self.scale(self.proj(x))" and reason.inside == "/usr/lib/torch/nn/modules/module.py:1775"


def test_an_error_raised_in_torch_is_named_at_the_installed_models_line(tmp_path, monkeypatch):
    model = _load(tmp_path, monkeypatch)
    adapted = tmp_path / "adapted"
    adapted.mkdir()
    try:
        model(torch.randn(1, 5))  # the Linear takes 4 features: torch raises, from the model's line
    except RuntimeError as exc:
        described = describe_exception(exc, adapted)
    assert described.startswith("RuntimeError: ")
    assert described.endswith(f"(at tinymodel/modeling_tiny.py:{_line('helper')} `x = self.scale(self.proj(x)) "
                              "# helper`)")


def test_a_guard_without_a_user_stack_is_named_at_the_frames_line_with_its_code(tmp_path):
    source = tmp_path / "site-packages" / "tinymodel" / "modeling_tiny.py"
    source.parent.mkdir(parents=True)
    source.write_text(MODEL)
    message = (f"Recompiling function torch_dynamo_resume_in_forward_at_15 in {source}:15\n"
               "    triggered by the following guard failure(s):\n"
               "    - 3/0: tensor '___stack0' size mismatch at index 1. expected 9, actual 10\n")
    reason = parse_recompile_message(message, root=tmp_path / "adapted")
    assert (reason.line, reason.code) == (15, "self.table = self.table.to(dtype=x.dtype) # setattr")
