"""host_scalars keeps results and removes the host read: the fixture model before and after the rewrite."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

CASE = Path(__file__).parent / "fixtures" / "codemods" / "host_scalars" / "stays_tensor.in.py"


def _model(source: str, name: str) -> torch.nn.Module:
    module = ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    torch.manual_seed(0)  # same parameters on both sides
    return module.Model()


def test_the_tensor_scalar_gives_the_same_values_and_dtype_without_a_graph_break():
    source = CASE.read_text()
    result = adapt_source(source, CASE.name, {"host_scalars"}, Options(entry_class="Model"))
    assert result.applied == ["host_scalars"]
    assert "exp().item()" not in result.static_view and "mean().item()" not in result.static_view
    before, after = _model(source, "before"), _model(result.static_view, "after")
    generator = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16):
        hidden = torch.randn(2, 3, 8, generator=generator).to(dtype)
        bias = torch.randn(8, generator=generator)
        expected, got = before(hidden, bias), after(hidden, bias)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)
    args = (torch.randn(2, 3, 8, generator=generator), torch.randn(8, generator=generator))
    assert torch._dynamo.explain(before)(*args).graph_break_count > 0
    torch._dynamo.reset()
    assert torch._dynamo.explain(after)(*args).graph_break_count == 0
