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
from graphmode.transforms.codemods.caches.absorbed_mla import ABSORBED_ATTENTION, LATENT_CACHE
from graphmode.transforms.codemods.caches.cache_object import WRITTEN_SLOTS
from graphmode.transforms.codemods.caches.carried_cache import MASK_ROWS
from graphmode.transforms.codemods.entries.split_decode import FITS, STATIC_PATH
from graphmode.transforms.codemods.fusions.merged_projections import HELPER as MERGED_LINEAR, STACKER
from graphmode.transforms.codemods.lib.helper_code import HELPER_CODE, helper_names, helper_source
from graphmode.transforms.codemods.lib.helper_names import (BUFFERS_CLASS, CACHE_CLASS, MASK_BUILDER, MASK_CLASS,
                                                            WRITE_BUFFER)
from graphmode.transforms.codemods.lib.new_positions import KEY_SLOTS
from graphmode.transforms.codemods.lib.slot_masks import HIDE_UNWRITTEN, SLOT_MASK, VISIBLE_SLOTS

INSERTED = (CACHE_CLASS, BUFFERS_CLASS, MASK_BUILDER, MASK_CLASS, WRITTEN_SLOTS, MASK_ROWS, KEY_SLOTS, FITS,
            STATIC_PATH, VISIBLE_SLOTS, HIDE_UNWRITTEN, SLOT_MASK, MERGED_LINEAR, STACKER, LATENT_CACHE,
            ABSORBED_ATTENTION, WRITE_BUFFER)


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


def test_no_graphmode_module_is_the_helper_file():
    """It imports torch: the package walk `graphmode scan`'s import check makes must not reach it."""
    walked = pkgutil.walk_packages(graphmode.transforms.__path__, "graphmode.transforms.")
    assert not any(info.name.rsplit(".", 1)[-1] == HELPER_CODE.stem for info in walked)


# -- graphmode_write_buffer: a recomputed buffer keeps its memory --------------------------------------------
def test_a_buffer_written_every_step_keeps_its_address_from_its_first_value_on():
    rotary = torch.nn.Module()
    rotary.register_buffer("inv_freq", None, persistent=False)
    helpers.graphmode_write_buffer(rotary, "inv_freq", torch.ones(4))  # the first value is bound
    first = rotary.inv_freq.data_ptr()
    compiled = _compiled(lambda factors: helpers.graphmode_write_buffer(rotary, "inv_freq", 1.0 / factors))
    for scale in (2.0, 4.0):
        compiled(torch.full((4,), scale))
        assert rotary.inv_freq.data_ptr() == first and torch.equal(rotary.inv_freq, torch.full((4,), 1 / scale))
    assert list(dict(rotary.named_buffers())) == ["inv_freq"]  # still a buffer
    # A move to where it already is (CTRL's `self.pos_encoding = self.pos_encoding.to(...)`) leaves it in place.
    compiled_move = _compiled(lambda: helpers.graphmode_write_buffer(rotary, "inv_freq", rotary.inv_freq.to("cpu")))
    compiled_move()
    assert rotary.inv_freq.data_ptr() == first and torch.equal(rotary.inv_freq, torch.full((4,), 1 / 4.0))
    # A value of another shape or dtype is bound, as the model's own assignment did.
    helpers.graphmode_write_buffer(rotary, "inv_freq", torch.arange(3))
    assert rotary.inv_freq.dtype == torch.int64 and rotary.inv_freq.shape == (3,)


# -- StaticKVCache: buffers sized by head count and head size, written in place -----------------------------
@pytest.mark.parametrize("seq_dim", [1, 2])
def test_static_kv_cache_writes_at_the_positions_and_hands_back_the_whole_buffers(seq_dim):
    batch, heads, max_len, head_dim, prompt = 2, 3, 8, 4, 3
    cache = helpers.StaticKVCache(heads, head_dim, seq_dim=seq_dim)
    assert cache.k_cache.numel() == 0  # nothing is allocated before setup_caches resizes it
    cache.graphmode_resize(batch, max_len)

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
    cache = helpers.StaticKVCache(2, 3)
    cache.graphmode_resize(4, 6)
    k = torch.randn(1, 2, 2, 3)
    k_out, v_out = cache.update(torch.arange(2), k, k + 1)
    assert k_out.shape == (1, 2, 6, 3) and k_out.data_ptr() == cache.k_cache.data_ptr()
    assert torch.equal(cache.k_cache[:1, :, :2], k) and not cache.k_cache[1:].any()


def test_static_kv_cache_without_sizes_takes_each_tensors_shape_and_dtype_from_its_first_write():
    """MLA's latent ([batch, length, rank], growing along 1) and rope key ([batch, 1, length, rope dim], along 2)
    through one cache: each buffer has the shape and dtype written, with the slots along its own dim."""
    max_batch, max_len, prompt = 2, 8, 3
    cache = helpers.StaticKVCache(seq_dim=1, value_seq_dim=2)
    cache.graphmode_resize(max_batch, max_len)
    assert cache.k_cache is None and cache.v_cache is None  # allocated by the first write, not before
    latent, rope = torch.randn(1, prompt, 5, dtype=torch.float64), torch.randn(1, 1, prompt, 2)
    k_out, v_out = cache.update(torch.arange(prompt), latent, rope)
    assert (k_out.shape, k_out.dtype, v_out.shape, v_out.dtype) == ((1, max_len, 5), torch.float64,
                                                                    (1, 1, max_len, 2), torch.float32)
    assert (cache.k_cache.shape[0], cache.v_cache.shape[0]) == (max_batch, max_batch)  # room for every sequence
    assert torch.equal(k_out[:, :prompt], latent) and torch.equal(v_out[:, :, :prompt], rope)
    assert not k_out[:, prompt:].any() and not v_out[:, :, prompt:].any()
    step_latent, step_rope = torch.randn(1, 1, 5, dtype=torch.float64), torch.randn(1, 1, 1, 2)
    k_out, v_out = cache.update(torch.tensor([prompt]), step_latent, step_rope)
    assert torch.equal(k_out[:, prompt : prompt + 1], step_latent) and torch.equal(v_out[:, :, prompt:prompt + 1],
                                                                                    step_rope)
    cache.graphmode_resize(max_batch, max_len)  # a fresh conversation: shaped again by its first write
    assert cache.k_cache is None


# -- StaticKVBuffers: shaped by the first write, in any layout --------------------------------------------
def test_static_kv_buffers_take_the_first_writes_layout_and_hand_eager_callers_the_written_slots():
    max_batch, max_len, prompt = 2, 10, 4
    buffers = helpers.StaticKVBuffers(seq_dim=2, value_seq_dim=1)
    buffers.graphmode_resize(max_batch, max_len)
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
    buffers = helpers.StaticKVBuffers(seq_dim=1)
    buffers.graphmode_resize(3, 7)
    k = torch.randn(1, 2, 4)
    k_out, _ = buffers.update(torch.arange(2), k, k)
    assert buffers.k_cache.shape == (3, 7, 4) and torch.equal(k_out, k)


def test_static_kv_buffers_write_a_sequence_first_cache_along_dim_0_and_keep_its_batch_on_dim_1():
    # GLM's layout: [seq, batch, heads, head_dim], grown along dim 0.
    buffers = helpers.StaticKVBuffers(seq_dim=0)
    buffers.graphmode_resize(3, 9)
    k, v = torch.randn(4, 2, 2, 5), torch.randn(4, 2, 2, 5)
    k_out, v_out = buffers.update(torch.arange(4), k, v)
    assert buffers.k_cache.shape == (9, 3, 2, 5)  # 9 slots, room for 3 sequences
    assert torch.equal(k_out, k) and torch.equal(v_out, v)  # the 2 sequences written, at the 4 slots written
    k1 = torch.randn(1, 2, 2, 5)
    k_out, _ = buffers.update(torch.tensor([4]), k1, k1)
    assert torch.equal(k_out, torch.cat([k, k1], dim=0))
    assert not buffers.k_cache[5:].any() and not buffers.k_cache[:, 2:].any()


def test_static_kv_buffers_hand_a_compiled_graph_every_slot():
    buffers = helpers.StaticKVBuffers(seq_dim=2)
    buffers.graphmode_resize(1, 6)
    buffers.update(torch.arange(2), torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))  # Prefill, eager
    k1 = torch.randn(1, 2, 1, 4)
    k_out, _ = _compiled(buffers.update)(torch.tensor([2]), k1, k1)
    assert k_out.shape == buffers.k_cache.shape and torch.equal(k_out[:, :, 2:3], k1)


# -- the masks ---------------------------------------------------------------------------------------------
def _square(size, window=None, diagonal=0):
    """The square causal mask the rows stand for, built the way models build it: True where visible."""
    visible = torch.ones(size, size, dtype=torch.bool).tril(diagonal)
    return visible if window is None else visible.triu(diagonal + 1 - window)


@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("diagonal", [0, 1, -1])
def test_causal_rows_are_the_rows_of_the_square_mask_at_the_positions(window, diagonal):
    size = 7
    module = _Attention(None, max_seq_len=size)
    positions = torch.tensor([[0, 3, 6], [2, 2, 5]])
    rows = helpers.graphmode_causal_rows(module, positions, diagonal, window)
    assert rows.shape == (2, 3, size) and rows.dtype == torch.bool
    assert torch.equal(rows, _square(size, window, diagonal)[positions])
    shorter = helpers.graphmode_causal_rows(module, positions, diagonal, window, length=4)
    assert torch.equal(shorter, rows[..., :4])


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min])
@pytest.mark.parametrize("diagonal", [1, 2])
def test_filled_rows_are_the_rows_of_full_and_triu(fill, diagonal):
    size = 6
    module = _Attention(None, max_seq_len=size)
    positions = torch.arange(size)
    for dtype in (None, torch.float64):
        expected = torch.full((size, size), fill, dtype=dtype).triu(diagonal)[positions]
        rows = helpers.graphmode_filled_rows(module, positions, fill, diagonal, dtype)
        assert rows.dtype == expected.dtype and torch.equal(rows, expected)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_causal_mask_rows_are_additive_rows_of_each_position_and_the_earlier_ones(window):
    size = 7
    mask = helpers.GraphmodeCausalMask(sliding_window=window)
    helpers.GraphmodeStaticPath.setup(_Holder(mask), 1, size)
    rows = mask.rows(torch.arange(size))
    assert rows.shape == (size, size) and rows.dtype == torch.float32
    assert torch.equal(rows == 0, _square(size, window))
    assert (rows[~_square(size, window)] == torch.finfo(torch.float32).min).all()
    assert not list(mask.buffers()), "the rows are computed: no square mask is held"


@pytest.mark.parametrize("default", [torch.float16, torch.bfloat16])
def test_causal_mask_rows_are_float32_under_a_half_precision_default(default):
    # transformers builds a model under torch_dtype=float16 by switching the default dtype: rows that took the
    # default would overflow on the float32 minimum (transformers 4.48's own test_eager_matches_sdpa_inference
    # failed that way on a mask built in the default dtype).
    mask = helpers.GraphmodeCausalMask()
    helpers.GraphmodeStaticPath.setup(_Holder(mask), 1, 5)
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        rows = mask.rows(torch.arange(5))
    finally:
        torch.set_default_dtype(before)
    assert rows.dtype == torch.float32 and torch.equal(rows, mask.rows(torch.arange(5)))


def test_mask_rows_hide_the_slots_not_written_yet():
    size, batch = 8, 2
    causal = helpers.GraphmodeCausalMask()
    helpers.GraphmodeStaticPath.setup(_Holder(causal), batch, size)
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
    model = torch.nn.Linear(2, 2)
    helpers.GraphmodeStaticPath.setup(model, 1, 9)
    positions = torch.tensor([[4, 5, 6]])
    assert helpers.graphmode_key_slots(model, positions) == int(positions.max()) + 1
    compiled = _compiled(lambda p: torch.ones(helpers.graphmode_key_slots(model, p)))(positions)
    assert compiled.shape == (9,)


# -- together: attention over the whole static cache is attention over the written keys -------------------------
def test_attention_over_the_static_cache_and_its_mask_rows_matches_attention_over_a_growing_cache():
    torch.manual_seed(0)
    batch, heads, head_dim, max_len, prompt = 1, 2, 8, 12, 5
    cache = helpers.StaticKVCache(heads, head_dim)
    cache.graphmode_resize(batch, max_len)
    causal = helpers.GraphmodeCausalMask()
    helpers.GraphmodeStaticPath.setup(_Holder(causal), batch, max_len)
    grown_k = grown_v = None
    for step, tokens in enumerate([prompt, 1, 1]):
        start = prompt + step - 1 if step else 0
        positions = torch.arange(start, start + tokens)
        q, k, v = (torch.randn(batch, heads, tokens, head_dim) for _ in range(3))
        k_all, v_all = cache.update(positions, k, v)
        static = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=causal.rows(positions)[None, None])
        grown_k = k if grown_k is None else torch.cat([grown_k, k], dim=2)
        grown_v = v if grown_v is None else torch.cat([grown_v, v], dim=2)
        grown = F.scaled_dot_product_attention(q, grown_k, grown_v,
                                               attn_mask=causal.rows(positions, start + tokens))
        torch.testing.assert_close(static, grown)


# -- MLA: attention over the cached latent with kv_b_proj absorbed is attention over the expanded keys and values ---
def _expanded_attention(kv_b_proj, q_nope, q_pe, latent, k_pe, mask, scaling):
    """What transformers' DeepSeek-V2 computes: the latent expanded per head through kv_b_proj, then attention."""
    batch, heads, _, nope = q_nope.shape
    kv = kv_b_proj(latent[:, 0]).view(batch, latent.shape[2], heads, -1).transpose(1, 2)
    k_nope, values = kv[..., :nope], kv[..., nope:]
    keys = torch.cat([k_nope, k_pe.expand(-1, heads, -1, -1)], dim=-1)
    scores = torch.cat([q_nope, q_pe], dim=-1) @ keys.transpose(2, 3) * scaling + mask
    return (torch.softmax(scores, dim=-1) @ values).transpose(1, 2)


@pytest.mark.parametrize("bias", [False, True])
def test_absorbed_mla_attention_over_the_latent_is_attention_over_the_expanded_keys_and_values(bias):
    torch.manual_seed(0)
    batch, heads, nope, rope, v_dim, rank, slots, tokens = 2, 3, 6, 4, 5, 8, 7, 2
    kv_b_proj = torch.nn.Linear(rank, heads * (nope + v_dim), bias=bias)
    q_nope, q_pe = torch.randn(batch, heads, tokens, nope), torch.randn(batch, heads, tokens, rope)
    latent, k_pe = torch.randn(batch, 1, slots, rank), torch.randn(batch, 1, slots, rope)
    visible = torch.rand(batch, 1, tokens, slots) > 0.3
    visible[..., 0] = True  # every token sees a slot
    additive = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    expected = _expanded_attention(kv_b_proj, q_nope, q_pe, latent, k_pe, additive, 0.3)
    with torch.no_grad():
        for mask in (additive, visible):  # additive rows, or True where visible
            output, weights = helpers.graphmode_absorbed_mla(kv_b_proj, q_nope, q_pe, latent, k_pe, mask, 0.3)
            assert weights is None and output.shape == (batch, tokens, heads, v_dim)
            torch.testing.assert_close(output, expected)


def test_static_latent_cache_holds_the_latent_and_the_rope_key_one_row_per_token():
    cache = helpers.StaticLatentCache(8, 4)
    cache.graphmode_resize(2, 10, like=torch.zeros((), dtype=torch.bfloat16))
    assert (cache.k_cache.shape, cache.v_cache.shape) == ((2, 1, 10, 8), (2, 1, 10, 4))
    assert cache.k_cache.dtype == cache.v_cache.dtype == torch.bfloat16
    latent, rope = torch.randn(2, 1, 3, 8, dtype=torch.bfloat16), torch.randn(2, 1, 3, 4, dtype=torch.bfloat16)
    held_latent, held_rope = cache.update(torch.tensor([4, 5, 6]), latent, rope)
    assert torch.equal(held_latent[:, :, 4:7], latent) and torch.equal(held_rope[:, :, 4:7], rope)
    assert not held_latent[:, :, :4].any() and not held_rope[:, :, 7:].any()


class _Attention(torch.nn.Module):
    """Stands for a module on the static path: `graphmode_static_state` holds the slots the entries write."""

    def __init__(self, slots, padding=None, max_seq_len=0):
        super().__init__()
        self.graphmode_static_state = {"slots": slots, "padding": padding, "max_seq_len": max_seq_len}


class _Holder(torch.nn.Module):
    """A model holding one module of graphmode's, to size it with `GraphmodeStaticPath.setup`."""

    def __init__(self, part):
        super().__init__()
        self.part = part


def test_visible_slots_hide_every_slot_after_each_tokens_own_and_the_padding():
    module = _Attention(torch.tensor([2, 3]))
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(helpers.graphmode_visible_slots(module, 5, torch.device("cpu")), expected)
    module.graphmode_static_state["padding"] = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])  # shorter than the slots
    padded = helpers.graphmode_visible_slots(module, 5, torch.device("cpu"))
    assert padded.shape == (2, 1, 2, 5)
    assert torch.equal(padded[0, 0], expected)
    assert torch.equal(padded[1, 0], expected & torch.tensor([False, True, True, True, True]))


@pytest.mark.parametrize("model_mask", ["none", "bool", "additive"])
def test_sdpa_over_every_slot_with_the_slot_mask_matches_sdpa_over_a_growing_cache(model_mask):
    """What the model's own code does with a growing cache (`is_causal` for the prompt, its own mask or none for
    each new token) against SDPA over all the slots of a static cache with `graphmode_slot_mask`."""
    torch.manual_seed(0)
    heads, head_dim, max_len, prompt = 2, 8, 12, 5
    buffers = helpers.StaticKVBuffers(seq_dim=2)
    buffers.graphmode_resize(1, max_len)
    grown_k = grown_v = None
    for step, tokens in enumerate([prompt, 1, 1, 1]):
        start = prompt + step - 1 if step else 0
        module = _Attention(torch.arange(start, start + tokens))
        q, k, v = (torch.randn(1, heads, tokens, head_dim) for _ in range(3))
        buffers.update(module.graphmode_static_state["slots"], k, v)
        grown_k = k if grown_k is None else torch.cat([grown_k, k], dim=2)
        grown_v = v if grown_v is None else torch.cat([grown_v, v], dim=2)
        own = None
        if step and model_mask == "bool":  # True where visible, as the model passes it to SDPA
            own = torch.ones(1, 1, 1, 1, dtype=torch.bool)
        elif step and model_mask == "additive":  # zeros for one new token, as a mask built for no past gives
            own = torch.zeros(1, 1, 1, 1)
        grown = F.scaled_dot_product_attention(q, grown_k, grown_v, attn_mask=own, is_causal=not step)
        k_all, v_all = buffers.k_cache, buffers.v_cache  # every slot, as a compiled Decode reads them
        static = F.scaled_dot_product_attention(q, k_all, v_all, helpers.graphmode_slot_mask(module, own, k_all))
        torch.testing.assert_close(static, grown)


def test_scores_of_every_slot_hide_the_unwritten_ones_and_keep_the_written_ones():
    module = _Attention(torch.tensor([1]))
    scores = torch.randn(2, 3, 1, 4, dtype=torch.float16)
    hidden = helpers.graphmode_hide_unwritten(module, scores)
    assert torch.equal(hidden[..., :2], scores[..., :2])
    assert (hidden[..., 2:] == torch.finfo(torch.float16).min).all()
    torch.testing.assert_close(hidden.float().softmax(-1)[..., :2], scores[..., :2].float().softmax(-1))


# -- sizing: setup_caches allocates every static buffer, from the config's own limit or the caller's sizes ---------
class _Config:
    max_position_embeddings = 12


class _Tiny(torch.nn.Module):
    """A model with a config, a static cache and a causal mask, as the codemods leave one."""

    def __init__(self, config=_Config()):
        super().__init__()
        self.config = config
        self.kv_cache = helpers.StaticKVCache(2, 4)
        self.causal_mask = helpers.GraphmodeCausalMask(sliding_window=3)


def test_setup_sizes_every_buffer_to_the_configs_limit_by_default():
    model = _Tiny()
    assert model.kv_cache.k_cache.numel() == 0
    helpers.GraphmodeStaticPath.setup(model)
    assert model.kv_cache.k_cache.shape == (1, 2, 12, 4) and model.kv_cache.max_seq_len == 12
    assert model.causal_mask.rows(torch.arange(12)).shape == (12, 12)
    helpers.GraphmodeStaticPath.setup(model, max_batch_size=3, max_seq_len=5)
    assert model.kv_cache.k_cache.shape == (3, 2, 5, 4) and model.causal_mask.rows(torch.tensor([4])).shape == (1, 5)
    assert helpers.GraphmodeStaticPath.state_of(model) == {"on": False, "slots": None, "padding": None,
                                                           "max_batch_size": 3, "max_seq_len": 5}


def test_setup_keeps_the_buffers_dtype_and_starts_afresh():
    model = _Tiny().to(torch.float16)
    helpers.GraphmodeStaticPath.setup(model, max_seq_len=4)
    model.kv_cache.update(torch.arange(2), torch.ones(1, 2, 2, 4, dtype=torch.float16), torch.ones(1, 2, 2, 4,
                                                                                                   dtype=torch.float16))
    helpers.GraphmodeStaticPath.setup(model, max_seq_len=4)
    assert model.kv_cache.k_cache.dtype == torch.float16 and not model.kv_cache.k_cache.any()


def test_setup_refuses_past_the_configs_limit_and_past_a_tables_rows():
    model = _Tiny()
    with pytest.raises(ValueError, match=r"setup_caches\(max_batch_size=1, max_seq_length=13\).*at most 12 "
                                         r"positions \(config.max_position_embeddings\)"):
        helpers.GraphmodeStaticPath.setup(model, max_seq_len=13)
    # A position table the model's own __init__ built (graphmode_table_buffers) serves no more than its rows.
    model.kv_cache.freqs = torch.zeros(8, 2)
    helpers.graphmode_table_buffers(model.kv_cache, ("freqs",))
    assert "freqs" not in model.state_dict() and model.kv_cache.freqs.shape == (8, 2)
    helpers.GraphmodeStaticPath.setup(model)
    assert model.kv_cache.max_seq_len == 8
    with pytest.raises(ValueError, match=r"at most 8 positions \(the rows of StaticKVCache.freqs\)"):
        helpers.GraphmodeStaticPath.setup(model, max_seq_len=9)


def test_setup_allocates_the_models_own_caches_again_at_its_sizes():
    """A cache the model's __init__ builds at its own sizes (graphmode_cache_buffers) follows the model's dtype, and
    setup_caches allocates it for the sequences and positions asked for; beam search's reorder moves its rows."""
    model, held = _Tiny(), torch.nn.Linear(4, 4)
    held.cache_k = torch.ones(32, 12, 2, 4)
    helpers.graphmode_cache_buffers(held, ("cache_k",), seq_dim=1)
    model.held = held
    model.to(torch.bfloat16)
    assert "held.cache_k" not in model.state_dict()
    helpers.GraphmodeStaticPath.setup(model, max_batch_size=2, max_seq_len=5)
    assert held.cache_k.shape == (2, 5, 2, 4) and held.cache_k.dtype == torch.bfloat16 and not held.cache_k.any()
    held.cache_k[1] = 1
    helpers.GraphmodeStaticPath.reorder(model, torch.tensor([1, 1]))
    assert held.cache_k.all()


def test_setup_without_any_limit_asks_for_the_length():
    model = torch.nn.Sequential(helpers.StaticKVCache(1, 2))
    with pytest.raises(ValueError, match="pass max_seq_length"):
        helpers.GraphmodeStaticPath.setup(model)
    helpers.GraphmodeStaticPath.setup(model, 2, 6)
    assert model[0].k_cache.shape == (2, 1, 6, 2)


def test_fits_sizes_a_first_prefill_and_refuses_what_the_buffers_cannot_hold():
    model = _Tiny()
    helpers.graphmode_fits(model, torch.zeros(2, 3, dtype=torch.long), torch.arange(3))
    assert model.kv_cache.k_cache.shape == (2, 2, 12, 4)  # the model's own limit, this batch
    helpers.GraphmodeStaticPath.setup(model, max_batch_size=1, max_seq_len=6)
    with pytest.raises(ValueError, match=r"set up for 1 sequence\(s\) of 6 positions.*needs 2 of 7.*"
                                         r"setup_caches\(max_batch_size=2, max_seq_length=7\)"):
        helpers.graphmode_fits(model, torch.zeros(2, 7, dtype=torch.long), torch.arange(7))


def test_reorder_moves_the_static_rows_as_beam_search_reorders_its_cache():
    model = _Tiny()
    helpers.GraphmodeStaticPath.setup(model, max_batch_size=3, max_seq_len=4)
    keys = torch.arange(3.0)[:, None, None, None].expand(3, 2, 2, 4)
    model.kv_cache.update(torch.arange(2), keys, keys)
    helpers.GraphmodeStaticPath.reorder(model, torch.tensor([2, 2, 0]))
    assert model.kv_cache.k_cache[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert torch.equal(model.kv_cache.v_cache, model.kv_cache.k_cache)


# -- left padding: rows share the slots, each has positions of its own, padded slots are hidden --------------------
def test_table_buffers_keep_a_registered_tables_persistence_and_make_an_attribute_a_buffer():
    module = torch.nn.Module()
    module.register_buffer("cos", torch.ones(6, 2))  # persistent, as the model registered it
    module.sin = torch.ones(4, 2)
    helpers.graphmode_table_buffers(module, ("cos", "sin"))
    assert set(module.state_dict()) == {"cos"} and module.graphmode_tables == {"cos": 0, "sin": 0}
    assert module.to(torch.float16).sin.dtype == torch.float16


def test_row_positions_count_each_rows_unpadded_slots():
    padding = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    assert helpers.graphmode_row_positions(torch.arange(5)).tolist() == [[0, 1, 2, 3, 4]]
    assert helpers.graphmode_row_positions(torch.arange(5), padding).tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]
    assert helpers.graphmode_row_positions(torch.tensor([4]), padding).tolist() == [[4], [2]]


def test_padded_rows_hide_what_the_padding_mask_holds_0_for_only_inside_the_entries():
    model = _Tiny()
    helpers.GraphmodeStaticPath.setup(model, max_batch_size=2, max_seq_len=6)
    causal, slots = model.causal_mask, torch.tensor([3])
    row = causal.rows(torch.tensor(3))
    padding = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])  # shorter than the 6 slots: a mask grown eagerly
    with helpers.GraphmodeStaticPath(model, slots, padding):
        rows = helpers.graphmode_padded_rows(model, causal, slots)
        assert helpers.graphmode_slots(model) is slots
    minimum = torch.finfo(torch.float32).min
    assert rows.shape == (2, 1, 1, 6)
    assert torch.equal(rows[0, 0, 0], row) and (rows[1, 0, 0, :2] == minimum).all()
    assert torch.equal(rows[1, 0, 0, 2:], row[2:])
    assert helpers.graphmode_padded_rows(model, causal, slots).shape == (1, 1, 1, 6)  # outside: no padding


class _Projections(torch.nn.Module):
    """Three linears of one input, on the static path (where the merged matmul runs) unless `static` is False."""

    def __init__(self, bias: bool, static: bool = True):
        super().__init__()
        self.q = torch.nn.Linear(8, 8, bias=bias)
        self.k = torch.nn.Linear(8, 4, bias=bias)
        self.v = torch.nn.Linear(8, 4, bias=bias)
        helpers.GraphmodeStaticPath.state_of(self)["on"] = static


@pytest.mark.parametrize("bias", [False, True])
def test_merged_linear_gives_each_linears_output_and_keeps_the_parameters_they_were(bias):
    torch.manual_seed(0)
    module, x = _Projections(bias), torch.randn(2, 3, 8)
    separate = [module.q(x), module.k(x), module.v(x)]
    state = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    merged = helpers.graphmode_merged_linear(module, ("q", "k", "v"), x)
    assert [tuple(t.shape) for t in merged] == [(2, 3, 8), (2, 3, 4), (2, 3, 4)]
    for got, want in zip(merged, separate):
        torch.testing.assert_close(got, want)
    # The parameters are views of the stack: same names, same values, and the original path unchanged.
    assert list(module.state_dict()) == list(state)
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, state[name])
    stack = module.graphmode_stacked[("q", "k", "v")][0]
    assert module.k.weight.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
    whole = helpers.graphmode_merged_linear(module, ("q", "k", "v"), x, split=False)
    torch.testing.assert_close(whole, torch.cat(separate, dim=-1))


def test_merged_linear_sees_weights_loaded_after_the_stack_was_built():
    torch.manual_seed(0)
    module, x = _Projections(True), torch.randn(1, 8)
    helpers.graphmode_merged_linear(module, ("q", "k", "v"), x)
    other = _Projections(True)
    module.load_state_dict(other.state_dict())  # copies into the views, so into the stack
    merged = helpers.graphmode_merged_linear(module, ("q", "k", "v"), x)
    torch.testing.assert_close(merged[1], other.k(x))


def test_merged_linear_stacks_again_after_the_model_is_converted():
    torch.manual_seed(0)
    module, x = _Projections(False), torch.randn(1, 8)
    helpers.graphmode_merged_linear(module, ("q", "k", "v"), x)
    module.double()  # each parameter gets storage of its own: the stack no longer backs them
    merged = helpers.graphmode_merged_linear(module, ("q", "k", "v"), x.double())
    assert merged[0].dtype == torch.float64
    torch.testing.assert_close(merged[2], module.v(x.double()))


def test_merged_linear_calls_linears_of_another_kind_one_by_one():
    torch.manual_seed(0)
    module, x = _Projections(False), torch.randn(1, 8)
    module.k = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(8, 4, bias=False))
    assert not hasattr(module, "graphmode_stacked")
    merged = helpers.graphmode_merged_linear(module, ("q", "k", "v"), x)
    torch.testing.assert_close(merged[1], module.k(x))
    assert not hasattr(module, "graphmode_stacked")


def test_merged_linear_off_the_static_path_calls_each_linear_as_written():
    torch.manual_seed(0)
    module, x = _Projections(True, static=False), torch.randn(2, 3, 8)
    called = []
    module.k.register_forward_hook(lambda linear, args, out: called.append("k"))
    merged = helpers.graphmode_merged_linear(module, ("q", "k", "v"), x)
    for got, want in zip(merged, [module.q(x), module.k(x), module.v(x)]):
        assert torch.equal(got, want)  # the separate linears' own results, not a merged matmul's
    assert called == ["k", "k"]  # the hook ran for the merged call and for the check's own call
    assert not hasattr(module, "graphmode_stacked")


def test_merged_linear_compiles_into_one_graph_after_an_eager_call():
    torch.manual_seed(0)
    module, x = _Projections(True), torch.randn(1, 1, 8)
    helpers.graphmode_merged_linear(module, ("q", "k", "v"), x)  # eager, as Prefill: builds the stack
    compiled = torch.compile(lambda t: helpers.graphmode_merged_linear(module, ("q", "k", "v"), t),
                             backend="eager", fullgraph=True)
    for got, want in zip(compiled(x), [module.q(x), module.k(x), module.v(x)]):
        torch.testing.assert_close(got, want)


class _Rotary(torch.nn.Module):
    """A rotary table built on every call, to the furthest position asked for, with `position_tables` in `__init__`
    and the static path's rows in front of its own code, as static_rotary leaves such a module."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4)), persistent=False)
        self.max_seq_len = 12
        helpers.GraphmodeStaticPath.position_tables(self.forward, ("cos_cached", "sin_cached"))

    def forward(self, positions):
        if helpers.graphmode_static_path(self):
            return self.cos_cached[positions], self.sin_cached[positions]
        emb = torch.outer(torch.arange(positions.max().item() + 1, dtype=torch.float32), self.inv_freq)
        return emb.cos()[positions], emb.sin()[positions]


def test_setup_builds_the_tables_a_module_names_with_its_own_code_for_every_position():
    model = torch.nn.Sequential(_Rotary())
    rotary = model[0]
    assert "cos_cached" not in dict(rotary.named_buffers())  # nothing until the static path is sized
    with helpers.GraphmodeStaticPath(model):  # sized on the static path: the tables still come from its own code
        helpers.GraphmodeStaticPath.setup(model, 1, 10)
        assert helpers.graphmode_static_path(rotary)
    cos, sin = rotary(torch.arange(10))
    assert rotary.cos_cached.shape == (10, 2) and "cos_cached" not in rotary.state_dict()
    assert torch.equal(rotary.cos_cached, cos) and torch.equal(rotary.sin_cached, sin)
    positions = torch.tensor([3, 7])
    with helpers.GraphmodeStaticPath(model):
        rows = rotary(positions)
    assert all(torch.equal(r, t) for r, t in zip(rows, rotary(positions)))  # the rows the module's code computes
