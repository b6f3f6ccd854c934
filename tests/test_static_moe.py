"""The static MoE dispatch, run with real torch: `graphmode_moe` (helper code) gives the mixture the expert loops give,
reading only the routed experts' weights where a step routes fewer pairs than there are experts, and the adapted
fixtures of static_moe give their originals' outputs with the dispatch compiled whole, in Prefill and Decode shapes
(fp32)."""
from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

from adapted_files import import_adapted

from graphmode.transforms.codemods.experts.static_moe import HELPER
from graphmode.transforms.codemods.lib.helper_code import HELPER_CODE, helper_source

FIXTURES = Path(__file__).parent / "fixtures" / "codemods" / "static_moe"
PREFILL, DECODE = 7, 1  # tokens per sequence in each phase


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # `inspect.getsource` finds the file through it
    spec.loader.exec_module(module)
    return module


helpers = _load("graphmode_test_static_moe_helpers", HELPER_CODE)


def _compiled(fn):
    """Traced whole by Dynamo (a graph break raises), run without Inductor."""
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


class _Expert(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


def _routing(tokens: torch.Tensor, experts: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.randn(tokens.shape[0], experts).softmax(dim=-1)
    weights, ids = torch.topk(scores, top_k, dim=-1)
    return ids, weights / weights.sum(dim=-1, keepdim=True)


def _loop_dispatch(experts, tokens, ids, weights):
    """The dispatch MoE code writes: each expert over the tokens routed to it, added back at their rows."""
    out = torch.zeros_like(tokens)
    for index, expert in enumerate(experts):
        rows, slot = torch.where(ids == index)
        out.index_add_(0, rows, expert(tokens[rows]) * weights[rows, slot, None])
    return out


def test_the_inserted_helper_is_the_definition_in_the_file():
    assert helper_source(HELPER) == inspect.getsource(helpers.graphmode_moe)


def test_stacking_keeps_the_parameters_and_makes_them_views_of_one_tensor():
    torch.manual_seed(0)
    experts = nn.ModuleList(_Expert(16, 24) for _ in range(5)).eval()
    before = {k: v.clone() for k, v in experts.state_dict().items()}
    helpers.graphmode_stack_experts(experts)
    stacked = experts.graphmode_stacked
    assert stacked["up.weight"].shape == (5, 24, 16)
    assert all(torch.equal(before[k], v) for k, v in experts.state_dict().items())
    assert experts[3].up.weight.data_ptr() == stacked["up.weight"][3].data_ptr()
    helpers.graphmode_stack_experts(experts)
    assert experts.graphmode_stacked is stacked  # nothing moved: stacked once
    mixed = nn.ModuleList([nn.Linear(8, 8), _Expert(8, 8)])
    helpers.graphmode_stack_experts(mixed)  # experts of different kinds: left as they are
    assert getattr(mixed, "graphmode_stacked", None) is None


class _GatedExpert(nn.Module):
    """An expert as merged_projections adapts it: its gate and up projections through graphmode_merged_linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate, up = helpers.graphmode_merged_linear(self, ("gate", "up"), x)
        return self.down(F.silu(gate) * up)


def test_experts_with_merged_projections_are_held_once_and_routed_by_their_own_weights():
    torch.manual_seed(0)
    experts = nn.ModuleList(_GatedExpert(16, 24) for _ in range(8)).eval()
    helpers.GraphmodeStaticPath.state_of(experts)["on"] = True  # as in the entries: the merged matmul runs
    tokens = torch.randn(PREFILL, 16)
    ids, weights = _routing(tokens, len(experts), 2)
    with torch.no_grad():
        expected = _loop_dispatch(experts, tokens, ids, weights)  # eager: each expert stacks its gate and up
        assert "graphmode_stacked" in experts[ids[0, 0]].__dict__
        helpers.graphmode_stack_experts(experts)
        # One copy of the weights: the experts' stack; the per-expert stacks are dropped and not built again.
        assert not any("graphmode_stacked" in expert.__dict__ for expert in experts)
        assert experts[5].gate.weight.data_ptr() == experts.graphmode_stacked["gate.weight"][5].data_ptr()
        torch.testing.assert_close(_loop_dispatch(experts, tokens, ids, weights), expected)
        assert not any("graphmode_stacked" in expert.__dict__ for expert in experts)
        # Decode of one token routes 2 of 8: each pair runs the expert's forward on its own gathered weights.
        one = tokens[:1]
        torch.testing.assert_close(_compiled(helpers.graphmode_moe)(experts, one, ids[:1], weights[:1]),
                                   _loop_dispatch(experts, one, ids[:1], weights[:1]))


def test_merged_projections_of_a_module_no_eager_call_stacked_run_one_by_one_when_compiled():
    torch.manual_seed(0)
    expert, x = _GatedExpert(16, 24).eval(), torch.randn(1, 16)
    helpers.GraphmodeStaticPath.state_of(expert)["on"] = True
    with torch.no_grad():
        got = _compiled(expert)(x)  # Decode reaching an expert that no Prefill token was routed to
        torch.testing.assert_close(got, expert.down(F.silu(expert.gate(x)) * expert.up(x)))
    assert "graphmode_stacked" not in expert.__dict__


@pytest.mark.parametrize("count, experts_count, routed", [(DECODE, 8, True), (DECODE * 3, 8, True),
                                                          (PREFILL * 2, 8, False), (DECODE * 2, 3, False)])
def test_the_dispatch_reads_the_routed_experts_where_that_reads_less_and_gives_the_loops_mixture(
        count, experts_count, routed):
    torch.manual_seed(0)
    experts = nn.ModuleList(_Expert(16, 24) for _ in range(experts_count)).eval()
    helpers.graphmode_stack_experts(experts)
    tokens = torch.randn(count, 16)
    ids, weights = _routing(tokens, experts_count, 2)
    counters.clear()
    with torch.no_grad():
        expected = _loop_dispatch(experts, tokens, ids, weights)
        chosen = helpers.graphmode_moe_routed if routed else helpers.graphmode_moe_dense
        torch.testing.assert_close(chosen(experts, tokens, ids, weights), expected)
        torch.testing.assert_close(helpers.graphmode_moe(experts, tokens, ids, weights), expected)
        torch.testing.assert_close(_compiled(helpers.graphmode_moe)(experts, tokens, ids, weights), expected)
    assert not counters["graph_break"]
    assert (count * 2 < experts_count) == routed


@pytest.mark.parametrize("count", [PREFILL * 2, DECODE * 2])
def test_dense_dispatch_gives_the_loops_mixture_compiled_whole(count):
    torch.manual_seed(0)
    experts = nn.ModuleList(_Expert(16, 24) for _ in range(6)).eval()
    tokens = torch.randn(count, 16)
    ids, weights = _routing(tokens, len(experts), 2)
    counters.clear()
    with torch.no_grad():
        expected = _loop_dispatch(experts, tokens, ids, weights)
        torch.testing.assert_close(helpers.graphmode_moe_dense(experts, tokens, ids, weights), expected)
        torch.testing.assert_close(_compiled(helpers.graphmode_moe_dense)(experts, tokens, ids, weights), expected)
    assert not counters["graph_break"]


def test_an_expert_a_token_was_not_routed_to_cannot_leak_into_it():
    """Dropped by a selection, not multiplied by zero: an overflow in an unrouted expert leaves the sum finite."""
    torch.manual_seed(0)
    experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4)).eval()
    with torch.no_grad():
        experts[3].bias.fill_(float("inf"))
    tokens = torch.randn(5, 8)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2], [1, 0]])  # nobody chose expert 3
    weights = torch.full((5, 2), 0.5)
    with torch.no_grad():
        mixed = helpers.graphmode_moe_dense(experts, tokens, ids, weights)
        assert torch.isfinite(mixed).all()
        torch.testing.assert_close(mixed, _loop_dispatch(experts, tokens, ids, weights))


def test_the_sum_is_taken_in_the_weights_dtype_and_returned_in_the_tokens_dtype():
    torch.manual_seed(0)
    experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3)).to(torch.bfloat16).eval()
    tokens = torch.randn(4, 8, dtype=torch.bfloat16)
    ids, weights = _routing(tokens, 3, 2)  # fp32 weights, as DeepSeek's gate gives them
    with torch.no_grad():
        mixed = helpers.graphmode_moe_dense(experts, tokens, ids, weights)
        reference = sum(torch.where((ids == e).any(-1, keepdim=True),
                                    experts[e](tokens).float() * (weights * (ids == e)).sum(-1, keepdim=True), 0)
                        for e in range(3))
    assert mixed.dtype == torch.bfloat16
    torch.testing.assert_close(mixed, reference.to(torch.bfloat16))


@pytest.mark.parametrize("ids_shape, experts, message", [
    ((3, 2), 4, "one row of expert ids and weights per token"),
    ((5,), 4, "one row of expert ids and weights per token"),
    ((5, 2), None, "expert parallelism"),
])
def test_inputs_it_cannot_dispatch_are_refused_with_the_reason(ids_shape, experts, message):
    modules = nn.ModuleList(nn.Linear(8, 8) for _ in range(4)) if experts else [nn.Linear(8, 8), None]
    ids = torch.zeros(ids_shape, dtype=torch.long)
    with pytest.raises(ValueError, match=message):
        helpers.graphmode_moe_dense(modules, torch.randn(5, 8), ids, torch.ones(ids_shape))


def _static_path_on(model: nn.Module) -> None:
    """As inside the `prefill`/`decode` entries split_decode adds (`GraphmodeStaticPath`)."""
    state = {"on": True}
    for module in model.modules():
        module.graphmode_static_state = state


@pytest.mark.parametrize("case", ["one_hot_where", "sorted_counts", "masked_rows", "counts_iterated", "rows_weighted"])
def test_adapted_fixtures_give_the_originals_outputs_with_the_dispatch_compiled_whole(case):
    original = _load(f"static_moe_{case}_in", FIXTURES / f"{case}.in.py")
    adapted = import_adapted(FIXTURES / f"{case}.out.py", f"static_moe_{case}_out")
    torch.manual_seed(0)
    reference = original.Model().eval()
    model = adapted.Model().eval()
    model.load_state_dict(reference.state_dict())
    _static_path_on(model)
    compiled = _compiled(model)
    counters.clear()
    with torch.no_grad():
        for length in (PREFILL, DECODE):
            tokens = torch.randint(0, 64, (1, length))
            expected = reference(tokens)
            torch.testing.assert_close(model(tokens), expected)  # eager: the loop, kept for Prefill
            torch.testing.assert_close(compiled(tokens), expected)  # compiled: the static dispatch
    assert not counters["graph_break"]
