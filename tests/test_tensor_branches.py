"""tensor_branches keeps results: the fixture model before and after the rewrite, on inputs that take each
branch (overflow, non-finite values, large scores, a mask) and on inputs that take none."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

CASE = Path(__file__).parent / "fixtures" / "codemods" / "tensor_branches" / "select_on_device.in.py"


def _module(source: str, name: str) -> ModuleType:
    module = ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def _inputs(dtype: torch.dtype, overflow: bool, scale: float, masked: bool) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, generator=generator).to(dtype)
    if overflow:
        x[0, 0, 0] = float("inf")
        x[1, 2, 3] = float("nan")
    scores = (torch.randn(2, 4, 8, generator=generator) * scale).to(dtype)
    mask = torch.zeros(2, 4, 8, dtype=torch.bool)
    if masked:
        mask[:, :, -2:] = True
    return x, scores, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("overflow, scale, masked", [(False, 1.0, False), (True, 100.0, True), (False, 100.0, False)])
def test_the_selection_gives_what_the_branch_gave(dtype, overflow, scale, masked):
    source = CASE.read_text()
    result = adapt_source(source, CASE.name, {"tensor_branches"}, Options(entry_class="Model"))
    assert result.applied == ["tensor_branches"] and "torch.where" in result.static_view
    before = _module(source, "before").Model()
    after = _module(result.static_view, "after").Model()  # the rewrite itself, as the static path runs it
    args = _inputs(dtype, overflow, scale, masked)
    expected = before(*(a.clone() for a in args))
    got = after(*(a.clone() for a in args))
    assert torch.equal(expected.isnan(), got.isnan())
    torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)


def test_the_selection_compiles_without_a_graph_break():
    source = CASE.read_text()
    after = _module(adapt_source(source, CASE.name, {"hoist_item", "tensor_branches"},
                                 Options(entry_class="Model")).static_view,
                    "after").Model()
    before = _module(source, "before").Model()
    args = _inputs(torch.float32, False, 100.0, True)
    assert torch._dynamo.explain(before)(*args).graph_break_count > 0
    torch._dynamo.reset()
    assert torch._dynamo.explain(after)(*args).graph_break_count == 0
