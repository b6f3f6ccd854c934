"""bench/handwritten_llm.py computes the bundled example's function (eager, no compile: fast)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("sdpa", [True, False])
def test_handwritten_matches_the_example_greedily(sdpa):
    original_mod = _import(ROOT / "examples" / "legacy_llm" / "model.py", "test_hw_original_model")
    hand_mod = _import(ROOT / "bench" / "handwritten_llm.py", "test_hw_handwritten_llm")
    torch.manual_seed(0)
    original = original_mod.Transformer(original_mod.ModelArgs(max_seq_len=64)).eval()
    hand = hand_mod.Transformer(hand_mod.ModelArgs.like(original.args), sdpa=sdpa).eval().load_from(original)
    prompt = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref, cache = original(prompt, 0)
        got = hand(prompt, torch.arange(8))[:, -1:, :]
        for pos in range(8, 24):
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
            token = ref[:, -1, :].argmax(-1, keepdim=True)
            assert torch.equal(token, got[:, -1, :].argmax(-1, keepdim=True))
            ref, cache = original(token, pos, cache)
            got = hand(token, torch.tensor([pos]))
