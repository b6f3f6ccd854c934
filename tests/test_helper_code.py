"""The helper code the codemods copy into adapted files (transforms/codemods/helper-code/helpers.py), run on small
tensors with real torch: the caches write keys and values at a position tensor and hand back what attention reads,
and the masks hide every slot not written yet. The file is loaded by path, as graphmode never imports it."""
from __future__ import annotations

import importlib.util
import inspect
import pkgutil
import sys
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

import graphmode.transforms
from graphmode.transforms.codemods._helper_code import HELPER_CODE, helper_names, helper_source
from graphmode.transforms.codemods._new_positions import KEY_SLOTS
from graphmode.transforms.codemods.base import MAX_SEQ_LEN_CONSTANT
from graphmode.transforms.codemods.cache_object import MASK_BUILDER, WRITTEN_SLOTS
from graphmode.transforms.codemods.carried_cache import BUFFERS_CLASS, MASK_ROWS
from graphmode.transforms.codemods.static_kv_cache import CACHE_CLASS

INSERTED = (CACHE_CLASS, BUFFERS_CLASS, MASK_BUILDER, WRITTEN_SLOTS, MASK_ROWS, KEY_SLOTS)


def _load() -> ModuleType:
    # Registered in sys.modules so that `inspect.getsource` finds the file of the classes too.
    name = "graphmode_test_helper_code"
    spec = importlib.util.spec_from_file_location(name, HELPER_CODE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


helpers = _load()


def _compiled(fn):
    """`fn` traced by Dynamo (`torch.compiler.is_compiling()` is True inside), run without Inductor."""
    return torch.compile(fn, backend="eager", fullgraph=True)


# -- what the codemods insert is the code tested here -------------------------------------------------------
@pytest.mark.parametrize("name", INSERTED)
def test_each_inserted_helper_is_the_definition_in_the_file(name):
    assert name in helper_names()
    assert helper_source(name) == inspect.getsource(getattr(helpers, name))


def test_the_file_defines_the_size_constant_the_helpers_read():
    assert isinstance(getattr(helpers, MAX_SEQ_LEN_CONSTANT), int)


def test_no_graphmode_module_is_the_helper_file():
    """It imports torch: the package walk `graphmode scan`'s import check makes must not reach it."""
    walked = pkgutil.walk_packages(graphmode.transforms.__path__, "graphmode.transforms.")
    assert not any(info.name.rsplit(".", 1)[-1] == HELPER_CODE.stem for info in walked)


# -- StaticKVCache: buffers sized by head count and head size, written in place -----------------------------
@pytest.mark.parametrize("seq_dim", [1, 2])
def test_static_kv_cache_writes_at_the_positions_and_hands_back_the_whole_buffers(seq_dim):
    batch, heads, max_len, head_dim, prompt = 2, 3, 8, 4, 3
    cache = helpers.StaticKVCache(batch, heads, max_len, head_dim, seq_dim=seq_dim)

    def new(tokens):
        shape = [batch, heads, head_dim]
        shape.insert(seq_dim, tokens)
        return torch.randn(shape)

    k, v = new(prompt), new(prompt)
    k_out, v_out = cache.update(torch.arange(prompt), k, v)
    assert k_out is cache.k_cache and v_out is cache.v_cache  # the buffers, not views of them
    assert k_out.shape[seq_dim] == max_len
    assert torch.equal(k_out.narrow(seq_dim, 0, prompt), k) and torch.equal(v_out.narrow(seq_dim, 0, prompt), v)
    assert not k_out.narrow(seq_dim, prompt, max_len - prompt).any()  # unwritten slots hold zeros
    k1, v1 = new(1), new(1)
    k_out, v_out = cache.update(torch.tensor([prompt]), k1, v1)
    assert torch.equal(k_out.narrow(seq_dim, prompt, 1), k1) and torch.equal(v_out.narrow(seq_dim, prompt, 1), v1)
    assert torch.equal(k_out.narrow(seq_dim, 0, prompt), k)  # earlier slots are left as written


def test_static_kv_cache_hands_fewer_sequences_the_rows_they_wrote():
    cache = helpers.StaticKVCache(4, 2, 6, 3)
    k = torch.randn(1, 2, 2, 3)
    k_out, v_out = cache.update(torch.arange(2), k, k + 1)
    assert k_out.shape == (1, 2, 6, 3) and k_out.data_ptr() == cache.k_cache.data_ptr()
    assert torch.equal(cache.k_cache[:1, :, :2], k) and not cache.k_cache[1:].any()


# -- StaticKVBuffers: shaped by the first write, in any layout --------------------------------------------
def test_static_kv_buffers_take_the_first_writes_layout_and_hand_eager_callers_the_written_slots():
    max_batch, max_len, prompt = 2, 10, 4
    buffers = helpers.StaticKVBuffers(max_batch, max_len, seq_dim=2, value_seq_dim=1)
    assert buffers.k_cache is None  # nothing is allocated before the first write
    # Bloom's layout: keys (batch * heads, head_dim, length), values (batch * heads, length, head_dim).
    k, v = torch.randn(6, 5, prompt), torch.randn(6, prompt, 5)
    k_out, v_out = buffers.update(torch.arange(prompt), k, v)
    assert buffers.k_cache.shape == (6, 5, max_len) and buffers.v_cache.shape == (6, max_len, 5)
    assert torch.equal(k_out, k) and torch.equal(v_out, v)  # eager: the written slots only
    k1, v1 = torch.randn(6, 5, 1), torch.randn(6, 1, 5)
    k_out, v_out = buffers.update(torch.tensor([prompt]), k1, v1)
    assert torch.equal(k_out, torch.cat([k, k1], dim=2)) and torch.equal(v_out, torch.cat([v, v1], dim=1))
    assert not buffers.k_cache[..., prompt + 1 :].any()


def test_static_kv_buffers_hold_max_batch_rows_when_the_first_write_has_fewer():
    buffers = helpers.StaticKVBuffers(3, 7, seq_dim=1)
    k = torch.randn(1, 2, 4)
    k_out, _ = buffers.update(torch.arange(2), k, k)
    assert buffers.k_cache.shape == (3, 7, 4) and torch.equal(k_out, k)


def test_static_kv_buffers_hand_a_compiled_graph_every_slot():
    buffers = helpers.StaticKVBuffers(1, 6, seq_dim=2)
    buffers.update(torch.arange(2), torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))  # Prefill, eager
    k1 = torch.randn(1, 2, 1, 4)
    k_out, _ = _compiled(buffers.update)(torch.tensor([2]), k1, k1)
    assert k_out.shape == buffers.k_cache.shape and torch.equal(k_out[:, :, 2:3], k1)


# -- the masks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [None, 1, 3])
def test_causal_mask_shows_each_row_its_own_and_earlier_positions(window):
    size = 7
    mask = helpers.graphmode_causal_mask(size, sliding_window=window)
    rows, columns = torch.arange(size)[:, None], torch.arange(size)[None, :]
    visible = (columns <= rows) & ((columns > rows - window) if window is not None else True)
    assert mask.shape == (size, size) and mask.dtype == torch.float32
    assert torch.equal(mask == 0, visible)
    assert (mask[~visible] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize("default", [torch.float16, torch.bfloat16])
def test_causal_mask_builds_under_a_half_precision_default(default):
    # transformers builds a model under torch_dtype=float16 by switching the default dtype: a mask that took the
    # default would overflow on the float32 minimum and fail the model's construction (transformers 4.48's own
    # test_eager_matches_sdpa_inference did).
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        mask = helpers.graphmode_causal_mask(5)
    finally:
        torch.set_default_dtype(before)
    assert mask.dtype == torch.float32 and torch.equal(mask, helpers.graphmode_causal_mask(5))


def test_mask_rows_hide_the_slots_not_written_yet():
    size, batch = 8, 2
    causal = helpers.graphmode_causal_mask(size)
    positions = torch.tensor([[3, 4, 5]]).expand(batch, -1)
    rows = helpers.graphmode_mask_rows(causal, positions)
    last = int(positions.max())
    assert rows.shape == (batch, 1, positions.shape[1], last + 1)  # eager: as many columns as slots written
    for token, position in enumerate(positions[0].tolist()):
        assert torch.equal(rows[:, 0, token] == 0, (torch.arange(last + 1) <= position).expand(batch, -1))
    compiled = _compiled(helpers.graphmode_mask_rows)(causal, positions)
    assert compiled.shape == (batch, 1, positions.shape[1], size)  # compiled: every slot of the buffers
    assert (compiled[..., last + 1 :] == torch.finfo(torch.float32).min).all()


def test_written_slots_are_views_of_the_buffers_in_eager_calls_and_the_buffers_when_compiled():
    k, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
    positions = torch.tensor([5])
    k_out, v_out = helpers.graphmode_written(k, v, positions)
    assert k_out.shape[2] == int(positions[-1]) + 1 and k_out.data_ptr() == k.data_ptr()
    assert torch.equal(v_out, v[:, :, : int(positions[-1]) + 1])
    k_all, v_all = _compiled(helpers.graphmode_written)(k, v, positions)
    assert torch.equal(k_all, k) and torch.equal(v_all, v)


def test_key_slots_count_the_written_slots_eagerly_and_every_slot_when_compiled():
    positions = torch.tensor([[4, 5, 6]])
    assert helpers.graphmode_key_slots(positions) == int(positions.max()) + 1
    compiled = _compiled(lambda p: torch.ones(helpers.graphmode_key_slots(p)))(positions)
    assert compiled.shape == (getattr(helpers, MAX_SEQ_LEN_CONSTANT),)


# -- together: attention over the whole static cache is attention over the written keys -------------------------
def test_attention_over_the_static_cache_and_its_mask_rows_matches_attention_over_a_growing_cache():
    torch.manual_seed(0)
    batch, heads, head_dim, max_len, prompt = 1, 2, 8, 12, 5
    cache = helpers.StaticKVCache(batch, heads, max_len, head_dim)
    causal = helpers.graphmode_causal_mask(max_len)
    grown_k = grown_v = None
    for step, tokens in enumerate([prompt, 1, 1]):
        start = prompt + step - 1 if step else 0
        positions = torch.arange(start, start + tokens)
        q, k, v = (torch.randn(batch, heads, tokens, head_dim) for _ in range(3))
        k_all, v_all = cache.update(positions, k, v)
        static = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=causal[positions][None, None])
        grown_k = k if grown_k is None else torch.cat([grown_k, k], dim=2)
        grown_v = v if grown_v is None else torch.cat([grown_v, v], dim=2)
        grown = F.scaled_dot_product_attention(q, grown_k, grown_v, attn_mask=causal[positions][:, : start + tokens])
        torch.testing.assert_close(static, grown)
