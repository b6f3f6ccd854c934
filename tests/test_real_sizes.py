"""The adapted static path at the sizes a team serves: `setup_caches` allocates the KV cache and nothing that grows
faster than the context length, on the model's device and in its dtype, also for a model built on the meta device.

The bundled Hugging Face-style example (examples/hf_cache_api: a cache object, a library mask helper) is adapted by
the whole chain and built at Llama-3.1-8B's published shape on the meta device, where tensors have sizes and no
memory; bench/real_size.py does the same for transformers' own files."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from adapted_files import write_adapted
from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

EXAMPLE = Path(__file__).parents[1] / "examples" / "hf_cache_api"
# Llama-3.1-8B's published sizes (its config.json), the ones that size memory.
LLAMA_31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=64)


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """(the original model module, the adapted one), each imported from a folder of its own."""
    adapted = adapt_source((EXAMPLE / "model.py").read_text(), "model.py", None, Options(entry_class="ForCausalLM"))
    assert {"cache_object", "split_decode"} <= set(adapted.applied)
    loaded = []
    for side, text in (("original", None), ("adapted", adapted.adapted)):
        folder = tmp_path_factory.mktemp(side)
        for source in EXAMPLE.glob("*.py"):
            (folder / source.name).write_text(source.read_text())
        if text is not None:
            write_adapted(folder, {"model.py": text})  # with graphmode_static.py beside it
        sys.path.insert(0, str(folder))
        try:
            for name in ("cache", "masks"):  # the model's own siblings, imported fresh from this folder
                sys.modules.pop(name, None)
            spec = importlib.util.spec_from_file_location(f"real_sizes_{side}", folder / "model.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(folder))
        loaded.append(module)
    return loaded


def _held_bytes(model: torch.nn.Module) -> dict[str, int]:
    return {name: b.numel() * b.element_size() for name, b in model.named_buffers() if b is not None}


def test_setup_caches_at_a_published_shape_allocates_the_kv_cache_and_nothing_quadratic(modules):
    original_module, adapted_module = modules
    config = LLAMA_31_8B
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as from_pretrained(torch_dtype=torch.bfloat16) builds a model
    try:
        with torch.device("meta"):
            original = original_module.ForCausalLM(original_module.Config(**config))
            adapted = adapted_module.ForCausalLM(adapted_module.Config(**config))
    finally:
        torch.set_default_dtype(before)
    length = config["max_position_embeddings"]
    adapted.setup_caches(1)  # the config's own length: 131072 positions
    base = _held_bytes(original)
    added = {n: b for n, b in _held_bytes(adapted).items() if base.get(n) != b}
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    kv_bytes = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * length * 2
    assert sum(added.values()) <= 1.02 * kv_bytes, sorted(added.items(), key=lambda item: -item[1])[:3]
    assert sum(added.values()) == kv_bytes  # the keys and values, allocated by setup_caches, in bf16
    with pytest.raises(ValueError, match=r"at most 131072 positions \(config.max_position_embeddings\)"):
        adapted.setup_caches(1, length + 1)


def test_a_model_built_on_meta_and_given_its_weights_later_gets_its_caches_where_it_computes(modules):
    original_module, adapted_module = modules
    torch.manual_seed(0)
    original = original_module.ForCausalLM(original_module.Config(**TINY)).to(torch.bfloat16).eval()
    with torch.device("meta"):
        adapted = adapted_module.ForCausalLM(adapted_module.Config(**TINY))
    # gpt-fast's way of loading: the weights assigned in place of the meta parameters; the buffers stay on meta.
    adapted.load_state_dict(original.state_dict(), assign=True)
    for name, buffer in original.named_buffers():  # the model's own tables, rebuilt as its loader would
        owner, _, leaf = name.rpartition(".")
        adapted.get_submodule(owner)._buffers[leaf] = buffer.clone()
    adapted.eval()
    assert adapted.model.layers[0].self_attn.kv_cache.k_cache.device.type == "meta"
    adapted.setup_caches(2, 24)
    cache = adapted.model.layers[0].self_attn.kv_cache
    assert cache.k_cache.device.type == "cpu" and cache.k_cache.dtype == torch.bfloat16
    assert cache.k_cache.shape == (2, TINY["num_key_value_heads"], 24, TINY["hidden_size"] // 4)
    prompt = torch.randint(0, TINY["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = original(input_ids=prompt).logits[:, -1]
        got = adapted.prefill(prompt, torch.arange(5))[:, -1]
        following = adapted.decode(got.argmax(-1, keepdim=True), torch.tensor([5]))[:, -1]
        reference = original(input_ids=torch.cat([prompt, got.argmax(-1, keepdim=True)], 1)).logits[:, -1]
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(following, reference, atol=2e-2, rtol=2e-2)
