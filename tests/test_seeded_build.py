"""A random model's uninitialised tensors (`torch.empty` left unwritten by `__init__`) are filled from the seed."""
from __future__ import annotations

import torch
from torch import nn

from graphmode.runners.seeded_build import seeded_build


class _Gate(nn.Module):
    """DeepSeek-V3's router as its remote code builds it: a weight it initialises, a correction bias it does not
    (a checkpoint would), a cache buffer half written, and a plain tensor attribute left as allocated."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 4)
        self.weight = nn.Parameter(torch.empty(4, 8))
        nn.init.normal_(self.weight)
        self.e_score_correction_bias = nn.Parameter(torch.empty(4))
        self.scale = nn.Parameter(torch.empty(4))
        self.mixing = nn.Parameter(torch.empty(3, 5))
        cache = torch.empty(2, 6)
        cache[0] = 1.0
        self.register_buffer("cache", cache, persistent=False)
        self.scratch = torch.empty(5)
        self.counts = torch.empty(3, dtype=torch.long)


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(_Gate(), _Gate())


def test_every_unwritten_element_is_filled_from_the_seed_and_named():
    first, filled = seeded_build(_build)
    second, again = seeded_build(_build)
    assert filled == again
    # The tensors __init__ left (wholly or in part) unwritten, each named once; the ones it wrote are not named.
    for layer in ("0", "1"):
        assert {f"{layer}.e_score_correction_bias", f"{layer}.scale", f"{layer}.mixing", f"{layer}.cache",
                f"{layer}.scratch"} <= set(filled)
        assert not {f"{layer}.weight", f"{layer}.proj.weight", f"{layer}.proj.bias"} & set(filled)
    assert len(filled) == len(set(filled))
    # Two builds are the same model, bit for bit, with no NaN left anywhere.
    for (name, a), (_, b) in zip(first.state_dict(keep_vars=True).items(), second.state_dict(keep_vars=True).items()):
        assert torch.equal(a, b), name
        assert not a.is_floating_point() or not torch.isnan(a).any(), name
    gate = first[0]
    assert torch.equal(gate.scratch, torch.zeros(5)) and torch.equal(gate.counts, torch.zeros(3, dtype=torch.long))
    # What was written stays as written; the unwritten half of the cache, a buffer, is zeros.
    assert torch.equal(gate.cache[0], torch.ones(6)) and torch.equal(gate.cache[1], torch.zeros(6))
    # A bias starts neutral, a 1-D scale at one, a matrix drawn at unit activation scale.
    assert torch.equal(gate.e_score_correction_bias, torch.zeros(4)) and torch.equal(gate.scale, torch.ones(4))
    assert gate.mixing.std() > 0 and not torch.equal(first[0].mixing, first[1].mixing)


def test_a_model_that_initialises_everything_is_built_as_it_would_be():
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4), nn.Embedding(10, 4))

    model, filled = seeded_build(build)
    assert filled == []
    plain = build()
    for (name, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name
