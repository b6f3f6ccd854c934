"""The adapted file replaces the original wherever the original is used: the static path is an addition.

Every call that does not come through the `prefill`/`decode` entries runs the model's own code as written, so a
batch with left padding and a 2-D mask, a cache the caller carries and reorders (beam search), `use_cache=False`
and the attention weights give what the original gives, bit for bit. The entries take the static path, and
using them leaves no trace on the other calls. Each model is built twice from one seed: once from the original
file, once from the adapted one, in this process.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch

from adapted_files import write_adapted

from graphmode.transforms.codemods import Options
from graphmode.transforms.output.helper_module import MODULE_NAME as HELPER_MODULE
from graphmode.transforms.pipeline import adapt_source

ROOT = Path(__file__).parents[1]
HF_EXAMPLE = ROOT / "examples" / "hf_cache_api"
LEGACY_EXAMPLE = ROOT / "examples" / "legacy_llm"
TUPLE_TARGET = ROOT / "tests" / "fixtures" / "targets" / "tuple_cache"
SEQUENCE_FIRST_TARGET = ROOT / "tests" / "fixtures" / "targets" / "sequence_first"


def _load(folder: Path, name: str, file: str = "model.py"):
    """The folder's model file as module `name` (its sibling imports resolved from the folder)."""
    spec = importlib.util.spec_from_file_location(name, folder / file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    before = set(sys.modules)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
        # The siblings it imported (`cache`, `masks`) leave with it: another folder's files share those names. But
        # graphmode's helper module stays, as it does in a harness's process: Dynamo imports a traced function's
        # module by name, and the module is the same text in every folder.
        for sibling in set(sys.modules) - before - {HELPER_MODULE}:
            if Path(getattr(sys.modules[sibling], "__file__", None) or "/").parent == folder:
                sys.modules.pop(sibling)
    return module


def _pair(tmp_path: Path, folder: Path, options: Options, key: str):
    """(original module, adapted module, the adaptation) for the folder's model.py."""
    adapted_dir = tmp_path / "adapted"
    shutil.copytree(folder, adapted_dir, ignore=shutil.ignore_patterns("__pycache__"))
    adaptation = adapt_source((folder / "model.py").read_text(), "model.py", None, options)
    assert "split_decode" in adaptation.applied, adaptation.manual
    write_adapted(adapted_dir, {"model.py": adaptation.adapted})
    return _load(folder, f"original_{key}"), _load(adapted_dir, f"adapted_{key}"), adaptation


def _same_weights(original: torch.nn.Module, adapted: torch.nn.Module) -> None:
    adapted.load_state_dict(original.state_dict())
    assert set(dict(original.named_parameters())) == set(dict(adapted.named_parameters()))


def _hf_config(module, **overrides):
    return module.Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, **overrides)


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    original, adapted, adaptation = _pair(tmp_path_factory.mktemp("hf"), HF_EXAMPLE,
                                              Options(entry_class="ForCausalLM"), "hf")
    return original, adapted, adaptation


def _hf_models(hf_pair, **overrides):
    original_module, adapted_module, _ = hf_pair
    torch.manual_seed(0)
    original = original_module.ForCausalLM(_hf_config(original_module, **overrides)).eval()
    adapted = adapted_module.ForCausalLM(_hf_config(adapted_module, **overrides)).eval()
    _same_weights(original, adapted)
    return original, adapted


def _left_padded_batch():
    """Three prompts of 7, 5 and 3 tokens, left-padded to 7, and their 2-D mask."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 256, (3, 7), generator=generator)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, :2] = 0
    mask[2, :4] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_left_padded_batch_with_its_mask_gives_the_originals_logits(hf_pair, implementation):
    original, adapted = _hf_models(hf_pair, attn_implementation=implementation)
    ids, mask = _left_padded_batch()
    with torch.no_grad():
        expected = original(input_ids=ids, attention_mask=mask, use_cache=False).logits
        got = adapted(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert got.shape == expected.shape == (3, 7, 256)
    assert torch.equal(got, expected)


def test_the_callers_own_cache_carries_a_padded_batch_through_greedy_decode(hf_pair):
    original, adapted = _hf_models(hf_pair)
    ids, mask = _left_padded_batch()
    outputs = []
    with torch.no_grad():
        for model in (original, adapted):
            tokens, attention, past, steps = ids, mask, None, []
            out = model(input_ids=tokens, attention_mask=attention, use_cache=True)
            for _ in range(6):
                past = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                steps.append(token)
                attention = torch.cat([attention, torch.ones_like(token)], dim=1)
                out = model(input_ids=token, attention_mask=attention, past_key_values=past, use_cache=True)
            outputs.append((torch.cat(steps, dim=1), out.logits, past))
    (tokens_o, logits_o, past_o), (tokens_a, logits_a, past_a) = outputs
    assert torch.equal(tokens_a, tokens_o)
    assert torch.equal(logits_a, logits_o)
    # The caller gets its cache back as the original hands it: every layer, at the true length.
    assert [tuple(k.shape) for k, _ in past_a] == [tuple(k.shape) for k, _ in past_o] == [(3, 2, 12, 16)] * 2


def test_a_cache_reordered_between_steps_as_beam_search_does(hf_pair):
    original, adapted = _hf_models(hf_pair)
    ids, _ = _left_padded_batch()
    order = torch.tensor([2, 2, 0])  # beams 0 and 1 continue beam 2, beam 2 continues beam 0
    logits = []
    with torch.no_grad():
        for model in (original, adapted):
            out = model(input_ids=ids, use_cache=True)
            past = tuple((k[order], v[order]) for k, v in out.past_key_values)
            token = out.logits[:, -1].argmax(-1, keepdim=True)[order]
            logits.append(model(input_ids=token, past_key_values=past, use_cache=True).logits)
    assert torch.equal(logits[1], logits[0])


def test_the_entries_take_the_static_path_and_leave_every_other_call_as_it_was(hf_pair):
    original, adapted = _hf_models(hf_pair)
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        # The original's own loop, by position ids it counts from its cache.
        out = original(input_ids=prompt, use_cache=True)
        expected = [out.logits[:, -1]]
        token, past = out.logits[:, -1].argmax(-1, keepdim=True), out.past_key_values
        for _ in range(4):
            out = original(input_ids=token, past_key_values=past, use_cache=True)
            expected.append(out.logits[:, -1])
            token, past = out.logits[:, -1].argmax(-1, keepdim=True), out.past_key_values

        got = [adapted.prefill(prompt, torch.arange(8))[:, -1]]
        token = got[0].argmax(-1, keepdim=True)
        for step in range(4):
            got.append(adapted.decode(token, torch.tensor([8 + step]))[:, -1])
            token = got[-1].argmax(-1, keepdim=True)
        # Between and after the entries, a plain call runs the original path: it knows nothing of the static cache.
        between = adapted(input_ids=prompt, use_cache=False).logits
        expected_plain = original(input_ids=prompt, use_cache=False).logits
    assert [t.argmax(-1).item() for t in got] == [t.argmax(-1).item() for t in expected]
    assert max((g - e).abs().max().item() for g, e in zip(got, expected)) < 1e-4
    assert torch.equal(between, expected_plain)
    # The static cache holds what the entries wrote, and only the entries wrote it.
    assert adapted.model.layers[0].self_attn.kv_cache.k_cache[0, :, :13].abs().sum() > 0
    assert adapted.model.layers[0].self_attn.kv_cache.k_cache[0, :, 13:].abs().sum() == 0


def _static_bytes(model: torch.nn.Module) -> int:
    return sum(b.numel() for m in model.modules() if hasattr(m, "graphmode_resize") for b in m.buffers())


def _original_greedy(model, prompt, steps):
    """The original's own loop: positions counted from its cache; the logits of every step."""
    out = model(input_ids=prompt, use_cache=True)
    logits = [out.logits[:, -1]]
    for _ in range(steps):
        token = logits[-1].argmax(-1, keepdim=True)
        out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits[:, -1])
    return logits


def test_the_static_buffers_are_allocated_by_setup_caches_from_the_config_or_the_caller(hf_pair):
    original, adapted = _hf_models(hf_pair)
    assert _static_bytes(adapted) == 0  # a model used only through `forward` carries no static memory
    attention = adapted.model.layers[0].self_attn
    adapted.setup_caches()  # one sequence of what the config names (max_position_embeddings=64)
    assert attention.kv_cache.k_cache.shape == (1, 2, 64, 16)
    # The keys and values are all it holds: the causal mask's rows are computed from the positions.
    assert _static_bytes(adapted) == 2 * len(adapted.model.layers) * attention.kv_cache.k_cache.numel()
    with pytest.raises(ValueError, match=r"at most 64 positions \(config.max_position_embeddings\)"):
        adapted.setup_caches(max_seq_length=65)
    adapted.setup_caches(max_batch_size=2, max_seq_length=20)  # the caller's sizes, not the harness's
    assert attention.kv_cache.k_cache.shape == (2, 2, 20, 16)
    assert adapted.model.causal_mask.rows(torch.tensor([3])).shape == (1, 20)
    prompt = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = _original_greedy(original, prompt, 13)
        got = [adapted.prefill(prompt, torch.arange(6))[:, -1]]
        for step in range(13):  # up to the last of the 20 slots
            got.append(adapted.decode(got[-1].argmax(-1, keepdim=True), torch.tensor([6 + step]))[:, -1])
        with pytest.raises(ValueError, match=r"set up for 2 sequence\(s\) of 20 positions.*setup_caches\("):
            adapted.prefill(torch.zeros(3, 6, dtype=torch.long), torch.arange(6))
        with pytest.raises(ValueError, match=r"needs 2 of 21.*setup_caches\(max_batch_size=2, max_seq_length=21\)"):
            adapted.prefill(torch.zeros(2, 21, dtype=torch.long), torch.arange(21))
    assert [g.argmax(-1).tolist() for g in got] == [e.argmax(-1).tolist() for e in expected]
    assert max((g - e).abs().max().item() for g, e in zip(got, expected)) < 1e-4


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_left_padded_batch_on_the_static_path_gives_the_originals_tokens(hf_pair, implementation):
    """The rows share the slots, each has its own positions, and the padding mask hides the padded slots: the
    entries with Decode compiled give what the original's own loop gives for the same padded batch."""
    original, adapted = _hf_models(hf_pair, attn_implementation=implementation)
    ids, mask = _left_padded_batch()
    steps, length = 6, 16
    with torch.no_grad():
        expected, attention = [], mask
        out = original(input_ids=ids, attention_mask=attention, use_cache=True)
        expected.append(out.logits[:, -1])
        for _ in range(steps):
            token = expected[-1].argmax(-1, keepdim=True)
            attention = torch.cat([attention, torch.ones_like(token)], dim=1)
            out = original(input_ids=token, attention_mask=attention, past_key_values=out.past_key_values,
                           use_cache=True)
            expected.append(out.logits[:, -1])

        adapted.setup_caches(max_batch_size=3, max_seq_length=length)
        padding = torch.ones(3, length, dtype=torch.long)  # at the full length: one shape for every step
        padding[:, : mask.shape[1]] = mask
        decode = torch.compile(adapted.decode, backend="eager", fullgraph=True, dynamic=False)
        got = [adapted.prefill(ids, torch.arange(7), attention_mask=padding)[:, -1]]
        for step in range(steps):
            token = got[-1].argmax(-1, keepdim=True)
            got.append(decode(token, torch.tensor([7 + step]), attention_mask=padding)[:, -1])
        unmasked = adapted.prefill(ids, torch.arange(7))[:, -1]  # the same rows read as if nothing were padded
    assert not torch.allclose(unmasked[1:], expected[0][1:], atol=1e-3)  # so the mask is what keeps them equal
    assert [g.argmax(-1).tolist() for g in got] == [e.argmax(-1).tolist() for e in expected]
    assert max((g - e).abs().max().item() for g, e in zip(got, expected)) < 1e-4


def test_the_static_rows_reorder_as_beam_search_reorders_the_originals_cache(hf_pair):
    original, adapted = _hf_models(hf_pair)
    prompt = torch.randint(1, 256, (3, 6), generator=torch.Generator().manual_seed(6))
    order = torch.tensor([2, 2, 0])  # beams 0 and 1 continue beam 2, beam 2 continues beam 0
    switch = hf_pair[1].GraphmodeStaticPath
    with torch.no_grad():
        out = original(input_ids=prompt, use_cache=True)
        past = tuple((k[order], v[order]) for k, v in out.past_key_values)
        token = out.logits[:, -1].argmax(-1, keepdim=True)[order]
        expected = original(input_ids=token, past_key_values=past, use_cache=True).logits[:, -1]

        adapted.setup_caches(max_batch_size=3, max_seq_length=16)
        first = adapted.prefill(prompt, torch.arange(6))[:, -1]
        switch.reorder(adapted, order)
        got = adapted.decode(first.argmax(-1, keepdim=True)[order], torch.tensor([6]))[:, -1]
        switch.restore(adapted, switch.hold(adapted))  # held and given back in place: nothing changes
        again = adapted.decode(first.argmax(-1, keepdim=True)[order], torch.tensor([6]))[:, -1]
        adapted.prefill(prompt, torch.arange(6))
        unordered = adapted.decode(first.argmax(-1, keepdim=True)[order], torch.tensor([6]))[:, -1]
    assert torch.allclose(got, expected, atol=1e-5) and torch.equal(again, got)
    assert not torch.allclose(unordered, expected, atol=1e-3)  # without the reorder, the rows read other prompts


def test_a_first_prefill_without_setup_caches_sizes_the_static_path_itself(hf_pair):
    original, adapted = _hf_models(hf_pair)
    prompt = torch.randint(0, 256, (3, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = adapted.prefill(prompt, torch.arange(5))[:, -1]
        expected = original(input_ids=prompt, use_cache=False).logits[:, -1]
    assert adapted.model.layers[1].self_attn.kv_cache.k_cache.shape == (3, 2, 64, 16)  # this batch, the config's 64
    assert torch.allclose(got, expected, atol=1e-5)


def test_the_file_keeps_every_original_function_and_asks_the_switch_first(hf_pair):
    _, _, adaptation = hf_pair
    text = adaptation.adapted
    # The attention forks in place: the original `if` after the static statements, as `elif`, no twin.
    assert "if graphmode_static_path(self):" in text and "elif past_key_value is not None:" in text
    assert "def forward_static(" not in text
    # The library helpers the original builds its masks with, and the cache object's length, are still used by it.
    assert "_prepare_4d_causal_attention_mask_for_sdpa(" in text and "get_usable_length(" in text
    # The static path builds no mask per call: it reads rows of the buffer.
    assert "_prepare_4d_causal_attention_mask_for_sdpa(" not in adaptation.static_view
    # It imports nothing of graphmode's but its helper module, written beside it.
    imports = [line for line in text.splitlines() if line.startswith(("import", "from")) and "graphmode" in line]
    assert len(imports) == 1 and imports[0].startswith("from graphmode_static import ("), imports


@pytest.fixture(scope="module")
def legacy_pair(tmp_path_factory):
    return _pair(tmp_path_factory.mktemp("legacy"), LEGACY_EXAMPLE, Options(entry_class="Transformer"), "legacy")


def _legacy_models(legacy_pair):
    original_module, adapted_module, _ = legacy_pair
    args = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, hidden_dim=128, max_seq_len=64)
    torch.manual_seed(0)
    original = original_module.Transformer(original_module.ModelArgs(**args)).eval()
    adapted = adapted_module.Transformer(adapted_module.ModelArgs(**args)).eval()
    _same_weights(original, adapted)
    return original, adapted


def test_int_positions_and_a_batch_of_three_keep_working_in_the_legacy_example(legacy_pair):
    original, adapted = _legacy_models(legacy_pair)
    prompt = torch.randint(0, 256, (3, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        results = []
        for model in (original, adapted):
            logits, past = model(prompt, 0)
            token = logits[:, -1].argmax(-1, keepdim=True)
            logits, past = model(token, 6, past_key_values=past)  # a Python int position, as its own loop passes
            results.append((logits, [tuple(k.shape) for k, _ in past]))
    assert torch.equal(results[1][0], results[0][0])
    assert results[1][1] == results[0][1]


@pytest.fixture(scope="module")
def tuple_pair(tmp_path_factory):
    # What the traced run sees there: keys and values grown along dim 1 (the sequence) at model.py:45-46.
    options = Options(entry_class="TupleCacheLM", traced=True,
                      evidence_caches=(("model.py", 45, 1), ("model.py", 46, 1)))
    return _pair(tmp_path_factory.mktemp("tuple"), TUPLE_TARGET, options, "tuple")


def test_a_tuple_cache_model_keeps_its_batch_and_its_cache_lengths(tuple_pair):
    original_module, adapted_module, adaptation = tuple_pair
    assert "carried_cache" in adaptation.applied
    torch.manual_seed(0)
    original = original_module.TupleCacheLM(original_module.Config()).eval()
    adapted = adapted_module.TupleCacheLM(adapted_module.Config()).eval()
    _same_weights(original, adapted)
    prompt = torch.randint(0, 256, (3, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        results = []
        for model in (original, adapted):
            logits, past = model(input_ids=prompt, use_cache=True)
            token = logits[:, -1].argmax(-1, keepdim=True)
            out = model(input_ids=token, past_key_values=past, use_cache=True)
            results.append((out[0], [tuple(t.shape) for layer in out[1] for t in layer]))
    assert torch.equal(results[1][0], results[0][0])
    assert results[1][1] == results[0][1]


@pytest.fixture(scope="module")
def sequence_first_pair(tmp_path_factory):
    # What the traced run sees there: keys and values grown along dim 0 (sequence first) at model.py:54-55, in the
    # `else` of a flag of the module, and read by the SDPA at model.py:29, which gets no mask for one new token.
    options = Options(entry_class="SequenceFirstLM", traced=True,
                      evidence_caches=(("model.py", 54, 0), ("model.py", 55, 0)),
                      cache_reads=(("model.py", 29, "scaled_dot_product_attention", "reads"),))
    return _pair(tmp_path_factory.mktemp("sequence_first"), SEQUENCE_FIRST_TARGET, options, "sequence_first")


def _sequence_first_models(pair):
    original_module, adapted_module, _ = pair
    models = []
    for module in (original_module, adapted_module):
        torch.manual_seed(0)
        models.append(module.SequenceFirstLM(module.Config()).eval())
    _same_weights(*models)
    with torch.no_grad():  # a rotary-like table far from ones, so a wrong position shows in the logits
        models[0].rotary_table.uniform_(0.5, 1.5)
        models[1].rotary_table.copy_(models[0].rotary_table)
    return models


def _own_loop(model, prompt, steps):
    """The model's own generate loop: the cache in and out of `forward`."""
    tokens = []
    with torch.no_grad():
        logits, cache = model(input_ids=prompt, use_cache=True)
        for _ in range(steps):
            token = logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
            logits, cache = model(input_ids=token, past_key_values=cache, use_cache=True)
    return torch.cat(tokens, dim=1), logits, [tuple(t.shape) for layer in cache for t in layer]


def test_a_sequence_first_cache_read_with_no_mask_in_decode_verifies_and_stays_a_drop_in(sequence_first_pair):
    adaptation = sequence_first_pair[2]
    assert "carried_cache" in adaptation.applied and not adaptation.manual
    assert "StaticKVBuffers(seq_dim=0)" in adaptation.adapted and "graphmode_slot_mask(self" in adaptation.adapted
    assert "`self.quantized_cache` settled false" in adaptation.adapted
    original, adapted = _sequence_first_models(sequence_first_pair)
    prompt = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(4))
    # Every call outside the entries runs the original code: a batch of 2 through the model's own loop.
    expected = _own_loop(original, prompt, 6)
    got = _own_loop(adapted, prompt, 6)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]) and got[2] == expected[2]
    # The entries: the static buffers, read whole by a compiled Decode, with no mask of the model's in Decode.
    single = prompt[:1]
    want_tokens, want_logits, _ = _own_loop(original, single, 6)
    with torch.no_grad():
        adapted.setup_caches(max_batch_size=1, max_seq_length=32)
        logits, _ = adapted.prefill(single, torch.arange(single.shape[1]))  # Prefill gives what `forward` gives
        decode = torch.compile(adapted.decode, backend="aot_eager", fullgraph=True)
        tokens = []
        for step in range(6):
            token = logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
            logits = decode(token, torch.tensor([single.shape[1] + step]))  # Decode, the logits alone
    assert torch.equal(torch.cat(tokens, dim=1), want_tokens)
    torch.testing.assert_close(logits[:, -1], want_logits[:, -1])
