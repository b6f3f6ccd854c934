"""Helper code the codemods insert into the adapted model file; graphmode reads it as text, never imports it.

Each top-level class and function below is copied into the user's file by name, with its docstring and the
comments inside it, exactly as written here (`graphmode.transforms.codemods.lib.helper_code`). The comment lines
above a definition are not copied: they are for graphmode's maintainers. A change here changes every adapted
file, so the fixtures under tests/fixtures/codemods change with it.

At the end of the chain every inserted definition moves out of the user's file into `graphmode_static.py` beside
it, which is this file's imports and all its definitions under a docstring of its own (`helper_module_text`), and the
user's file imports the names it uses from there. So a helper runs in that module, not the model's: it imports what
this file imports, and reads nothing from the model's module but through the model (tests/test_helper_code.py runs
each helper on small tensors).

Importing torch is what no graphmode.transforms module may do at import time (`graphmode scan` runs without
torch): so this file sits in a folder whose name is no Python identifier, which neither an import nor the package
walk can reach, and ships as package data.
"""
import torch


# Inserted by static_kv_cache and cache_object: the cache of a model whose head count and head size `__init__`
# names, or (cache_object) whose buffers take the shapes the model writes.
class StaticKVCache(torch.nn.Module):
    """Keys and values for every position the static path serves, written in place (added by graphmode).

    `graphmode_resize` (the model's `setup_caches` calls it) sets the sizes; until then the buffers hold nothing, so
    a model only ever called through `forward` carries no cache memory. Given a head count and head size, it
    allocates `(batch, heads, length, head_dim)` buffers there. Without them, each buffer takes the shape and dtype
    of the first tensor written to it after that (Prefill, which runs eagerly), keys and values apart: MLA's keys
    and values differ in head size, a latent and a rope key in rank. Either way they hold `max_seq_len` slots along
    `seq_dim` (`value_seq_dim` for the values, where it differs). Every Decode step sees the same shapes and the
    same memory, which capture/replay backends need. Slots not written yet hold zeros; the causal mask keeps
    attention away from them.
    """

    def __init__(self, n_heads=None, head_dim=None, seq_dim=2, value_seq_dim=None):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.seq_dim, self.value_seq_dim = seq_dim, seq_dim if value_seq_dim is None else value_seq_dim
        self.max_batch_size = self.max_seq_len = 0
        # Named sizes: empty buffers already, so the model's `.to()` gives them its dtype and device.
        self.register_buffer("k_cache", None if n_heads is None else torch.zeros(self._shape()), persistent=False)
        self.register_buffer("v_cache", None if n_heads is None else torch.zeros(self._shape()), persistent=False)

    def _shape(self):
        shape = [self.max_batch_size, self.n_heads, self.head_dim]
        shape.insert(self.seq_dim, self.max_seq_len)
        return shape

    def graphmode_resize(self, max_batch_size, max_seq_len, like=None):
        """Room for `max_batch_size` sequences of `max_seq_len` positions: fresh zeros where the sizes are named, else
        allocated at the next write. They take the dtype and device of `like` (`setup_caches` passes one of the
        model's parameters), else the buffers' own: a model built on the meta device and given its weights later
        (`load_state_dict(..., assign=True)`) has its parameters where it computes, not its empty buffers."""
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        if self.n_heads is None:
            self.k_cache = self.v_cache = None
        else:
            self.k_cache = (self.k_cache if like is None else like).new_zeros(self._shape())
            self.v_cache = (self.v_cache if like is None else like).new_zeros(self._shape())

    def update(self, input_pos, k, v):
        if self.k_cache is None:  # shaped by this first write
            self.k_cache, self.v_cache = self._zeros_like(k, self.seq_dim), self._zeros_like(v, self.value_seq_dim)
        # The buffers themselves, not views of them: a compiled graph hands an output that is an
        # input straight back, but rebuilds a view of a mutated input on every call.
        k_out, v_out = self.k_cache, self.v_cache
        # Fewer sequences than the buffers hold (a static check).
        if k.shape[0] != k_out.shape[0]:
            k_out, v_out = k_out[: k.shape[0]], v_out[: v.shape[0]]
        k_out.index_copy_(self.seq_dim, input_pos, k)
        v_out.index_copy_(self.value_seq_dim, input_pos, v)
        return k_out, v_out

    def _zeros_like(self, new, seq_dim):
        shape = list(new.shape)
        shape[0], shape[seq_dim] = self.max_batch_size, self.max_seq_len
        return new.new_zeros(shape)

# Inserted by absorbed_mla: MLA's cache, the compressed latent and the rope key instead of the keys and values
# kv_b_proj expands them to (71x less at DeepSeek-V3's sizes).
class StaticLatentCache(StaticKVCache):
    """Multi-head latent attention's cache for every position the static path serves (added by graphmode): the
    normed KV latent (`kv_lora_rank` wide) in `k_cache` and the rotated rope key (`rope_head_dim` wide) in
    `v_cache`, each `(batch, 1, length, width)`: one row per token, shared by every head. Attention reads them
    through the absorbed up-projection (`graphmode_absorbed_mla`), so the per-head keys and values are never held.
    """

    def __init__(self, kv_lora_rank, rope_head_dim):
        super().__init__(1, kv_lora_rank, seq_dim=2)
        self.rope_head_dim = rope_head_dim
        self.v_cache = torch.zeros(self._rope_shape())

    def _rope_shape(self):
        return [self.max_batch_size, 1, self.max_seq_len, self.rope_head_dim]

    def graphmode_resize(self, max_batch_size, max_seq_len, like=None):
        """Fresh zeros for `max_batch_size` sequences of `max_seq_len` positions, in the dtype and device of `like`
        where given (as `StaticKVCache.graphmode_resize`)."""
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.k_cache = (self.k_cache if like is None else like).new_zeros(self._shape())
        self.v_cache = (self.v_cache if like is None else like).new_zeros(self._rope_shape())


# Inserted by absorbed_mla with StaticLatentCache: attention straight over the cached latent.
def graphmode_absorbed_mla(kv_b_proj, q_nope, q_pe, latent, k_pe, attention_mask, scaling):
    """Multi-head latent attention over the cached latent, with `kv_b_proj` absorbed (added by graphmode), as
    serving engines run MLA's Decode. `kv_b_proj` maps the latent to each head's key part without rope (W_UK) and
    value (W_UV). Rather than expanding every cached position through it, the query takes W_UK
    (`q_nope @ W_UK` scores against the latent itself: the same product, associated the other way) and the output
    takes W_UV after attention has weighed the latent. Per token attention then reads `kv_lora_rank + rope` numbers
    instead of `heads x (key + value head sizes)`.

    q_nope (batch, heads, tokens, nope), q_pe (batch, heads, tokens, rope), latent (batch, 1, slots, rank),
    k_pe (batch, 1, slots, rope), attention_mask additive (or boolean, True where visible) over the slots.
    Returns (attention output (batch, tokens, heads, v_head_dim), None), as the attention interfaces do.
    """
    heads, nope = q_nope.shape[1], q_nope.shape[-1]
    weight = kv_b_proj.weight.view(heads, -1, kv_b_proj.in_features)  # (heads, nope + v, rank)
    w_uk, w_uv = weight[:, :nope], weight[:, nope:]
    q_latent = torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk)
    scores = q_latent @ latent.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)
    if kv_b_proj.bias is not None:  # the key bias's share of each score, the same for every slot
        scores = scores + (q_nope * kv_b_proj.bias.view(heads, 1, -1)[..., :nope]).sum(-1, keepdim=True)
    scores = scores * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q_nope.dtype)
    output = torch.einsum("bhtr,hvr->bhtv", weights @ latent, w_uv)
    if kv_b_proj.bias is not None:  # the weights sum to 1: the value bias passes through whole
        output = output + kv_b_proj.bias.view(heads, 1, -1)[..., nope:]
    return output.transpose(1, 2), None


# Inserted by carried_cache: the cache of a tuple-cache model in any layout, shaped by its first write.
class StaticKVBuffers(torch.nn.Module):
    """Keys and values for every position the static path serves, written in place (added by graphmode).

    `graphmode_resize` (called by the model's `setup_caches`) sets the sizes. The buffers take the layout of the first
    keys and values written after it (Prefill, which runs eagerly), with `max_seq_len` slots along `seq_dim`
    (`value_seq_dim` for the values, where they differ), so every compiled Decode step sees the same shapes and
    memory. Slots not written yet hold zeros; the causal mask keeps
    attention away from them.
    """

    def __init__(self, seq_dim, value_seq_dim=None):
        super().__init__()
        self.max_batch_size = self.max_seq_len = 0
        self.seq_dim, self.value_seq_dim = seq_dim, seq_dim if value_seq_dim is None else value_seq_dim
        # The sequences sit along dim 0, or dim 1 in a sequence-first layout ([seq, batch, heads, dim], GLM).
        self.batch_dim = 1 if self.seq_dim == 0 else 0
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)

    def graphmode_resize(self, max_batch_size, max_seq_len, like=None):
        """Room for `max_batch_size` sequences of `max_seq_len` positions, allocated at the next write (in the
        keys' and values' own dtype and device)."""
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.k_cache = self.v_cache = None

    def update(self, input_pos, k, v):
        if self.k_cache is None:
            self.k_cache, self.v_cache = self._zeros_like(k, self.seq_dim), self._zeros_like(v, self.value_seq_dim)
        k_out, v_out, rows = self.k_cache, self.v_cache, self.batch_dim
        # Fewer sequences than the buffers hold (a static check).
        if k.shape[rows] != k_out.shape[rows]:
            k_out, v_out = k_out.narrow(rows, 0, k.shape[rows]), v_out.narrow(rows, 0, v.shape[rows])
        k_out.index_copy_(self.seq_dim, input_pos, k)
        v_out.index_copy_(self.value_seq_dim, input_pos, v)
        if not torch.compiler.is_compiling():
            # Eager callers (Prefill, the model's own generate loop) get the written slots only, as the growing
            # cache gave them, so lengths read off the returned keys stay true; the masked slots add nothing.
            written = int(input_pos[-1]) + 1
            return k_out.narrow(self.seq_dim, 0, written), v_out.narrow(self.value_seq_dim, 0, written)
        return k_out, v_out

    def _zeros_like(self, new, seq_dim):
        # The batch dim holds `max_batch_size` sequences, or as many rows as the first write where it has more
        # (a batch-times-heads layout).
        shape, rows = list(new.shape), self.batch_dim
        shape[rows], shape[seq_dim] = max(self.max_batch_size, shape[rows]), self.max_seq_len
        return new.new_zeros(shape)

# Inserted by static_mask in place of a causal mask the model built on every call, and with GraphmodeCausalMask:
# the rows of the positions computed, never the square mask.
def graphmode_causal_rows(module, positions, diagonal=0, window=None, length=None):
    """The causal mask's rows for `positions`, one per token, over the first `length` slots (by default every slot
    `setup_caches` allocated): True where slot s is visible from position p, s <= p + diagonal, as `tril(diagonal)`
    of a square of ones has it; with a sliding `window`, only the last `window` slots up to there (added by
    graphmode).

    The rows are computed from the positions inside the compiled Decode, one comparison per slot. The square mask
    they come from is never held: at 131072 positions it would take 16 GiB as booleans, 64 GiB as float32. Slots
    past p are hidden, which also hides the slots a static cache has not written yet.
    """
    if length is None:
        length = module.graphmode_static_state["max_seq_len"]
    slots = torch.arange(length, device=positions.device)
    last = positions[..., None] + diagonal
    visible = slots <= last
    if window is not None:
        visible = visible & (slots > last - window)
    return visible


# Inserted by static_mask in place of an additive mask the model built on every call (`torch.full` + `triu`).
def graphmode_filled_rows(module, positions, fill, diagonal=1, dtype=None):
    """The rows for `positions` of a square mask holding `fill` on and above `diagonal` and 0 below it, as
    `torch.full((n, n), fill, dtype=dtype).triu(diagonal)` has them, over every slot `setup_caches` allocated
    (added by graphmode): computed per call, like `graphmode_causal_rows`."""
    hidden = ~graphmode_causal_rows(module, positions, diagonal - 1)
    return torch.zeros(hidden.shape, dtype=dtype, device=positions.device).masked_fill(hidden, fill)


# Inserted by cache_object and carried_cache where a library mask helper's call is replaced by rows of the causal
# mask.
class GraphmodeCausalMask(torch.nn.Module):
    """The causal mask of the static path as additive rows, `rows(positions)` (added by graphmode).

    Row p holds 0 where position p may attend and the float32 minimum elsewhere, as transformers' mask helpers fill
    it; with a sliding window, p sees only the last `sliding_window` positions. Each row is computed from its
    position when asked for (`graphmode_causal_rows`); no (slots, slots) mask is held.
    """

    def __init__(self, sliding_window=None):
        super().__init__()
        self.sliding_window = sliding_window

    def rows(self, positions, length=None):
        """(*positions.shape, slots) additive rows over `length` slots, every slot by default. float32 whatever the
        default dtype: transformers builds models under torch_dtype=float16 by switching the default, and the
        float32 minimum would overflow there."""
        visible = graphmode_causal_rows(self, positions, window=self.sliding_window, length=length)
        zeros = torch.zeros(visible.shape, dtype=torch.float32, device=positions.device)
        return zeros.masked_fill(~visible, torch.finfo(torch.float32).min)

# Inserted by cache_object where the caller is handed back a tuple cache.
def graphmode_written(k, v, input_pos, seq_dim=2):
    """The slots of static cache buffers written so far (added by graphmode).

    Eager callers that carry the cache read the past length off it, so they get the written slots only;
    a compiled graph gets the whole buffers and no host sync.
    """
    if torch.compiler.is_compiling():
        return k, v
    end = int(input_pos[-1]) + 1
    return k.narrow(seq_dim, 0, end), v.narrow(seq_dim, 0, end)

# Inserted by carried_cache: the rows of the mask buffer for the computed tokens.
def graphmode_mask_rows(causal_mask, position_ids):
    """Rows of the causal mask (a `GraphmodeCausalMask`) for the tokens computed, (batch, 1, tokens, slots) (added
    by graphmode).

    A compiled graph reads every slot of the static cache; an eager call gets the written slots only
    (StaticKVBuffers.update hands back as many), so its rows stop at the last position written.
    """
    length = None
    if not torch.compiler.is_compiling():
        length = int(position_ids.reshape(-1)[-1]) + 1
    return causal_mask.rows(position_ids, length)[:, None]

# Inserted by carried_cache where attention reads every slot of the static buffers and no mask of the model's hides
# the ones not written yet (no mask in Decode, `is_causal`, a mask built per call for another length).
def graphmode_visible_slots(module, key_slots, device):
    """Which of the first `key_slots` cache slots each computed token may read, True where it may (added by graphmode).

    Slot s is visible to the token written at slot p when s <= p: what is not written yet stays hidden, whatever
    mask the model builds. (tokens, key_slots); with the entries' 2-D padding mask, (rows, 1, tokens, key_slots),
    the slots it holds 0 for hidden too.
    """
    slots = module.graphmode_static_state["slots"].to(device)
    visible = torch.arange(key_slots, device=device) <= slots[:, None]
    padding = module.graphmode_static_state["padding"]
    if padding is None:
        return visible
    kept = padding[:, None, None, :key_slots].to(device) != 0
    kept = torch.nn.functional.pad(kept, (0, key_slots - kept.shape[-1]), value=True)
    return visible & kept


# Inserted by carried_cache on the scores of the keys (`q @ k^T`, `baddbmm`) where the model's own mask does not
# hide the slots not written yet.
def graphmode_hide_unwritten(module, scores):
    """The scores of every cache slot with the slots not written yet (and padding) at the dtype's minimum, as
    transformers' masks fill them (added by graphmode); written slots keep their scores, bit for bit."""
    visible = graphmode_visible_slots(module, scores.shape[-1], scores.device)
    return scores.masked_fill(~visible, torch.finfo(scores.dtype).min)


# Inserted by carried_cache as the mask of `scaled_dot_product_attention` over the static buffers.
def graphmode_slot_mask(module, mask, keys):
    """The model's own `attn_mask` (None, boolean with True where visible, or additive) with the cache slots not
    written yet hidden too, for keys laid out (..., slots, head_dim) (added by graphmode). It also stands for
    `is_causal`: a slot after a token's own is one not written when that token is computed."""
    visible = graphmode_visible_slots(module, keys.shape[-2], keys.device)
    if mask is None:
        return visible
    if mask.dtype == torch.bool:
        return mask & visible
    return torch.where(visible, mask, torch.finfo(mask.dtype).min)

# Inserted by carried_cache where a method makes a tensor for the `past + new` keys (`_new_positions`).
def graphmode_key_slots(module, position_ids):
    """How many key slots attention reads (added by graphmode): every slot `setup_caches` allocated in a compiled
    graph, the ones written so far in an eager call."""
    if torch.compiler.is_compiling():
        return module.graphmode_static_state["max_seq_len"]
    return int(position_ids.reshape(-1)[-1]) + 1


# Inserted by sliced_kv_cache after the `__init__` statements that build caches its forward slices by position.
def graphmode_cache_buffers(module, names, seq_dim, batch_dim=0):
    """Makes the caches `names` that the model's own `__init__` built buffers of `module`, so they follow the
    model's `.to()`; `setup_caches` allocates them again, zeroed, for the sequences (`batch_dim`) and positions
    (`seq_dim`) it serves, in the model's dtype, and `forward` then reads them at that size too (added by
    graphmode)."""
    for name in names:
        if name not in module._buffers:
            module.register_buffer(name, module.__dict__.pop(name), persistent=False)
    if "graphmode_caches" not in module.__dict__:
        module.graphmode_caches = {}
    module.graphmode_caches.update({name: (seq_dim, batch_dim) for name in names})


# Inserted by sliced_tables after the `__init__` statements that build position tables its forward slices.
def graphmode_table_buffers(module, names, seq_dim=0):
    """Makes the position tables `names` that the model's own `__init__` built buffers of `module` (those it
    registered stay as they are), so they follow the model's `.to()`; `setup_caches` serves no more positions than
    they have rows along `seq_dim` (added by graphmode)."""
    for name in names:
        if name not in module._buffers:
            module.register_buffer(name, module.__dict__.pop(name), persistent=False)
    if "graphmode_tables" not in module.__dict__:
        module.graphmode_tables = {}
    module.graphmode_tables.update({name: seq_dim for name in names})


# Inserted by split_decode around the body of `prefill` and `decode`: the only way onto the static path, and where
# it is sized.
class GraphmodeStaticPath:
    """Puts the calls made inside `with GraphmodeStaticPath(model):` on graphmode's static path (added by graphmode).

    The `prefill` and `decode` entries are the only callers. Every other call (`forward`, `generate()`, training,
    tracing, a cache object of the caller's own) runs the model's code exactly as it was written. The state (on or
    off, and the sizes `setup` allocated) is one dict shared by every submodule, so the methods of one model, in any
    of its files, agree on it.
    """

    # Where a model's config names how many positions it serves, in the spellings model families use.
    LIMITS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "seq_length", "n_ctx")

    def __init__(self, model, slots=None, padding=None):
        self.state, self.slots, self.padding = GraphmodeStaticPath.state_of(model), slots, padding

    def __enter__(self):
        # The slots every row of this call writes (the entries' `input_pos`), apart from each row's own positions,
        # and the caller's 2-D padding mask, which only graphmode's mask rows read: the model's own code never sees
        # it, so no branch of its on the mask's values (`if 0 in attention_mask:`) enters the compiled Decode.
        self.state.update(on=True, slots=self.slots, padding=self.padding)

    def __exit__(self, *exc_info):
        self.state.update(on=False, slots=None, padding=None)

    @staticmethod
    def state_of(model):
        state = getattr(model, "graphmode_static_state", None)
        if state is None:
            state = {
                "on": False,
                "slots": None,
                "padding": None,
                "max_batch_size": 0,
                "max_seq_len": 0,
            }
            for module in model.modules():
                module.graphmode_static_state = state
        return state

    @staticmethod
    def setup(model, max_batch_size=1, max_seq_len=None):
        """Allocates every static buffer for `max_batch_size` sequences of `max_seq_len` positions, by default the
        model's own limit; held conversations are lost. Refuses sizes past what the model can serve."""
        limits = []
        for owner_name in ("config", "params", "args"):
            owner = getattr(model, owner_name, None)
            name = next((n for n in GraphmodeStaticPath.LIMITS if isinstance(getattr(owner, n, None), int)), None)
            if name is not None:
                limits.append((getattr(owner, name), f"{owner_name}.{name}"))
                break
        # Position tables the model's own `__init__` builds (`graphmode_table_buffers`): no more positions than their
        # rows. Caches of its own (`graphmode_cache_buffers`) are allocated below at the sizes asked for.
        for module in model.modules():
            for name, seq_dim in getattr(module, "graphmode_tables", {}).items():
                rows = getattr(module, name).shape[seq_dim]
                limits.append((rows, f"the rows of {type(module).__name__}.{name}"))
        if max_seq_len is None:
            if not limits:
                raise ValueError(
                    "setup_caches: the model's config names no length limit; "
                    "pass max_seq_length"
                )
            max_seq_len = min(limit for limit, _ in limits)
        refused = [
            f"at most {limit} positions ({name})"
            for limit, name in limits
            if max_seq_len > limit
        ]
        if max_batch_size < 1 or max_seq_len < 1:
            refused.append("at least one sequence of one position")
        if refused:
            raise ValueError(
                f"setup_caches(max_batch_size={max_batch_size}, "
                f"max_seq_length={max_seq_len}): the static path serves "
                f"{'; '.join(refused)}"
            )
        state = GraphmodeStaticPath.state_of(model)
        # The dtype and device the model computes in: its first floating-point parameter's.
        like = next((p for p in model.parameters() if p.is_floating_point()), None)
        for module in model.modules():
            resize = getattr(module, "graphmode_resize", None)
            if callable(resize):
                resize(max_batch_size, max_seq_len, like)
            if hasattr(module, "graphmode_built_tables"):
                GraphmodeStaticPath.build_tables(module, max_seq_len, like)
            for name, (seq_dim, batch_dim) in getattr(module, "graphmode_caches", {}).items():
                held = getattr(module, name)
                shape = list(held.shape)
                shape[seq_dim], shape[batch_dim] = max_seq_len, max_batch_size
                module.register_buffer(name, (held if like is None else like).new_zeros(shape), persistent=False)
        state.update(max_batch_size=max_batch_size, max_seq_len=max_seq_len)

    @staticmethod
    def position_tables(method, names):
        """Has `setup` register what `method`, a module's own code, returns for every position it serves as the
        module's non-persistent buffers `names`, the rows its static path selects. static_rotary calls it in
        `__init__` where that method builds a position table on every call and takes the positions alone."""
        method.__self__.graphmode_built_tables = (method.__name__, names)

    @staticmethod
    def build_tables(module, max_seq_len, like):
        """The tables `position_tables` named, built by the module's own code (off the static path, which only
        selects their rows) for the positions 0..max_seq_len-1."""
        method, names = module.graphmode_built_tables
        state = GraphmodeStaticPath.state_of(module)
        on, state["on"] = state["on"], False
        try:
            tables = getattr(module, method)(torch.arange(max_seq_len, device=None if like is None else like.device))
        finally:
            state["on"] = on
        for name, table in zip(names, tables if isinstance(tables, tuple) else (tables,)):
            module.register_buffer(name, table, persistent=False)

    @staticmethod
    def hold(model):
        """The state of the conversation in progress on the static path (a copy of every buffer), to give back
        later with `restore`: one model serves several conversations in turn."""
        return {name: buffer.clone() for name, buffer in model.named_buffers()}

    @staticmethod
    def restore(model, held):
        """Puts a held conversation back, in place: a compiled `decode` keeps reading the same memory."""
        buffers = dict(model.named_buffers())
        for name, saved in held.items():
            buffers[name].copy_(saved)

    @staticmethod
    def reorder(model, rows):
        """Reorders the sequences of the static caches in place, as beam search reorders its cache: sequence i
        becomes sequence `rows[i]` (a tensor of indices)."""
        for module in model.modules():
            if callable(getattr(module, "graphmode_resize", None)):
                for buffer in (
                    getattr(module, "k_cache", None),
                    getattr(module, "v_cache", None),
                ):
                    if buffer is not None and buffer.shape[0] >= rows.shape[0]:
                        buffer[: rows.shape[0]] = buffer.index_select(0, rows)
            for name, (_, batch_dim) in getattr(module, "graphmode_caches", {}).items():
                buffer = getattr(module, name).narrow(batch_dim, 0, rows.shape[0])
                buffer.copy_(buffer.index_select(batch_dim, rows))


# Inserted by cache_object where attention writes the static cache and its model takes no `cache_position`.
def graphmode_slots(module):
    """The cache slots this call of the entries writes, shared by every row (added by graphmode); each row's own
    positions (left padding) go to the rotary tables as `position_ids`."""
    return module.graphmode_static_state["slots"]


# Inserted by split_decode where the entries take a padding mask (cache_object's mask rows read it).
def graphmode_row_positions(slots, attention_mask=None):
    """Each row's positions at these slots (added by graphmode): the slots themselves without a padding mask, else
    the count of the row's unpadded slots before each one, as transformers' generate() counts them."""
    if attention_mask is None:
        return slots.unsqueeze(0)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, slots]


# Inserted by cache_object in place of the model's mask helper call, on the static path.
def graphmode_padded_rows(module, causal_mask, slots):
    """The rows of the causal mask (a `GraphmodeCausalMask`) for these slots, (rows, 1, tokens, slots), with the
    slots the entries' 2-D padding mask holds 0 for hidden too (added by graphmode). The padding mask may be
    shorter than the static cache (a mask that grows every step, eagerly); the compiled Decode should be handed it
    at the full length, so its shape stays fixed."""
    rows = causal_mask.rows(slots)[None, None]
    padding = module.graphmode_static_state["padding"]
    if padding is None:
        return rows
    hidden = padding[:, None, None, :] == 0
    hidden = torch.nn.functional.pad(hidden, (0, rows.shape[-1] - hidden.shape[-1]))
    return rows.masked_fill(hidden, torch.finfo(rows.dtype).min)


# Inserted where a method has a static twin (transforms/output/static_path.py): the test at the top of the original.
def graphmode_static_path(module):
    """Whether this call came through the `prefill`/`decode` entries (added by graphmode); if not, the module runs
    its own code as written."""
    state = getattr(module, "graphmode_static_state", None)
    return state is not None and state["on"]


# Inserted by split_decode at the top of `prefill`: the one place a request too large for the static buffers can be
# refused before anything is written (Prefill runs eagerly; Decode is compiled).
def graphmode_fits(model, tokens, input_pos):
    """Sizes the static path at its first Prefill when `setup_caches` was not called (the model's own limit, this
    batch), and refuses a Prefill the buffers cannot hold, with their sizes (added by graphmode)."""
    # Prefill runs eagerly; the reads below would wait for the device.
    if not torch.compiler.is_compiling():
        state = GraphmodeStaticPath.state_of(model)
        batch, last = tokens.shape[0], int(input_pos.max()) + 1
        if not state["max_seq_len"]:
            GraphmodeStaticPath.setup(model, max_batch_size=batch)
        if batch > state["max_batch_size"] or last > state["max_seq_len"]:
            raise ValueError(
                f"the static path is set up for {state['max_batch_size']} "
                f"sequence(s) of {state['max_seq_len']} positions, and this "
                f"Prefill needs {batch} of {last}; call `setup_caches("
                f"max_batch_size={batch}, max_seq_length={last})` (or larger) "
                "first, or call `forward`, which has no such limit"
            )


# Inserted by static_moe in place of an expert loop that picks each expert's tokens by the routing (a count read on
# the host, a `torch.where` of a mask): the same mixture, with no shape that depends on the routing.
def graphmode_moe(experts, tokens, expert_ids, expert_weights):
    """The mixture of `experts` over `tokens` ([tokens, hidden]) for a top-k routing, `expert_ids` and
    `expert_weights` ([tokens, k]), in static shapes (added by graphmode).

    Where the experts' weights are stacked (`graphmode_stack_experts`, in eager calls) and the step routes fewer
    (token, expert) pairs than there are experts, as a Decode step of a few sequences does, only the routed experts'
    weights are read (`graphmode_moe_routed`); otherwise every expert runs over every token
    (`graphmode_moe_dense`), which reads each expert's weights once for all the tokens. Both are decided by shapes
    alone, so a compiled Decode holds one of them, fixed for its batch size.
    """
    routed = tokens.shape[0] * expert_ids.shape[-1] < len(experts)
    if routed and getattr(experts, "graphmode_stacked", None) is not None:
        return graphmode_moe_routed(experts, tokens, expert_ids, expert_weights)
    return graphmode_moe_dense(experts, tokens, expert_ids, expert_weights)


def graphmode_stack_experts(experts):
    """Stacks each parameter of `experts` into one [experts, ...] tensor, once, and again whenever a parameter no
    longer lies in its stack (the model was moved or converted since), making every expert's parameter a view of its
    row (added by graphmode): the same memory, so the experts, the model's state dict and its loading see the
    parameters they always had. Experts of different kinds or shapes, or not all on this rank, are left as they are
    (the dense dispatch serves them)."""
    if not isinstance(experts, torch.nn.Module) or any(type(e) is not type(experts[0]) for e in experts):
        return
    params = [dict(expert.named_parameters()) for expert in experts]
    names = list(params[0])
    if not names or any(list(p) != names or any(p[n].shape != params[0][n].shape for n in names) for p in params):
        return
    stacked = experts.__dict__.get("graphmode_stacked")
    if stacked is not None and all(
        p[n].data_ptr() == row.data_ptr() for n in names for p, row in zip(params, stacked[n])
    ):
        return
    # Outside inference mode: the stack backs the parameters, which training may still use.
    with torch.inference_mode(False), torch.no_grad():
        stacked = {n: torch.stack([p[n] for p in params]) for n in names}
    for n in names:
        for p, row in zip(params, stacked[n]):
            p[n].data = row
    experts.__dict__["graphmode_stacked"] = stacked
    for expert in experts:  # its linears stay apart: graphmode_merged_linear would stack them a second time
        expert.__dict__["graphmode_expert"] = True
        expert.__dict__.pop("graphmode_stacked", None)


def graphmode_moe_routed(experts, tokens, expert_ids, expert_weights):
    """The mixture with only the routed experts' weights read (added by graphmode): each token's top-k experts'
    stacked parameters are gathered by their ids and the expert's own `forward` runs on them, one (token, expert)
    pair at a time under `torch.func.vmap`. The outputs are weighted and summed in expert order, in the routing
    weights' dtype, as the loop and `graphmode_moe_dense` sum them."""
    order = expert_ids.argsort(dim=-1)
    expert_ids, expert_weights = expert_ids.gather(-1, order), expert_weights.gather(-1, order)
    count, top_k = expert_ids.shape
    stacked = experts.graphmode_stacked
    picked = {name: stack[expert_ids.reshape(-1)] for name, stack in stacked.items()}
    rows = tokens.repeat_interleave(top_k, dim=0)

    def one(params, row):
        return torch.func.functional_call(experts[0], params, (row[None],))[0]

    out = torch.func.vmap(one)(picked, rows).to(expert_weights.dtype)
    out = (out * expert_weights.reshape(-1, 1)).view(count, top_k, -1)
    mixed = out[:, 0]
    for slot in range(1, top_k):
        mixed = mixed + out[:, slot]
    return mixed.to(tokens.dtype)


def graphmode_moe_dense(experts, tokens, expert_ids, expert_weights):
    """The mixture of `experts` over `tokens` ([tokens, hidden]) for a top-k routing: `expert_ids` and
    `expert_weights` ([tokens, k]) as the router chose and normalised them (added by graphmode).

    Every expert runs over every token, and a token keeps the outputs of the experts it was routed to, each times
    its routing weight: the sum the expert loop made, with no value read on the host and no shape that depends on
    the routing, so a Decode graph holds it whole. An output a token was not routed to is dropped by a selection,
    not multiplied by zero, so a non-finite value there cannot leak in. Products and sum are taken in the routing
    weights' dtype and the result is returned in the tokens' dtype, as the loops this replaces do. It costs
    experts / k times the expert work of the loop: little for Decode's few tokens.
    """
    if (
        expert_ids.dim() != 2
        or expert_ids.shape != expert_weights.shape
        or expert_ids.shape[0] != tokens.shape[0]
    ):
        raise ValueError(
            "graphmode_moe_dense: expected one row of expert ids and weights "
            f"per token, got tokens {tuple(tokens.shape)}, ids "
            f"{tuple(expert_ids.shape)} and weights "
            f"{tuple(expert_weights.shape)}"
        )
    if any(expert is None for expert in experts):
        raise ValueError(
            "graphmode_moe_dense: some experts live on other ranks (expert "
            "parallelism); the static dispatch runs every expert on this one, "
            "so it needs them all here"
        )
    count = len(experts)
    routed = torch.zeros(tokens.shape[0], count, dtype=torch.bool, device=tokens.device)
    routed = routed.scatter(1, expert_ids, True)
    weights = torch.zeros(tokens.shape[0], count, dtype=expert_weights.dtype, device=tokens.device)
    weights = weights.scatter_add(1, expert_ids, expert_weights)
    mixed = None
    for index, expert in enumerate(experts):
        out = expert(tokens).to(expert_weights.dtype) * weights[:, index, None]
        out = torch.where(routed[:, index, None], out, 0)
        mixed = out if mixed is None else mixed + out
    return mixed.to(tokens.dtype)


# Inserted by added_cache where attention over the added cache was causal by `is_causal=True`: the mask rows.
def graphmode_position_rows(module, keys):
    """Which cache slots (dim -2 of `keys`) each token this call computes may read, (tokens, slots), True where it
    may (added by graphmode): the slots up to its own position, the entries' `input_pos`. It stands for
    `is_causal=True`, which means the same only while the keys are exactly the tokens computed; it also hides the
    slots the cache has not written yet."""
    positions = module.graphmode_static_state["slots"].reshape(-1)
    return torch.arange(keys.shape[-2], device=keys.device) <= positions[:, None]


# Inserted by tensor_branches before a branch test the trace saw compare how far the positions reach with a bound
# (dynamic NTK rotary embeddings: `if torch.max(position_ids) + 1 > self.max_position_embeddings`).
def graphmode_position_limit(module):
    """How many positions the static path holds, as `setup_caches` sized it (added by graphmode). No position the
    entries pass reaches it, so `graphmode_position_limit(self) > bound and count > bound` tests what
    `count > bound` tested; where the limit is within the bound, the first part is a Python `False` and the compiled
    Decode never reads the device for the second."""
    return module.graphmode_static_state["max_seq_len"]


# Inserted by buffers_in_place where step code puts a new tensor in place of a module's buffer.
def graphmode_write_buffer(module, name, value):
    """`setattr(module, name, value)`, but into the buffer's own memory where it has the value's shape, dtype and
    device (added by graphmode): a captured graph replays against the addresses it was captured with, so a buffer
    rebound every step would leave it reading the first step's values. The first write (to a buffer registered as
    None, in eager Prefill) and a write of another shape bind the new tensor, as the model's own code did."""
    held = getattr(module, name)
    if held is None or held.shape != value.shape or held.dtype != value.dtype or held.device != value.device:
        setattr(module, name, value)
    elif value is not held:  # not a move to where it already is (`.to()` hands the tensor itself back)
        held.copy_(value)


# Inserted by merged_projections where one input goes through several linears of one module (q/k/v, gate/up).
def graphmode_merged_linear(module, names, x, split=True):
    """`getattr(module, name)(x)` for each of `names`, as one matmul over their weights stacked (added by
    graphmode): `x` is read once, and one kernel replaces several. The outputs come back split in the order of
    `names`, or whole with `split=False` (for a fused activation that takes both halves).

    The stacked weight is built in eager code (Prefill), and the linears' own weights become views of it: the same
    memory, so the model's state dict, its loading and its other callers see the parameters they always had, and a
    checkpoint loaded later lands in the stacked weight too. Off the static path each linear is called as written,
    one by one: the model's own computation, hooks included, so the call can stand in the code both paths share.
    So are linears of another kind (quantised, adapters), an expert's (`graphmode_stack_experts` stacks its weights
    with the other experts', and a routed dispatch calls it with parameters of its own) and a module's that no eager
    call has stacked yet."""
    linears = [getattr(module, name) for name in names]
    merged = all(type(linear) is torch.nn.Linear for linear in linears) and graphmode_static_path(module) \
        and "graphmode_expert" not in module.__dict__
    if merged and not torch.compiler.is_compiling():
        graphmode_stack_weights(module, names, linears)
    held = module.__dict__.get("graphmode_stacked", {}).get(names) if merged else None
    if held is None:
        outputs = [linear(x) for linear in linears]
        return outputs if split else torch.cat(outputs, dim=-1)
    weight, bias, sizes = held
    out = torch.nn.functional.linear(x, weight, bias)
    return out.split(sizes, dim=-1) if split else out


def graphmode_stack_weights(module, names, linears):
    """Stacks the linears' weights (and biases) once, and again whenever a weight no longer lies in the stack (the
    model was moved or converted since), making each linear's weight a view of its rows (added by graphmode)."""
    stacks = module.__dict__.setdefault("graphmode_stacked", {})
    held = stacks.get(names)
    sizes = [linear.weight.shape[0] for linear in linears]
    if held is not None and all(
        linear.weight.data_ptr() == part.data_ptr()
        for linear, part in zip(linears, held[0].split(sizes))
    ):
        return
    # Outside inference mode: the stack backs the parameters, which training may still use.
    with torch.inference_mode(False), torch.no_grad():
        weight = torch.cat([linear.weight for linear in linears])
        has_bias = all(linear.bias is not None for linear in linears)
        bias = torch.cat([linear.bias for linear in linears]) if has_bias else None
    if not has_bias and any(linear.bias is not None for linear in linears):
        # Some linears have a bias, some not: zeros stand in for the missing ones.
        with torch.inference_mode(False), torch.no_grad():
            bias = torch.cat([
                linear.bias if linear.bias is not None
                else linear.weight.new_zeros(linear.weight.shape[0])
                for linear in linears
            ])
    for linear, part in zip(linears, weight.split(sizes)):
        linear.weight.data = part
    if has_bias:
        for linear, part in zip(linears, bias.split(sizes)):
            linear.bias.data = part
    stacks[names] = (weight, bias, sizes)
