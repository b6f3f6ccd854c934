"""Helper code the codemods insert into the adapted model file; graphmode reads it as text, never imports it.

Each top-level class and function below is copied into the user's file by name, with its docstring and the
comments inside it, exactly as written here (`graphmode.transforms.codemods._helper_code`). The comment lines
above a definition are not copied: they are for graphmode's maintainers. A change here changes every adapted
file, so the fixtures under tests/fixtures/codemods change with it.

The copies run in the user's module, which imports torch and defines the size constants
(`_module.ensure_size_constants`); both exist here too, so this file imports, lints and runs as it is
(tests/test_helper_code.py runs each helper on small tensors). It imports torch, which no graphmode.transforms
module may do at import time (`graphmode scan` runs without torch): so it sits in a folder whose name is no
Python identifier, which neither an import nor the package walk can reach, and ships as package data.
"""
import torch

# Stand in for the constants `_module.ensure_size_constants` defines in the adapted file from the options.
GRAPHMODE_MAX_SEQ_LEN = 32
GRAPHMODE_MAX_BATCH_SIZE = 1


# Inserted by static_kv_cache and cache_object: the cache of a model whose head count and head size
# `__init__` names.
class StaticKVCache(torch.nn.Module):
    """Keys and values for every position up to the maximum, written in place (added by graphmode).

    Every Decode step sees the same shapes and the same memory, which capture/replay backends need.
    Slots not written yet hold zeros; the causal mask keeps attention away from them.
    """

    def __init__(self, max_batch_size, n_heads, max_seq_len, head_dim, seq_dim=2):
        super().__init__()
        shape = [max_batch_size, n_heads, head_dim]
        shape.insert(seq_dim, max_seq_len)
        self.seq_dim = seq_dim
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def update(self, input_pos, k, v):
        # The buffers themselves, not views of them: a compiled graph hands an output that is an
        # input straight back, but rebuilds a view of a mutated input on every call.
        k_out, v_out = self.k_cache, self.v_cache
        if k.shape[0] != k_out.shape[0]:  # fewer sequences than the buffers hold (a static check)
            k_out, v_out = k_out[: k.shape[0]], v_out[: v.shape[0]]
        k_out.index_copy_(self.seq_dim, input_pos, k)
        v_out.index_copy_(self.seq_dim, input_pos, v)
        return k_out, v_out

# Inserted by carried_cache: the cache of a tuple-cache model in any layout, shaped by its first write.
class StaticKVBuffers(torch.nn.Module):
    """Keys and values for every position up to the maximum, written in place (added by graphmode).

    The buffers take the layout of the first keys and values written (Prefill, which runs eagerly), with
    `max_seq_len` slots along `seq_dim` (`value_seq_dim` for the values, where they differ), so every compiled
    Decode step sees the same shapes and memory. Slots not written yet hold zeros; the causal mask keeps
    attention away from them.
    """

    def __init__(self, max_batch_size, max_seq_len, seq_dim, value_seq_dim=None):
        super().__init__()
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.seq_dim, self.value_seq_dim = seq_dim, seq_dim if value_seq_dim is None else value_seq_dim
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)

    def update(self, input_pos, k, v):
        if self.k_cache is None:
            self.k_cache, self.v_cache = self._zeros_like(k, self.seq_dim), self._zeros_like(v, self.value_seq_dim)
        k_out, v_out = self.k_cache, self.v_cache
        if k.shape[0] != k_out.shape[0]:  # fewer sequences than the buffers hold (a static check)
            k_out, v_out = k_out[: k.shape[0]], v_out[: v.shape[0]]
        k_out.index_copy_(self.seq_dim, input_pos, k)
        v_out.index_copy_(self.value_seq_dim, input_pos, v)
        if not torch.compiler.is_compiling():
            # Eager callers (Prefill, the model's own generate loop) get the written slots only, as the growing
            # cache gave them, so lengths read off the returned keys stay true; the masked slots add nothing.
            written = int(input_pos[-1]) + 1
            return k_out.narrow(self.seq_dim, 0, written), v_out.narrow(self.value_seq_dim, 0, written)
        return k_out, v_out

    def _zeros_like(self, new, seq_dim):
        # Dim 0 holds `max_batch_size` sequences, or as many rows as the first write where it has more
        # (a batch-times-heads layout).
        shape = list(new.shape)
        shape[0], shape[seq_dim] = max(self.max_batch_size, shape[0]), self.max_seq_len
        return new.new_zeros(shape)

# Inserted by cache_object and carried_cache, to build the mask buffer that a library mask helper's call
# is replaced by.
def graphmode_causal_mask(max_seq_len, sliding_window=None):
    """The additive causal mask for every position, built once (added by graphmode).

    Row p holds 0 where position p may attend and the float32 minimum elsewhere, as transformers'
    mask helpers fill it; with a sliding window, p sees only the last `sliding_window` positions.
    Columns past p are hidden, which also hides the slots a static cache has not written yet.
    """
    visible = torch.ones(max_seq_len, max_seq_len, dtype=torch.bool).tril()
    if sliding_window is not None:
        visible = visible.triu(1 - sliding_window)
    # float32 whatever the default dtype: transformers builds models under torch_dtype=float16 by switching the
    # default, and the float32 minimum would overflow there, failing the model's construction on every path.
    zeros = torch.zeros(max_seq_len, max_seq_len, dtype=torch.float32)
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
    """Rows of the causal mask for the tokens computed, (batch, 1, tokens, slots) (added by graphmode).

    A compiled graph reads every slot of the static cache; an eager call gets the written slots only
    (StaticKVBuffers.update hands back as many), so its rows stop at the last position written.
    """
    rows = causal_mask[position_ids][:, None]
    if not torch.compiler.is_compiling():
        rows = rows[..., : int(position_ids.reshape(-1)[-1]) + 1]
    return rows

# Inserted by carried_cache where a method makes a tensor for the `past + new` keys (`_new_positions`).
def graphmode_key_slots(position_ids):
    """How many key slots attention reads (added by graphmode): every slot of the static cache in a compiled
    graph, the ones written so far in an eager call."""
    if torch.compiler.is_compiling():
        return GRAPHMODE_MAX_SEQ_LEN
    return int(position_ids.reshape(-1)[-1]) + 1

# Inserted by split_decode around the body of `prefill` and `decode`: the only way onto the static path.
class GraphmodeStaticPath:
    """Puts the calls made inside `with GraphmodeStaticPath(model):` on graphmode's static path (added by graphmode).

    The `prefill` and `decode` entries are the only callers. Every other call (`forward`, `generate()`, training,
    tracing, a cache object of the caller's own) runs the model's code exactly as it was written. The switch is one
    list shared by every submodule, so the methods of one model, in any of its files, agree on it.
    """

    def __init__(self, model):
        switch = getattr(model, "graphmode_static_switch", None)
        if switch is None:
            switch = [False]
            for module in model.modules():
                module.graphmode_static_switch = switch
        self.switch = switch

    def __enter__(self):
        self.switch[0] = True

    def __exit__(self, *exc_info):
        self.switch[0] = False

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

# Inserted where a method has a static twin (transforms/static_path.py): the test at the top of the original.
def graphmode_static_path(module):
    """Whether this call came through the `prefill`/`decode` entries (added by graphmode); if not, the module runs
    its own code as written."""
    switch = getattr(module, "graphmode_static_switch", None)
    return switch is not None and switch[0]

# Inserted by split_decode at the top of `prefill` where the file sizes static buffers: the one place a request
# too large for them can be refused before anything is written (Prefill runs eagerly; Decode is compiled).
def graphmode_fits(tokens, input_pos):
    """Refuses a Prefill the static buffers cannot hold, with their sizes (added by graphmode)."""
    if not torch.compiler.is_compiling():  # Prefill runs eagerly; the reads below would wait for the device
        batch, last = tokens.shape[0], int(input_pos.max()) + 1
        if batch > GRAPHMODE_MAX_BATCH_SIZE or last > GRAPHMODE_MAX_SEQ_LEN:
            raise ValueError(
                f"the static path holds {GRAPHMODE_MAX_BATCH_SIZE} sequence(s) of {GRAPHMODE_MAX_SEQ_LEN} positions "
                f"(GRAPHMODE_MAX_BATCH_SIZE and GRAPHMODE_MAX_SEQ_LEN in this file), and this Prefill needs {batch} "
                f"of {last}; adapt again with a larger MAX_SEQ_LEN in the harness (or --batch-buckets), or call "
                "`forward`, which has no such limit"
            )
