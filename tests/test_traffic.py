"""runners/measure/traffic.py: the analytic per-layer Decode traffic, checked against a hand calculation and the
fusions."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from graphmode.runners.measure.traffic import FUSIONS, Sizes, config_traffic, layer_steps, layer_traffic, read_config

LLAMA_2_7B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
              "num_hidden_layers": 32, "max_position_embeddings": 4096, "torch_dtype": "float16"}


@dataclass
class ModelArgs:  # Meta's spelling, as an object
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    hidden_dim: int = 11008
    max_seq_len: int = 4096


def test_llama_2_7b_weights_per_layer_match_the_hand_calculation():
    estimate = config_traffic(LLAMA_2_7B, batch=1, kv_len=4096)
    by_hand = 2 * (4 * 4096 * 4096 + 3 * 4096 * 11008)  # q, k, v, o and gate, up, down, in fp16
    assert abs(estimate["weights"] - by_hand) / by_hand < 0.001  # the norms' weights are the difference
    assert estimate["dtype_bytes"] == 2 and estimate["times_layers"]["weights"] == 32 * estimate["weights"]
    # K and V of 4096 positions, plus this step's pair written.
    assert estimate["kv_cache"] == 2 * (2 * 4096 * 4096 + 2 * 4096)
    # Decode at batch 1 is the weights: the rest is a few per cent.
    assert estimate["weights"] > 5 * (estimate["kv_cache"] + estimate["intermediates"])


def test_the_spellings_read_the_same_sizes():
    hf, meta = read_config(LLAMA_2_7B), read_config(ModelArgs())
    assert (hf.hidden, hf.heads, hf.kv_heads, hf.head_dim, hf.intermediate, hf.layers) == \
        (meta.hidden, meta.heads, meta.kv_heads, meta.head_dim, meta.intermediate, meta.layers)
    assert read_config({"vocab_size": 10}) is None and read_config(None) is None


@pytest.mark.parametrize("kv_heads", [32, 8])
@pytest.mark.parametrize("fusion", FUSIONS)
def test_each_fusion_lowers_the_intermediates_and_leaves_weights_and_cache(fusion, kv_heads):
    sizes = read_config({**LLAMA_2_7B, "num_key_value_heads": kv_heads})
    for applied in [(), tuple(f for f in FUSIONS if f != fusion)]:
        before = layer_traffic(sizes, 1, 4096, fusions=applied)
        after = layer_traffic(sizes, 1, 4096, fusions=(*applied, fusion))
        assert after["intermediates"] < before["intermediates"] and after["ops"] < before["ops"]
        assert (after["weights"], after["kv_cache"]) == (before["weights"], before["kv_cache"])


def test_the_steps_say_which_fusion_folds_them():
    sizes = read_config(LLAMA_2_7B)
    unfused = layer_steps(sizes, 1, 128)
    for fusion in FUSIONS:
        folded = [step.op for step in unfused if step.fused_by == fusion]
        remaining = {step.op for step in layer_steps(sizes, 1, 128, {fusion})}
        assert folded and not remaining & set(folded)
    with pytest.raises(ValueError, match="unknown fusions"):
        layer_steps(sizes, 1, 128, {"fused_everything"})


def test_the_stored_sizes_make_the_estimate_again():
    stored = config_traffic(ModelArgs(), batch=2, kv_len=512, dtype_bytes=2)
    again = layer_traffic(Sizes.from_dict(stored["sizes"]), stored["batch"], stored["kv_len"], stored["dtype_bytes"])
    assert {key: again[key] for key in ("weights", "kv_cache", "intermediates", "total")} == \
        {key: stored[key] for key in ("weights", "kv_cache", "intermediates", "total")}
    fused = config_traffic(ModelArgs(), batch=2, kv_len=512, dtype_bytes=2, fusions=FUSIONS)
    assert fused["fusions"] == sorted(FUSIONS) and fused["total"] < stored["total"]
