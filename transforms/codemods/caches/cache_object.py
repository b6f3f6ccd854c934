"""Replaces a cache *object* passed through `forward` (transformers' Cache API) by buffers the model owns.

Since transformers 4.36 the attention modules write and measure a cache object:

    kv_seq_len = key_states.shape[-2]
    if past_key_value is not None:
        kv_seq_len += past_key_value.get_usable_length(kv_seq_len, self.layer_idx)
    ...
    if past_key_value is not None:
        cache_kwargs = {"sin": sin, "cos": cos}
        key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx, cache_kwargs)

Before 4.36 the cache is a tuple per layer, grown the same way in the same place:

    kv_seq_len += past_key_value[0].shape[-2]
    if past_key_value is not None:
        key_states = torch.cat([past_key_value[0], key_states], dim=2)
        value_states = torch.cat([past_key_value[1], value_states], dim=2)

and the model's forward builds the 4-D mask for the grown length with a library helper (before 4.36, a
`self._prepare_decoder_attention_mask(...)` method in the file; with a sliding window, that method's band
is the file's own and is left to a person):

    attention_mask = _prepare_4d_causal_attention_mask(
        attention_mask, (batch_size, seq_length), inputs_embeds, past_key_values_length, sliding_window=W)

(since 4.38 the model's own `self._update_causal_mask(attention_mask, inputs_embeds, cache_position, ...)`).

The three change together or not at all, since a static cache without a mask over the whole buffer would
let attention read slots not written yet:

- the write (object or tuple) becomes
  `key_states, value_states = self.kv_cache.update(cache_position, key_states, value_states)`, at the slots
  of the entries' call (`graphmode_slots(self)` where the model names only `position_ids`, which are each row's
  own positions: left-padded rows share the slots and have positions of their own),
  a `StaticKVCache` created in the attention class's `__init__` (or the same-file base class that has it). Its
  buffers take the shapes of the tensors written, keys and values apart, along the dims the traced run saw them
  grow (without a trace, the dims the write says: the `torch.cat` pair's, or the Cache API's -2): MLA's keys and
  values differ in head size, and its latent and rope key in rank, which no head count in `__init__` describes.
  Only where the trace did not see the write and `__init__` names the KV head count and head size do those size it;
- the length read from the cache becomes `self.kv_cache.max_seq_len`: attention reads the whole buffer;
- the helper call becomes the causal mask's rows of the slots, computed per call (a `GraphmodeCausalMask`,
  same sliding window: no square mask is held), with the slots the entries' 2-D padding mask holds 0 hidden
  too (`graphmode_padded_rows`; the entries hand that mask to graphmode's rows alone, never to the model's own
  code).

Neither is allocated with the model: the entry's `setup_caches(max_batch_size, max_seq_length)` sizes both (the
config's own limit by default), so a model only used through `forward` carries no static memory.

The caller's own cache keeps its length: the object is still updated beside the buffers, and a tuple handed back
holds the written slots of the buffers. So a caller that leaves `position_ids` out keeps working: the model's
forward still counts them from the cache's length, as before. The prefill/decode entries pass positions and
no cache, so the compiled Decode never touches it.

A write through a local name of the cache (5.x GPT-2, BioGPT: the cache itself, or its `self_attention_cache` or
`cross_attention_cache`, picked in if/else under `if cache is not None:`, the write nested in a branch) is the same
write: the static one goes after the top-level statement that holds it, out of the cache's guard (the entries pass
no cache), and only for self-attention; cross-attention (where the name is its cache under a test) keeps the
caller's cache, which a decoder-only model never hands it.

A 5.x model that names no positions anywhere (MPT: `create_causal_mask(config=..., inputs_embeds=..., cache=cache)`,
the mask cast with `.to(torch.bool)`, and `query_length = n if cache is None else n + cache.get_seq_length()` in
attention to cut its ALiBi bias) writes and masks at the entries' slots too. Where such a method counts positions from
the cache's length itself (TrOCR: `cache_length = cache.get_seq_length()` handed to its positional embedding), the
static path, which carries no cache, would count from 0 at every step: the mask is left, naming that line, and with
it the cache.

FlashAttention classes are left as they are and reported: their kernels take a 2-D padding mask, so they
cannot hide the unwritten slots of a static cache.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.codemods.base import GraphCodemod
from graphmode.transforms.codemods.lib.call_graph import CallGraph, class_tables
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import CACHE_CLASS, MASK_BUILDER, MASK_CLASS, PADDED_ROWS, \
    SLOTS
from graphmode.transforms.codemods.lib.kv_caches import HEAD_DIM_ATTRIBUTES, KV_HEAD_ATTRIBUTES, cat_of_past, \
    size_in_init
from graphmode.transforms.codemods.lib.mask_recognition import MASK_HELPERS, mask_helper_call
from graphmode.transforms.codemods.lib.module import append_to_init, defined_at_top, insert_after_imports, \
    remove_imports_if_unused, self_attributes, transform_statements
from graphmode.transforms.cstutil import calls_in, code_of, dotted_name, find_method, names_in, nodes_of_type, \
    none_test, only_raises, short_code, single_assignment, walk
from graphmode.transforms.dispatch import Transformer
from graphmode.transforms.vocabulary import CACHE_OBJECT_LENGTHS, CACHE_OBJECT_WRITE, CACHE_POSITION_MASK_HELPERS, \
    KEYWORD_MASK_HELPERS, SAME_FILE_MASK_HELPERS, SLIDING_KEYWORD_MASK_HELPERS

# The helpers inserted by name; their code is in helper-code/helpers.py.
WRITTEN_SLOTS = "graphmode_written"
# Why a cache was left where its file builds no mask (transforms.pipeline.adapt_files looks for it: the mask may be
# built in a file that imports the attention's layers).
NO_MASK_HELPER = "no mask helper (`_prepare_4d_causal_attention_mask`) was found to hide unwritten slots"
_ALL_MASK_HELPERS = MASK_HELPERS | CACHE_POSITION_MASK_HELPERS | KEYWORD_MASK_HELPERS | SLIDING_KEYWORD_MASK_HELPERS
# Where a method finds the cache slots of the tokens it computes: the positions shared by every row.
_SLOT_SOURCES = {"cache_position": "cache_position", "position_ids": f"{SLOTS}(self)"}
# How the mask rows for the computed tokens are picked, shaped (batch, 1, new tokens, max length).


def _slots_of(position: str | None) -> str:
    """Where the mask rows' slots come from: the method's `cache_position`, else (its `position_ids` are each row's
    own, or it has no positions) the slots of the entries' call."""
    return _SLOT_SOURCES.get(position or "position_ids")


def _cast_mask_call(stmt: cst.CSTNode, helpers: frozenset[str]) -> tuple[str, cst.Call, str] | None:
    """`X = helper(...)` -> ("X", the call, ""); `X = helper(...).to(torch.bool)` (5.x MPT) -> ("X", the call,
    ".to(torch.bool)"): the cast applies to the rows that replace the call as it applied to the helper's mask."""
    found = mask_helper_call(stmt, helpers)
    if found is not None:
        return (*found, "")
    assigned = single_assignment(stmt)
    value = assigned[1] if assigned else None
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "to" \
            and isinstance(value.func.value, cst.Call):
        inner = value.func.value
        if (dotted_name(inner.func) or "").rsplit(".", 1)[-1] in helpers:
            return assigned[0], inner, code_of(value)[len(code_of(inner)):]
    return None


def _own_method_named_like_a_library_helper(call: cst.Call) -> bool:
    """`self.create_causal_mask(...)`: the model's own method (x-transformers' attend.py), not transformers'
    `create_causal_mask`, which is a function of `masking_utils`; its mask is the model's own."""
    return (code_of(call.func).startswith("self.")
            and code_of(call.func).rsplit(".", 1)[-1] in KEYWORD_MASK_HELPERS | SLIDING_KEYWORD_MASK_HELPERS)


def _length_read(method: cst.FunctionDef, caches: set[str]) -> cst.Call | None:
    """The first call reading a length off one of the cache parameters (`cache.get_seq_length()`), else None."""
    lengths = {f"{cache}.{name}" for cache in caches for name in CACHE_OBJECT_LENGTHS}
    return next((call for call in calls_in(method.body) if dotted_name(call.func) in lengths), None)


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(indent=True, comment=cst.Comment(f"# graphmode: {text}"))


def _calls_on(node: cst.CSTNode, receivers: set[str], methods: set[str]) -> list[cst.Call]:
    """Calls `R.m(...)` under node, R a Name in receivers and m in methods."""
    return [call for call in calls_in(node) if isinstance(call.func, cst.Attribute)
            and isinstance(call.func.value, cst.Name) and call.func.value.value in receivers
            and call.func.attr.value in methods]


def _guarded_block(stmt: cst.BaseStatement, cache: str) -> list[cst.BaseStatement] | None:
    """The body of `if <cache> is not None:` (without else), else None."""
    if isinstance(stmt, cst.If) and stmt.orelse is None and none_test(stmt.test) == (cache, False) \
            and isinstance(stmt.body, cst.IndentedBlock):
        return list(stmt.body.body)
    return None


def _write(stmt: cst.BaseStatement, cache: str) -> tuple[str, str] | None:
    """`K, V = <cache>.update(K, V, ...)` -> ("K", "V")."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    target, call = assign.targets[0].target, assign.value
    if len(assign.targets) != 1 or not isinstance(target, cst.Tuple) or len(target.elements) != 2 \
            or not isinstance(call, cst.Call) or dotted_name(call.func) != f"{cache}.{CACHE_OBJECT_WRITE}":
        return None
    names = [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
    args = [a.value.value for a in call.args[:2] if a.keyword is None and isinstance(a.value, cst.Name)]
    return (names[0], names[1]) if len(names) == 2 and names == args else None


def _tuple_write(block: list[cst.BaseStatement], cache: str) -> tuple[str, str] | None:
    """`K = torch.cat([cache[0], K], dim=2)` and `V = torch.cat([cache[1], V], dim=2)` -> ("K", "V")."""
    cats = [cat_of_past(s) for s in block]
    if len(cats) != 2 or not all(cats) or any(c[1] != cache or c[3] not in (2, -2) for c in cats) \
            or sorted(c[2] for c in cats) != [0, 1]:
        return None
    keys, values = sorted(cats, key=lambda c: c[2])
    return keys[0], values[0]


def _write_statement(stmt: cst.BaseStatement, cache: str) -> tuple[str, str] | None:
    """The write alone, or `if cache is not None:` holding the write and assignments only it reads; or, for a
    tuple cache, `if cache is not None:` holding the `torch.cat` pair."""
    found = _write(stmt, cache)
    if found:
        return found
    block = _guarded_block(stmt, cache)
    if block is None:
        return None
    tuple_write = _tuple_write(block, cache)
    if tuple_write:
        return tuple_write
    found_in = [(s, _write(s, cache)) for s in block]
    writes = [(s, w) for s, w in found_in if w]
    if len(writes) != 1:
        return None
    write_stmt, write = writes[0]
    for helper, _ in found_in:  # e.g. `cache_kwargs = {...}`, read by the write and nothing else
        if helper is write_stmt:
            continue
        assigned = single_assignment(helper)
        if assigned is None or assigned[0] not in names_in(write_stmt):
            return None
    return write


def _callers_copy(write: cst.BaseStatement, cache: str) -> cst.If:
    """The object write kept for the caller, its result unused: `if cache is not None: cache.update(k, v, ...)`.

    Eager callers that pass the cache and no positions count positions from its length."""
    def bare(stmt: cst.BaseStatement) -> cst.BaseStatement:
        if _write(stmt, cache) is None:
            return stmt
        call = stmt.body[0].value
        return stmt.with_changes(body=[cst.Expr(call)])

    comment = _comment("the caller's cache still grows (its length counts positions).")
    if isinstance(write, cst.If):
        return write.with_changes(body=write.body.with_changes(body=[bare(s) for s in write.body.body]),
                                  leading_lines=[*write.leading_lines, comment])
    return cst.If(test=cst.parse_expression(f"{cache} is not None"),
                  body=cst.IndentedBlock(body=[bare(write).with_changes(leading_lines=[])]),
                  leading_lines=[*write.leading_lines, comment])


def _returned_tuple(after: list[cst.BaseStatement], cache: str, keys: str, values: str) -> cst.BaseStatement | None:
    """`cache = (K, V) if use_cache else None` after a tuple write: the grown cache handed back to the caller."""
    for stmt in after:
        assigned = single_assignment(stmt)
        if assigned and assigned[0] in (keys, values):
            return None  # rebound first
        if assigned and assigned[0] == cache:
            return stmt if _key_value_tuples(assigned[1], keys, values) else None
    return None


def _key_value_tuples(node: cst.CSTNode, keys: str, values: str) -> list[cst.Tuple]:
    return [t for t in nodes_of_type(node, cst.Tuple) if [code_of(e.value) for e in t.elements] == [keys, values]]


class _WrittenSlots(Transformer):
    """`(K, V)` -> `graphmode_written(K, V, slots)`: the caller's tuple holds the written slots only."""

    def __init__(self, keys: str, values: str, slots: str) -> None:
        self.pair, self.slots = [keys, values], slots

    def leave_Tuple(self, original_node: cst.Tuple, updated_node: cst.Tuple) -> cst.BaseExpression:
        if [code_of(e.value) for e in original_node.elements] != self.pair:
            return updated_node
        return cst.parse_expression(f"{WRITTEN_SLOTS}({self.pair[0]}, {self.pair[1]}, {self.slots})")


def _length_statement(stmt: cst.BaseStatement, cache: str) -> str | None:
    """`if cache is not None: [checks] X += cache.get_usable_length(...)` -> "X"; also its one-line form,
    `X = n if cache is None else n + cache.get_seq_length()` (5.x MPT), -> "X"."""
    conditional = _conditional_length(stmt, cache)
    if conditional is not None:
        return conditional
    block = _guarded_block(stmt, cache)
    if not block or not all(only_raises(s) for s in block[:-1]):
        return None
    last = block[-1]
    if not (isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1
            and isinstance(last.body[0], cst.AugAssign) and isinstance(last.body[0].operator, cst.AddAssign)
            and isinstance(last.body[0].target, cst.Name)):
        return None
    value = last.body[0].value
    if isinstance(value, cst.Call) and dotted_name(value.func) in {f"{cache}.{name}" for name in CACHE_OBJECT_LENGTHS}:
        return last.body[0].target.value
    if code_of(value).replace(" ", "") in {f"{cache}[0].shape[-2]", f"{cache}[0].shape[2]", f"{cache}[0].size(-2)"}:
        return last.body[0].target.value  # a tuple cache: the keys' length
    return None


def _conditional_length(stmt: cst.BaseStatement, cache: str) -> str | None:
    """`X = n if cache is None else n + cache.get_seq_length()` (or the arms the other way round under
    `is not None`, the sum in either order) -> "X": the past-and-new length, counted from the cache where there is
    one."""
    assigned = single_assignment(stmt)
    if assigned is None or not isinstance(assigned[1], cst.IfExp):
        return None
    value = assigned[1]
    tested = none_test(value.test)
    if tested is None or tested[0] != cache:
        return None
    plain, counted = (value.body, value.orelse) if tested[1] else (value.orelse, value.body)
    return assigned[0] if _plus_length(counted, plain, cache) else None


def _plus_length(counted: cst.BaseExpression, plain: cst.BaseExpression, cache: str) -> bool:
    """`counted` is `plain + cache.get_seq_length()` (or the sum the other way round)."""
    if not (isinstance(counted, cst.BinaryOperation) and isinstance(counted.operator, cst.Add)):
        return False
    lengths = {f"{cache}.{name}" for name in CACHE_OBJECT_LENGTHS}
    return any(isinstance(read, cst.Call) and dotted_name(read.func) in lengths
               and code_of(other).replace(" ", "") == code_of(plain).replace(" ", "")
               for read, other in ((counted.left, counted.right), (counted.right, counted.left)))


def _stray_uses(method: cst.FunctionDef, cache: str, recognised: list[cst.BaseStatement]) -> list[cst.CSTNode]:
    """Reads of the cache (`cache[i]`, `cache.m(...)`) outside the statements the rewrite replaces."""
    skipped = set(recognised)
    found = []
    for node in walk(method.body, lambda n: [] if n in skipped else None):
        if node in skipped:
            continue
        read = node.value if isinstance(node, cst.Subscript) else \
            node.func.value if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) else None
        if isinstance(read, cst.Name) and read.value == cache:
            found.append(node)
    return found


@dataclass
class _Plan:
    """Every rewrite of the file, by node identity in the tree analysed."""

    replace: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    drop: set[cst.CSTNode] = field(default_factory=set)
    after: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=dict)  # statements added after a node
    init_lines: dict[str, list[cst.BaseStatement]] = field(default_factory=dict)  # class -> lines for __init__
    writes: list[cst.CSTNode] = field(default_factory=list)  # the cache writes replaced, in file order
    masks: int = 0
    windows: set[str] = field(default_factory=set)
    incomplete: bool = False  # a cache or mask was recognised but could not be rewritten
    written: bool = False  # a tuple handed back to the caller holds the written slots (WRITTEN_SLOTS)
    helpers: set[str] = field(default_factory=set)  # the mask helpers whose calls were replaced
    reads_slots: bool = False  # the slots come from the entries' call (SLOTS): the model names only position_ids


def _picked_mask_helpers(method: cst.FunctionDef) -> dict[str, cst.BaseExpression]:
    """Local names bound to one of the keyword mask helpers picked by whether the window is None (5.x Mistral:
    `mask_function = create_causal_mask if self.config.sliding_window is None else
    create_sliding_window_causal_mask`), with that window: the sliding-window helper applies it, so the mask built is
    the causal mask with `sliding_window=<it>` either way (a None window is none)."""
    picked: dict[str, cst.BaseExpression] = {}
    for stmt in nodes_of_type(method, cst.SimpleStatementLine):
        assigned = single_assignment(stmt)
        if assigned and isinstance(assigned[1], cst.IfExp) and (window := _window_picking(assigned[1])) is not None:
            picked[assigned[0]] = window
    return picked


def _window_picking(pick: cst.IfExp) -> cst.BaseExpression | None:
    """The window of `plain if window is None else sliding` (or `sliding if window is not None else plain`), plain a
    keyword mask helper and sliding its sliding-window one; None for any other conditional."""
    test = pick.test
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and code_of(test.comparisons[0].comparator) == "None"
            and isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot))):
        return None
    names = [code_of(pick.body), code_of(pick.orelse)]
    if isinstance(test.comparisons[0].operator, cst.IsNot):
        names.reverse()  # `sliding if window is not None else plain`
    return test.left if names[0] in KEYWORD_MASK_HELPERS and names[1] in SLIDING_KEYWORD_MASK_HELPERS else None


def _helper_window(call: cst.Call, helper: str, picked: dict[str, cst.BaseExpression]
                   ) -> tuple[cst.BaseExpression | None, str | None]:
    """The sliding window of a mask helper's call (None: none), or why it is not known."""
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if helper in picked:
        window = picked[helper]
    elif helper.rsplit(".", 1)[-1] in SLIDING_KEYWORD_MASK_HELPERS:
        config = keywords.get("config")
        if config is None:
            return None, "the call does not pass `config=`, whose `sliding_window` it applies"
        window = cst.parse_expression(f"{code_of(config)}.sliding_window")
    else:
        return keywords.get("sliding_window"), None
    if names_in(window) - {"self"}:  # the mask is built in `__init__`, which has `self` alone
        return None, "the sliding window is not an attribute of `self`, so it cannot be built in `__init__`"
    return window, None


def _mask_input_shape(cls: cst.ClassDef, call: cst.Call, position: str | None,
                      has_init: bool, helper: str | None = None) -> tuple[cst.Tuple | None, str | None]:
    """The `(batch, length)` a mask helper's call builds its mask for, as the call gives it; or why the call cannot
    become rows of a mask buffer (the words of the item left for a person). `helper`: the library helper a local
    name called stands for (`_picked_mask_helpers`)."""
    positional = [a.value for a in call.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    shape = positional[1] if len(positional) > 1 else None
    window = keywords.get("sliding_window")
    helper = helper or code_of(call.func).rsplit(".", 1)[-1]
    if not has_init:
        return None, "its class has no `__init__` to build the mask in"
    if position is None and helper not in KEYWORD_MASK_HELPERS | SLIDING_KEYWORD_MASK_HELPERS:
        return None, "the method takes no `position_ids`/`cache_position`"
    if helper in CACHE_POSITION_MASK_HELPERS:
        # (attention_mask, inputs_embeds, cache_position, ...): the shape is the embeddings'.
        builder = find_method(cls, helper)
        if position != "cache_position" or shape is None or keywords:
            return None, "the call does not pass `(attention_mask, inputs_embeds, cache_position, ...)`"
        if builder is None or "sliding_window" in code_of(builder):
            return None, f"`{helper}` is not defined in this class, or applies a sliding window of its own"
        return _shape_of(shape), None
    if helper in KEYWORD_MASK_HELPERS | SLIDING_KEYWORD_MASK_HELPERS:
        # (config=, input_embeds=, cache_position=, ...): the shape is the embeddings', the rows the slots. 4.5x
        # spells them `input_embeds=` and `cache_position=`; 5.x `inputs_embeds=` and passes no cache_position at
        # all (`position_ids=`, the method's own, with the cache it measures the past by): the slots of the entries'
        # call pick the rows then, as for any method that names only `position_ids`.
        embeds = keywords.get("input_embeds", keywords.get("inputs_embeds"))
        slots = keywords.get("cache_position", keywords.get("position_ids"))
        # A 5.x call may pass no positions at all (BioGPT's): the helper then counts the past in the cache it is
        # given, so its rows are the new tokens' own positions, which the entries' slots are too.
        # So may a method that takes no positions at all (5.x MPT, TrOCR): the entries' slots are its rows too.
        measured = slots is None and position in (None, "position_ids") and bool(
            {"cache", "past_key_values"} & set(keywords))
        if positional or embeds is None or not (
                measured or (slots is not None and code_of(slots) == position)):
            return None, ("the call does not pass `input_embeds=` (or `inputs_embeds=`) and this method's "
                          "`cache_position=` (or `position_ids=`) by keyword")
        return _shape_of(embeds), None
    if not (isinstance(shape, cst.Tuple) and len(shape.elements) == 2) or set(keywords) - {"sliding_window"}:
        return None, "the call does not pass the input shape as `(batch, length)`"
    if window is not None and helper in SAME_FILE_MASK_HELPERS:
        return None, "the helper is defined in this file with its own sliding-window band"
    if window is not None and names_in(window) - {"self"}:
        return None, "the sliding window is not an attribute of `self`, so it cannot be built in `__init__`"
    return shape, None


def _shape_of(embeddings: cst.BaseExpression) -> cst.Tuple:
    """`(x.shape[0], x.shape[1])` of the embeddings a helper is given."""
    return cst.Tuple([cst.Element(cst.parse_expression(f"{code_of(embeddings)}.shape[{i}]")) for i in (0, 1)])


def _caches_written(method: cst.FunctionDef, params: set[str]) -> set[str]:
    """The parameters the method writes as cache objects (`past.update(k, v, ...)`, or through a local name of it,
    `_Alias`), or, where it takes the slots
    (`cache_position`, `position_ids`), as tuples guarded by their own test (an int position's tuple cache is
    static_kv_cache's)."""
    caches = {c.func.value.value for c in _calls_on(method, params, {CACHE_OBJECT_WRITE}) if len(c.args) >= 2}
    aliases = _cache_aliases(method, params)
    caches |= {aliases[c.func.value.value].cache for c in _calls_on(method, set(aliases), {CACHE_OBJECT_WRITE})
               if len(c.args) >= 2}
    if any(p in params for p in _SLOT_SOURCES):
        caches |= {p for p in params if p not in caches and any(
            _guarded_block(s, p) and _tuple_write(_guarded_block(s, p), p) for s in method.body.body)}
    return caches


# The caches an encoder-decoder cache object holds (transformers' `EncoderDecoderCache`), and whether each is the
# cross-attention's.
_SUB_CACHES = {"self_attention_cache": False, "cross_attention_cache": True}


@dataclass
class _Alias:
    """A local name the method writes its cache parameter through (transformers 5.x GPT-2, BioGPT):

        if cache is not None:
            if isinstance(cache, EncoderDecoderCache):
                if is_cross_attention:
                    curr_cache = cache.cross_attention_cache
                else:
                    curr_cache = cache.self_attention_cache
            else:
                curr_cache = cache
        ...
        key_states, value_states = curr_cache.update(key_states, value_states, self.layer_idx)

    `cross`: the test under which the name is the cross-attention's cache (None: it never is)."""

    name: str
    cache: str
    cross: cst.BaseExpression | None


def _cache_aliases(method: cst.FunctionDef, params: set[str]) -> dict[str, _Alias]:
    """The local names bound only to a cache parameter or to its self-/cross-attention cache, the cross-attention's
    only in the body of one `if` (whose test then says when the name is the cross-attention's cache)."""
    bound: dict[str, list[cst.BaseExpression]] = {}
    for stmt in nodes_of_type(method.body, cst.SimpleStatementLine):
        if (assigned := single_assignment(stmt)) is not None:
            bound.setdefault(assigned[0], []).append(assigned[1])
    cross_tests: dict[str, list[cst.BaseExpression]] = {}
    for branch in nodes_of_type(method.body, cst.If):
        for stmt in branch.body.body if isinstance(branch.body, cst.IndentedBlock) else []:
            assigned = single_assignment(stmt)
            value = assigned[1] if assigned else None
            if isinstance(value, cst.Attribute) and value.attr.value in _SUB_CACHES and _SUB_CACHES[value.attr.value]:
                cross_tests.setdefault(assigned[0], []).append(branch.test)
    aliases = {}
    for name, values in bound.items():
        caches = {code_of(v) if isinstance(v, cst.Name) else code_of(v.value) if isinstance(v, cst.Attribute)
                  and v.attr.value in _SUB_CACHES else None for v in values}
        if name in params or len(caches) != 1 or not caches <= params:
            continue
        crosses = sum(isinstance(v, cst.Attribute) and _SUB_CACHES[v.attr.value] for v in values)
        tests = cross_tests.get(name, [])
        if crosses != len(tests) or len({code_of(t) for t in tests}) > 1:
            continue  # a cross-attention cache bound elsewhere than in one test's body
        aliases[name] = _Alias(name, caches.pop(), tests[0] if tests else None)
    return aliases


def _known_before(body: list[cst.BaseStatement], index: int, test: cst.BaseExpression, params: set[str]) -> bool:
    """Whether every name the test reads is a parameter, or bound by a top-level statement before body[index] and
    nowhere else in the method: the static write after that statement asks the test again."""
    bound_before = {assigned[0] for stmt in body[:index] if (assigned := single_assignment(stmt))}
    bound = [assigned[0] for stmt in body for node in nodes_of_type(stmt, cst.SimpleStatementLine)
             if (assigned := single_assignment(node))]
    return all(name in params or (name in bound_before and bound.count(name) == 1) for name in names_in(test))


def _parenthesized(test: cst.BaseExpression) -> cst.BaseExpression:
    """The test as the operand of `not`: a bare name or attribute as it is, anything else in parentheses."""
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call)) or test.lpar:
        return test
    return test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _unrecognised(method: cst.FunctionDef, cache: str, slots: str | None, writes: dict,
                  recognised: list[cst.BaseStatement], line_of: Callable[[cst.CSTNode], int]) -> str | None:
    """Why the method's cache cannot be made static, in the words of the item left for a person; None when it can.
    The first read not recognised is named with its line: it is what a person has to change."""
    if slots is None:
        return "takes neither `position_ids` nor `cache_position`, so the slots to write are not known"
    stray = _stray_uses(method, cache, recognised)
    if len(writes) != 1 or stray:
        what = f"`{short_code(code_of(stray[0]))}` at line {line_of(stray[0])}" if stray else \
            f"{len(writes)} writes of `{cache}`"
        return (f"`{cache}` is written or read in a form not recognised: {what} (expected one "
                f"`k, v = {cache}.update(k, v, ...)` or `torch.cat([{cache}[0], k], dim=2)` pair, and "
                f"`n += {cache}.get_usable_length(...)` or `{cache}[0].shape[-2]`)")
    return None


@dataclass
class _WriteSite:
    """Where a method writes its cache parameter: `writes` maps the index of each top-level statement that holds a
    write to the keys and values it writes (`_write_statement`), `written` lists the writing statements themselves,
    and `alias` is the one local name they write through (None: the parameter itself; `aliases` lists every
    candidate name, more than one being a problem)."""

    method: cst.FunctionDef
    writes: dict[int, object]
    written: list[cst.BaseStatement]
    alias: _Alias | None
    aliases: list[_Alias]


def _write_site(method: cst.FunctionDef, params: set[str], body: list[cst.BaseStatement], cache: str) -> _WriteSite:
    """The statements that write `cache`, directly or through a local name of it (`_WriteSite`)."""
    aliases = [a for a in _cache_aliases(method, params).values()
               if a.cache == cache and _calls_on(method, {a.name}, {CACHE_OBJECT_WRITE})]
    alias = aliases[0] if len(aliases) == 1 else None
    if alias is None:
        writes = {i: w for i, s in enumerate(body) if (w := _write_statement(s, cache))}
        return _WriteSite(method, writes, [body[i] for i in writes], None, aliases)
    # Written through the alias, wherever it is nested: by the top-level statement that holds it.
    written = [s for s in nodes_of_type(method.body, cst.SimpleStatementLine) if _write(s, alias.name)]
    writes = {i: _write(w, alias.name) for w in written for i, s in enumerate(body) if any(n is w for n in walk(s))}
    return _WriteSite(method, writes, written, alias, aliases)


def _create_cache_once(plan: _Plan, owner: str, cache_class: str) -> None:
    """`self.kv_cache = ...` in the owner's `__init__`, once per attention module: a subclass's write (SDPA) uses its
    base's. Where one write of a class was seen by the trace and another was not, the buffers shaped by the writes
    serve both."""
    lines = plan.init_lines.setdefault(owner, [])
    created = next((i for i, line in enumerate(lines) if "self.kv_cache = " in code_of(line)), None)
    line = cst.parse_statement(f"self.kv_cache = {cache_class}\n")
    if created is None:
        lines.append(line)
    elif f"{CACHE_CLASS}(seq_dim=" in cache_class:
        lines[created] = line


class CacheObject(GraphCodemod):
    NAME = "cache_object"
    SIZES_BUFFERS = True
    TITLE = "Replace the cache object by preallocated buffers and a mask built once"
    DESCRIPTION = (
        "Where attention writes a cache object (`past_key_value.update(k, v, layer_idx, ...)`, transformers' Cache "
        "API) or grows a tuple cache with `torch.cat` while positions come as `position_ids`, it writes a "
        f"`{CACHE_CLASS}` instead, whose buffers take the shapes of the keys and values written (each apart, along "
        "the dims the traced run saw them grow; `(batch, kv heads, length, head_dim)` from the names in `__init__` "
        "where the write was not traced), "
        "with `index_copy_` at the positions; the length read from the cache (`get_usable_length`, "
        "`past_key_value[0].shape[-2]`) becomes the static cache's length, since attention reads the whole buffer; "
        "and the 4-D mask built per call by `_prepare_4d_causal_attention_mask[_for_sdpa]` (or the model's "
        "`_prepare_decoder_attention_mask` or `_update_causal_mask`) becomes rows of one mask built once (same "
        "sliding window), picked by `position_ids`. Both are sized by the entry's `setup_caches`, not with the model. "
        "Every Decode step then has the same shapes and addresses. The "
        "entries pass positions and no cache; a caller that passes `past_key_values` still gets back a cache of the "
        "true length (its length gives the positions when `position_ids` is left out): a cache object is still "
        "updated in such eager calls (a second copy of the keys and values), a tuple holds the written slots of the "
        "buffers. On the static path the rows of a batch share the slots, each with positions of its own, and the "
        "caller's 2-D padding mask hides its padded slots (left padding)."
    )
    SKILL = "static-kv-cache"
    FIXES = frozenset({"GM201", "GM301", "GM303", "GM502"})

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return not words.isdisjoint({CACHE_OBJECT_WRITE, *_SLOT_SOURCES, *_ALL_MASK_HELPERS})

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        classes = {s.name.value: s for s in tree.body if isinstance(s, cst.ClassDef)}
        self._tree, self._calls = tree, None  # the call graph is built only where a method needs its callers
        plan = _Plan()
        for cls in classes.values():
            for method in cls.body.body:
                if isinstance(method, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock):
                    # A method whose words name no write (`.update`, `torch.cat`) or mask helper is not walked.
                    words = self.source.function_words(f"{cls.name.value}.{method.name.value}")
                    if not words.isdisjoint({CACHE_OBJECT_WRITE, "cat"}):
                        self._plan_cache(classes, cls, method, plan)
                    if not words.isdisjoint(_ALL_MASK_HELPERS):
                        self._plan_model(cls, method, plan)
        # The writes may be in a module this file imports its layers from, made static there (Options.
        # static_caches_in): the mask built here then follows them, or the static cache would attend unwritten slots.
        elsewhere = not plan.writes and bool(self.options.static_caches_in) and plan.masks > 0
        if not plan.writes and not elsewhere:
            self.edits.clear()  # mask helpers alone stay: the dynamic cache still matches their masks
            return tree
        # All or nothing: a static cache needs every attention path rewritten and a mask over the whole buffer.
        problem = None
        if plan.incomplete:
            problem = "another part of it could not be rewritten (see the item for it)"
        elif plan.masks == 0 and not self.options.masks_in:
            problem = NO_MASK_HELPER
        elif len(plan.windows) > 1:
            problem = "the masks use different sliding windows"
        if problem:
            self.edits.clear()
            if plan.writes:
                self.record_manual(plan.writes[0], f"the cache was not replaced: {problem}")
            return tree
        # Only the statements holding a planned node are walked, and in them only the nodes on the way to one.
        touched = {self.source.top_level_statement(n) for n in [*plan.replace, *plan.drop, *plan.after]}
        on_the_way: set[cst.CSTNode] = set()
        parents = self.source.parents
        for node in [*plan.replace, *plan.drop, *plan.after]:
            while (node := parents.get(node)) is not None and node not in on_the_way:
                on_the_way.add(node)
        module = transform_statements(tree, _Apply(plan, on_the_way),
                                      touched | {classes[name] for name in plan.init_lines})
        module = remove_imports_if_unused(module, plan.helpers, self.source)
        for helper in (MASK_BUILDER, MASK_CLASS, PADDED_ROWS, *([SLOTS] if plan.reads_slots else [])):
            if not defined_at_top(module, helper):
                module = insert_after_imports(module, helper_statements(helper))
        if plan.written and not defined_at_top(module, WRITTEN_SLOTS):
            module = insert_after_imports(module, helper_statements(WRITTEN_SLOTS))
        if plan.writes and not defined_at_top(module, CACHE_CLASS):
            module = insert_after_imports(module, helper_statements(CACHE_CLASS))
        return module

    # -- the cache writes and lengths, in attention methods -----------------------------------------
    def _plan_cache(self, classes: dict[str, cst.ClassDef], cls: cst.ClassDef, method: cst.FunctionDef,
                    plan: _Plan) -> None:
        params = {p.name.value for p in method.params.params}
        caches = _caches_written(method, params)
        if not caches or "self.kv_cache.update(" in self.code_to_search(method):
            return  # nothing, or static already (a second run)
        where = f"{cls.name.value}.{method.name.value}"
        if len(caches) > 1:
            self.record_manual(method, f"`{where}` writes more than one cache object")
            plan.incomplete = True
            return
        cache = caches.pop()
        if "flash" in cls.name.value.lower():
            self.record_manual(method, f"`{where}` is a FlashAttention path: its kernels take a 2-D padding mask "
                                       "and cannot hide unwritten slots of a static cache; it keeps the cache object "
                                       "(use the eager or sdpa attention with the adapted model)", advisory=True)
            return
        slots = self._slot_source(classes, cls, method, params)
        plan.reads_slots |= slots == _SLOT_SOURCES["position_ids"]
        body = list(method.body.body)
        site = _write_site(method, params, body, cache)
        lengths = {i: n for i, s in enumerate(body) if (n := _length_statement(s, cache))}
        problem = _unrecognised(method, cache, slots, site.writes, [*site.written, *(body[i] for i in lengths)],
                                lambda node: self._lines(node)[0]) \
            or self._alias_problem(body, site, cache, params)
        sizing = None if problem else self._sizing(classes, cls, site.written[0], cache)
        if not problem and sizing is None:
            problem = "has no `__init__` of its own or in a base class of this file to create the static cache in"
        if problem:
            self.record_manual(method, f"`{where}` {problem}; change its cache by hand")
            plan.incomplete = True
            return
        owner, cache_class, sized_by = sizing
        if site.alias is None:
            write = self._static_write(plan, body, *next(iter(site.writes.items())), cache, slots)
        else:
            write = self._static_alias_write(plan, body[next(iter(site.writes))], site.written[0], site.alias, slots)
        self.record_edit(write, f"attention reads `self.kv_cache` ({sized_by}), written at `{slots}`, instead of "
                                f"`{cache}`")
        plan.writes.append(write)
        self._fixed_lengths(plan, body, lengths, cache)
        _create_cache_once(plan, owner.name.value, cache_class)

    def _slot_source(self, classes: dict[str, cst.ClassDef], cls: cst.ClassDef, method: cst.FunctionDef,
                     params: set[str]) -> str | None:
        """What the static write is indexed by: the method's own positions, or, where it has none, the entries'."""
        slots = next((_SLOT_SOURCES[p] for p in _SLOT_SOURCES if p in params), None)
        if slots is None and (self._positions_through_kwargs(classes, cls, method)
                              or isinstance(method.params.star_kwarg, cst.Param)):
            # Without positions of its own, a 5.x attention (GPT-2's, MPT's: `**kwargs`, called by the model's
            # own layers) still writes through the Cache API, whose `update` appends after what the cache holds:
            # on the entries' path, those are the slots the entries are called with.
            slots = _SLOT_SOURCES["position_ids"]
        return slots

    def _alias_problem(self, body: list[cst.BaseStatement], site: _WriteSite, cache: str,
                       params: set[str]) -> str | None:
        """Why a write through a local name of the cache (`_Alias`) cannot be followed by the static write, or None."""
        alias = site.alias
        if len(site.aliases) > 1 or alias and _stray_uses(site.method, alias.name, site.written):
            return (f"writes `{cache}` through more than one local name, or reads its local name in a form not "
                    f"recognised (expected one `k, v = <name>.update(k, v, ...)`)")
        if alias is None:
            return None
        holder = next(iter(site.writes))
        if alias.cross is not None and not _known_before(body, holder, alias.cross, params):
            return (f"writes the cross-attention's cache when `{code_of(alias.cross)}`, whose names are not bound "
                    "once, before the statement that holds the write, so the static write after it cannot ask the "
                    "same test")
        if not self._after_holder(body[holder], site.written[0], set(_write(site.written[0], alias.name))):
            return (f"writes `{cache}` through `{alias.name}` inside a loop, `with` or `try`, or binds the keys or "
                    "values again after the write in the statement that holds it, so the static write cannot "
                    "follow that statement")
        return None

    def _positions_through_kwargs(self, classes: dict[str, cst.ClassDef], cls: cst.ClassDef,
                                  method: cst.FunctionDef) -> bool:
        """Whether the method is handed `position_ids` through its `**kwargs`: every same-file call of it passes
        `position_ids=` by keyword (transformers 5.x: `LlamaDecoderLayer.forward` calls `self.self_attn(...,
        position_ids=position_ids, **kwargs)` into `LlamaAttention.forward(..., cache=None, **kwargs)`). The model
        then has positions, and the slots of the entries' call are the ones to write. The signature is left alone: a
        named parameter would take `position_ids` out of the `**kwargs` the method hands on (attention kernels that
        read them there, flash attention's packed sequences)."""
        if not isinstance(method.params.star_kwarg, cst.Param):
            return False
        if self._calls is None:
            self._calls = CallGraph(classes, class_tables(self._tree, set(classes)))
        sites = self._calls.callers.get((cls.name.value, method.name.value), [])
        return bool(sites) and all(any(a.keyword is not None and a.keyword.value == "position_ids" for a in call.args)
                                   for _, call in sites)

    def _static_write(self, plan: _Plan, body: list[cst.BaseStatement], write_index: int,
                      keys_values: tuple[str, str], cache: str, slots: str) -> cst.BaseStatement:
        """The cache object's write replaced by the static cache's (the caller's own object still gets its copy
        where the write is not guarded by it); the write statement."""
        keys, values = keys_values
        write = body[write_index]
        static = cst.parse_statement(f"{keys}, {values} = self.kv_cache.update({slots}, {keys}, {values})\n")
        guarded = _guarded_block(write, cache)
        if guarded is not None and _tuple_write(guarded, cache):
            plan.replace[write] = static.with_changes(leading_lines=[*write.leading_lines, _comment(
                "written in place; attention reads all slots.")])
            returned = _returned_tuple(body[write_index + 1:], cache, keys, values)
            if returned is not None:  # eager callers read the past length off the tuple they get back
                plan.replace[returned] = returned.visit(_WrittenSlots(keys, values, slots))
                plan.written = True
                self.record_edit(returned, f"`{cache}` hands the caller the written slots of the buffers")
        else:
            plan.replace[write] = cst.FlattenSentinel([_callers_copy(write, cache), static.with_changes(
                leading_lines=[_comment("attention reads the preallocated cache, written in place.")])])
        return write

    def _after_holder(self, top: cst.BaseStatement, write: cst.SimpleStatementLine, written: set[str]) -> bool:
        """Whether the static write may follow `top`, the top-level statement that holds a nested write: only
        `if`/`else` branches lead from it to the write (one pass, no `with` or `except` in between), and no
        statement after the write in it binds the keys or values again (they are the ones written)."""
        node, parents = write, self.source.parents
        while (node := parents.get(node)) is not None and node is not top:
            if not isinstance(node, (cst.If, cst.Else, cst.IndentedBlock)):
                return False
        lines = nodes_of_type(top, cst.SimpleStatementLine)
        after = lines[next(i for i, line in enumerate(lines) if line is write) + 1:]
        return not any(isinstance(target, cst.Name) and target.value in written
                       for line in after for small in line.body if isinstance(small, cst.Assign)
                       for assign_target in small.targets
                       for target in ([e.value for e in assign_target.target.elements]
                                      if isinstance(assign_target.target, cst.Tuple) else [assign_target.target]))

    def _static_alias_write(self, plan: _Plan, top: cst.BaseStatement, write: cst.SimpleStatementLine,
                            alias: _Alias, slots: str) -> cst.BaseStatement:
        """A write through a local name of the cache (`_Alias`): where it is, the caller's copy only (the
        cross-attention's keys and values still come from its own cache); after the top-level statement that holds
        it, the self-attention's keys and values written into the static buffers. On the static path the entries
        pass no cache, so the guarded write does not run there, and the static one must not be under its guard."""
        keys, values = _write(write, alias.name)
        call = write.body[0].value
        copy = write.with_changes(body=[cst.Expr(call)], leading_lines=[])
        if alias.cross is None:
            plan.replace[write] = copy.with_changes(leading_lines=[*write.leading_lines, _comment(
                "the caller's cache still grows (its length counts positions).")])
        else:
            plan.replace[write] = cst.If(
                test=alias.cross, body=cst.IndentedBlock(body=[write.with_changes(leading_lines=[])]),
                orelse=cst.Else(body=cst.IndentedBlock(body=[copy])), leading_lines=[*write.leading_lines, _comment(
                    "cross-attention reads its own cache; the caller's self-attention cache still grows (its "
                    "length counts positions).")])
        static = cst.parse_statement(f"{keys}, {values} = self.kv_cache.update({slots}, {keys}, {values})\n")
        if alias.cross is not None:
            static = cst.If(test=cst.UnaryOperation(cst.Not(), _parenthesized(alias.cross)),
                            body=cst.IndentedBlock(body=[static]))
        plan.after[top] = [static.with_changes(leading_lines=[_comment(
            "self-attention reads the preallocated cache, written in place.")])]
        return write

    def _fixed_lengths(self, plan: _Plan, body: list[cst.BaseStatement], lengths: dict[int, str], cache: str) -> None:
        """Each length read off the cache object becomes the static cache's length (every slot is read)."""
        for index, name in lengths.items():
            stmt = body[index]
            leading = list(stmt.leading_lines)
            previous = body[index - 1] if index else None
            assigned = single_assignment(previous) if previous is not None else None
            if assigned and assigned[0] == name and not names_in(assigned[1]) & {name}:
                plan.drop.add(previous)  # `n = k.shape[-2]`, overwritten now
                leading = list(previous.leading_lines)
                self.record_edit(previous, f"`{name} = ...` dropped: the cache length is fixed now")
            plan.replace[stmt] = cst.parse_statement(f"{name} = self.kv_cache.max_seq_len\n").with_changes(
                leading_lines=[*leading, _comment("attention reads every slot of the static cache.")])
            self.record_edit(stmt, f"`{name}` is the static cache's length instead of a length read from `{cache}`")

    def _sizing(self, classes: dict[str, cst.ClassDef], cls: cst.ClassDef, write: cst.BaseStatement,
                cache: str) -> tuple[cst.ClassDef, str, str] | None:
        """(the class whose `__init__` creates the static cache, its constructor call, how it is sized), or None
        where no class has an `__init__` to create it in.

        The buffers take the shape, dtype and growing dim of the tensors written, keys and values apart, so no name
        has to describe them (MLA's keys and values differ in head size, a latent and a rope key in rank). The
        growing dims are the ones the trace saw, else the ones the write itself says. The head count and head size
        `__init__` names size them where the trace did not see the write, or saw keys and values of one shape
        (`_names_may_size`): buffers then exist from `setup_caches` on, and shapes the names say are checked by the
        first `index_copy_`."""
        seen = self._seen_dims(write)
        named = self._cache_owner(classes, cls, named=True) if self._names_may_size(write, seen) else None
        if named is not None:
            init = find_method(named, "__init__")
            code = self.code_to_search(init)
            heads = size_in_init(init, KV_HEAD_ATTRIBUTES, code)
            head_dim = size_in_init(init, HEAD_DIM_ATTRIBUTES, code)
            return named, f"{CACHE_CLASS}({heads}, {head_dim}, seq_dim=2)", f"sized by `{heads}` and `{head_dim}`"
        owner = self._cache_owner(classes, cls, named=False)
        if owner is None:
            return None
        key_dim, value_dim = seen or self._written_dims(write, cache)
        value = f", value_seq_dim={value_dim}" if value_dim != key_dim else ""
        where = "the dims the trace saw them grow along" if seen else "the dims the write itself grows them along"
        return (owner, f"{CACHE_CLASS}(seq_dim={key_dim}{value})",
                f"shaped by the first keys and values written, each apart, with slots on {where}")

    def _seen_dims(self, write: cst.BaseStatement) -> tuple[int, int] | None:
        """The growing dims of the two tensors the trace saw the write statement grow: a cache object's `update`
        (evidence_cache_writes), or the `torch.cat` pair (evidence_caches); None where it saw no such pair."""
        if not self.options.traced:
            return None
        path, (first, last) = self.context.filename, self._lines(write)
        for file, line, dims, _ in self.options.evidence_cache_writes:
            if file == path and first <= line <= last and len(dims) == 2:
                return dims[0], dims[1]
        cats = sorted((line, dim) for file, line, dim in self.options.evidence_caches
                      if file == path and first <= line <= last)
        return (cats[0][1], cats[1][1]) if len(cats) == 2 else None

    def _names_may_size(self, write: cst.BaseStatement, seen: tuple[int, int] | None) -> bool:
        """Whether the head count and head size `__init__` names may size the buffers, so that `setup_caches`
        allocates them (a person sees the memory at set-up, not at the first request): where the trace did not see
        the write, or saw it write keys and values of one and the same 4-D shape, (batch, heads, length, head size),
        at every layer. Keys and values of different shapes (MLA), or another layout, keep the shapes of the first
        write."""
        if seen is None:
            return True
        path, (first, last) = self.context.filename, self._lines(write)
        shapes = [per_tensor for file, line, dims, per_tensor in self.options.evidence_cache_writes
                  if file == path and first <= line <= last and tuple(dims) == (2, 2)]
        return bool(shapes) and all(
            len(per_tensor) == 2 and per_tensor[0] == per_tensor[1] and all(len(shape) == 4 for shape in per_tensor[0])
            for per_tensor in shapes)

    @staticmethod
    def _written_dims(write: cst.BaseStatement, cache: str) -> tuple[int, int]:
        """The dims a write grows keys and values along by its own words: the `torch.cat` pair's, or the Cache API's
        -2 (every transformers cache object concatenates there)."""
        guarded = _guarded_block(write, cache)
        if guarded and _tuple_write(guarded, cache):  # the block is the two cats, keys (past[0]) and values
            keys, values = sorted((cat_of_past(s) for s in guarded), key=lambda cat: cat[2])
            return keys[3], values[3]
        return -2, -2

    def _cache_owner(self, classes: dict[str, cst.ClassDef], cls: cst.ClassDef, named: bool) -> cst.ClassDef | None:
        """The class (this one or a same-file base) whose __init__ creates the static cache: the first that names
        the KV head count and head size (`named`), else the first that has an `__init__`."""
        seen: set[str] = set()
        current: cst.ClassDef | None = cls
        while current is not None and current.name.value not in seen:
            seen.add(current.name.value)
            init = find_method(current, "__init__")
            code = self.code_to_search(init) if init is not None and named else None
            if init is not None and (not named or (size_in_init(init, KV_HEAD_ATTRIBUTES, code)
                                                   and size_in_init(init, HEAD_DIM_ATTRIBUTES, code))):
                return current
            bases = [b.value.value for b in current.bases if isinstance(b.value, cst.Name)]
            current = next((classes[b] for b in bases if b in classes), None)
        return None

    # -- the mask, the past length and the positions, in the model's forward -----------------------
    def _plan_model(self, cls: cst.ClassDef, method: cst.FunctionDef, plan: _Plan) -> None:
        picked = _picked_mask_helpers(method)
        calls = [(stmt, *found) for stmt in nodes_of_type(method, cst.SimpleStatementLine)
                 if (found := _cast_mask_call(stmt, _ALL_MASK_HELPERS | frozenset(picked)))
                 and not _own_method_named_like_a_library_helper(found[1])]
        if not calls:
            self._plan_mask_mapping(cls, method, plan)
            return
        params = {p.name.value for p in method.params.params}
        position = next((p for p in _SLOT_SOURCES if p in params), None)
        counted = _length_read(method, {"cache", "past_key_values"} & params) if position is None else None
        if counted is not None:
            # Positions counted on from the cache's length: the entries carry no cache, so on the static path the
            # count would start at 0 at every step. The mask and the cache change with the positions, or not at all.
            where = f"`{short_code(code_of(counted))}`, line {self._lines(counted)[0]}"
            self.record_manual(calls[0][0], f"`{code_of(calls[0][2].func)}` builds the mask, but this method takes no "
                                            f"`position_ids` and counts positions from the cache's length ({where}), "
                                            "which the static path does not carry; give the method a `position_ids` "
                                            "parameter, use it where that length makes positions, then rerun")
            plan.incomplete = True
            return
        init = find_method(cls, "__init__")
        buffer = "causal_mask" if "causal_mask" not in self_attributes(cls) else "graphmode_causal_mask"
        windows: set[str] = set()
        rewrites: dict[cst.CSTNode, cst.CSTNode] = {}
        for stmt, target, call, cast in calls:
            helper = code_of(call.func)
            window, problem = _helper_window(call, helper, picked)
            shape, problem = (None, problem) if problem else _mask_input_shape(
                cls, call, position, init is not None, next(iter(KEYWORD_MASK_HELPERS)) if helper in picked else None)
            if problem:
                self.record_manual(stmt, f"`{code_of(call.func)}` builds the mask, but {problem}; build a mask buffer "
                                         "by hand")
                plan.incomplete = True
                return
            batch, length = (code_of(e.value) for e in shape.elements)
            windows.add(code_of(window) if window is not None else "")
            plan.reads_slots |= position != "cache_position"
            # A cast makes the line long: it is written wrapped, as a person would.
            room = "\n    " if cast else ""
            rows = (f"{target} = {PADDED_ROWS}(self, self.{buffer}, {_slots_of(position)})"
                    f".expand({room}{batch}, 1, {length}, -1{room[:1]}){cast}\n")
            rewrites[stmt] = cst.parse_statement(rows).with_changes(leading_lines=[*stmt.leading_lines, _comment(
                "the causal mask's rows for these positions, computed per call.")])
        if len(windows) > 1:
            self.record_manual(calls[0][0], "the mask helpers of this method use different sliding windows; build "
                                            "the mask buffers by hand")
            plan.incomplete = True
            return
        for stmt, _, call, _ in calls:
            plan.helpers.add(code_of(call.func))
            self.record_edit(stmt, f"`{code_of(call.func)}` replaced by rows of `self.{buffer}`")
        plan.masks += len(rewrites)
        body = list(method.body.body)
        for stmt in self._default_masks(method, {target for _, target, _, _ in calls}):
            plan.drop.add(stmt)
            following = next(iter(body[body.index(stmt) + 1:]), None)
            if following in rewrites:  # its comments stay, above the statement that follows it
                rewrites[following] = rewrites[following].with_changes(
                    leading_lines=[*stmt.leading_lines, *rewrites[following].leading_lines])
        plan.replace.update(rewrites)
        window = windows.pop()
        plan.windows.add(window)
        argument = f"sliding_window={window}" if window else ""
        plan.init_lines.setdefault(cls.name.value, []).append(cst.parse_statement(
            f"self.{buffer} = {MASK_CLASS}({argument})\n"))

    def _plan_mask_mapping(self, cls: cst.ClassDef, method: cst.FunctionDef, plan: _Plan) -> None:
        """5.x models with layers of two kinds (Qwen2, Qwen3) build a dict of masks, one per layer type, from one
        dict of keywords:

            mask_kwargs = {"config": self.config, "inputs_embeds": inputs_embeds, ..., "position_ids": position_ids}
            causal_mask_mapping = {"full_attention": create_causal_mask(**mask_kwargs)}
            if self.has_sliding_layers:
                causal_mask_mapping["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)

        Each call becomes the rows of a mask built once with its own window (`causal_mask`, and
        `sliding_causal_mask` for the config's window), in the statement that holds it."""
        mapped = _mapped_mask_calls(method)
        if not mapped:
            return
        params = {p.name.value for p in method.params.params}
        position = next((p for p in _SLOT_SOURCES if p in params), None)
        init = find_method(cls, "__init__")
        taken = self_attributes(cls)
        rewrites: dict[cst.CSTNode, dict[cst.Call, str]] = {}
        buffers: dict[str, str] = {}  # window code -> the mask buffer built with it
        for stmt, call, resolved in mapped:
            helper = code_of(call.func)
            window, problem = _helper_window(resolved, helper, {})
            shape, problem = (None, problem) if problem else _mask_input_shape(cls, resolved, position,
                                                                               init is not None)
            if problem:
                self.record_manual(stmt, f"`{helper}` builds a mask of the mapping, but {problem}; build a mask "
                                         "buffer by hand")
                plan.incomplete = True
                return
            key = code_of(window) if window is not None else ""
            if key not in buffers:
                name = "sliding_causal_mask" if key else "causal_mask"
                buffers[key] = name if name not in taken else f"graphmode_{name}"
            batch, length = (code_of(e.value) for e in shape.elements)
            rewrites.setdefault(stmt, {})[call] = (f"{PADDED_ROWS}(self, self.{buffers[key]}, "
                                                   f"{_slots_of(position)}).expand({batch}, 1, {length}, -1)")
            plan.helpers.add(helper)
            self.record_edit(stmt, f"`{helper}` replaced by rows of `self.{buffers[key]}`")
        plan.reads_slots |= position != "cache_position"
        for stmt, calls in rewrites.items():
            plan.replace[stmt] = stmt.visit(_ReplaceCalls(calls)).with_changes(leading_lines=[
                *stmt.leading_lines, _comment("the causal mask's rows for these positions, computed per call.")])
        plan.masks += len(rewrites)
        plan.windows.add("|".join(sorted(buffers)))  # one set of masks for the file, each with its window
        for key, name in buffers.items():
            argument = f"sliding_window={key}" if key else ""
            plan.init_lines.setdefault(cls.name.value, []).append(cst.parse_statement(
                f"self.{name} = {MASK_CLASS}({argument})\n"))

    def _default_masks(self, method: cst.FunctionDef, targets: set[str]) -> list[cst.If]:
        """`if attention_mask is None: attention_mask = torch.ones(...)` before the helper: only the helper read
        that 2-D mask, and the rows that replace it take None for "no padding", so the ones would be a kernel that
        hides nothing, in every step."""
        found = []
        for stmt in method.body.body:
            if not (isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.body, cst.IndentedBlock)
                    and len(stmt.body.body) == 1):
                continue
            tested = none_test(stmt.test)
            assigned = single_assignment(stmt.body.body[0])
            if tested and tested[1] and tested[0] in targets and assigned and assigned[0] == tested[0]:
                found.append(stmt)
                self.record_edit(stmt, f"the default 2-D `{assigned[0]}` of ones is dropped: the mask rows take None "
                                       "for it")
        return found


def _mapped_mask_calls(method: cst.FunctionDef) -> list[tuple[cst.SimpleStatementLine, cst.Call, cst.Call]]:
    """(statement, call, the call with its keywords spelled out) for each keyword mask helper called with only
    `**<dict>` in a dict display or a subscript assignment (`masks = {"full_attention": create_causal_mask(**kw)}`,
    `masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)`), `<dict>` a dict display of
    string keys assigned once in the method."""
    dicts: dict[str, list[tuple[str, cst.BaseExpression]]] = {}
    assigned_twice: set[str] = set()
    for stmt in nodes_of_type(method, cst.SimpleStatementLine):
        assigned = single_assignment(stmt)
        if assigned is None:
            continue
        if assigned[0] in dicts:
            assigned_twice.add(assigned[0])
        value = assigned[1]
        if isinstance(value, cst.Dict) and all(isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
                                               for e in value.elements):
            dicts[assigned[0]] = [(e.key.evaluated_value, e.value) for e in value.elements]
    found = []
    helpers = KEYWORD_MASK_HELPERS | SLIDING_KEYWORD_MASK_HELPERS
    for stmt in nodes_of_type(method, cst.SimpleStatementLine):
        if not (len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
            continue
        assign = stmt.body[0]
        value = assign.value
        if isinstance(assign.targets[0].target, cst.Subscript):
            candidates = [value]
        elif isinstance(value, cst.Dict):
            candidates = [e.value for e in value.elements if isinstance(e, cst.DictElement)]
        else:
            continue
        for call in candidates:
            if not (isinstance(call, cst.Call) and code_of(call.func) in helpers and len(call.args) == 1
                    and call.args[0].star == "**" and isinstance(call.args[0].value, cst.Name)):
                continue
            name = call.args[0].value.value
            if name not in dicts or name in assigned_twice:
                continue
            resolved = call.with_changes(args=[cst.Arg(keyword=cst.Name(k), value=v) for k, v in dicts[name]])
            found.append((stmt, call, resolved))
    return found


class _ReplaceCalls(Transformer):
    """Each call of `calls` (by identity) replaced by its expression's text."""

    def __init__(self, calls: dict[cst.Call, str]) -> None:
        self.calls = calls

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return cst.parse_expression(self.calls[original_node]) if original_node in self.calls else updated_node


class _Apply(Transformer):
    def __init__(self, plan: _Plan, on_the_way: set[cst.CSTNode]) -> None:
        self.plan, self.on_the_way = plan, on_the_way

    def on_visit(self, node: cst.CSTNode) -> bool:
        # A node that holds no planned one is handed on as it was, not built again: the next text's layout reuses
        # the text of each method handed on as the same node (ParsedSource.generated), and a visit is the cost.
        return node in self.on_the_way

    def on_leave(self, original_node, updated_node):
        if original_node in self.plan.drop:
            return cst.RemoveFromParent()
        if original_node in self.plan.replace:
            return self.plan.replace[original_node]
        if original_node in self.plan.after:
            return cst.FlattenSentinel([updated_node, *self.plan.after[original_node]])
        if isinstance(updated_node, cst.ClassDef) and updated_node.name.value in self.plan.init_lines:
            return append_to_init(updated_node, self.plan.init_lines[updated_node.name.value],
                                  "for the static path, allocated by setup_caches.")
        return updated_node
