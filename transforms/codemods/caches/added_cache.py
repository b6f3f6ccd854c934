"""Gives a model that keeps no KV cache (it recomputes the whole sequence every step) a static one.

Teaching and research GPTs (nanoGPT, minGPT) are driven by feeding the whole sequence again every step, and
recompute every position. The traced run says so (`Options.recomputes_sequence`: the token input grows by one
every Decode step). On the static path such a model gets what a cached model has:

    pos = torch.arange(0, t, dtype=torch.long, device=device)    ->  pos = input_pos
    (in the entry class's `forward`, which takes `input_pos=None` now: positional embeddings at the positions)

    k, v = self.kv_cache.update(graphmode_slots(self), k, v)     (added before attention, in every module whose
                                                                  method consumes keys and values)
    att.masked_fill(self.bias[:, :, :T, :T] == 0, ...)          ->  self.bias[:, :, graphmode_slots(self), :k.size(-2)]
    scaled_dot_product_attention(q, k, v, is_causal=True)     ->  attn_mask=graphmode_position_rows(...)

Which modules hold attention is read from the code's structure, not from names: a method that hands keys to
`scaled_dot_product_attention`, or multiplies queries by the keys' transpose of the last two dims (`q @
k.transpose(-2, -1)`) and the weights by the values (`att @ v`). Both read the keys along dim -2, so the buffers
(`StaticKVBuffers`, sized by `setup_caches`, shaped by their first write) grow there. The slots a token may read
are picked by the positions the entries carry (`graphmode_slots`): the model's own causal buffer gives its rows,
and `is_causal=True` (which means "causal" only while the keys are exactly the tokens computed) becomes rows of a
mask made from the positions, which also hides the slots not written yet.

The rewrite is an addition like every other (transforms/output/static_path.py): the changed methods become twins on the
static path, and `forward` called directly still recomputes the whole sequence. split_decode then adds the
`prefill(tokens, input_pos)` / `decode(token, input_pos)` entries, Decode being fed the new token alone.

All or nothing per file, and only where the file holds the entry class: positions made otherwise than by an
`arange` over the sequence length, attention that is not causal, or a mask of another shape change nothing, and
the manual item says why no cache can be added.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.codemods.base import GraphCodemod
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import BUFFERS_CLASS, SLOTS
from graphmode.transforms.codemods.lib.module import append_to_init, defined_at_top, insert_after_imports, \
    self_attributes
from graphmode.transforms.cstutil import POSITION_TENSOR, calls_in, code_of, dotted_name, find_method, integer_value, \
    is_full_slice, nodes_of_type, torch_call_name, walk
from graphmode.transforms.dispatch import Transformer

POSITION_ROWS = "graphmode_position_rows"
_SDPA = "scaled_dot_product_attention"
_CACHE_ATTRIBUTES = ("kv_cache", "graphmode_kv_cache")  # the first one the class does not use yet


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(indent=True, comment=cst.Comment(f"# graphmode: {text}"))


def _slots() -> str:
    return f"{SLOTS}(self)"


@dataclass
class _Attention:
    """One method's attention over its keys and values, and the replacements that make it read the cache."""

    keys: str
    values: str
    first: int  # index in the method body of the first top-level statement that consumes the keys
    replacements: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    rows: bool = False  # a mask made from the positions stands for `is_causal=True`
    edits: list[tuple[cst.CSTNode, str]] = field(default_factory=list)


class _Refused(Exception):
    """The idiom is there only in part: the reason goes to the manual item, and the file is left as it was."""

    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node, self.reason = node, reason


def _transposed_last_two(node: cst.BaseExpression) -> str | None:
    """`k.transpose(-2, -1)` (or `(-1, -2)`) -> "k"."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "transpose" \
            and isinstance(node.func.value, cst.Name) and len(node.args) == 2 \
            and {integer_value(a.value) for a in node.args} == {-2, -1}:
        return node.func.value.value
    return None


def _products(body: cst.CSTNode) -> list[tuple[cst.CSTNode, cst.BaseExpression, cst.BaseExpression]]:
    """(node, left, right) of every matrix product: `a @ b` and `torch.matmul(a, b)`."""
    found = [(n, n.left, n.right) for n in nodes_of_type(body, cst.BinaryOperation)
             if isinstance(n.operator, cst.MatrixMultiply)]
    found += [(c, c.args[0].value, c.args[1].value) for c in calls_in(body)
              if torch_call_name(c) == "matmul" and len(c.args) == 2]
    return found


def _is_sdpa(call: cst.Call) -> bool:
    name = dotted_name(call.func) or ""
    return name.rsplit(".", 1)[-1] == _SDPA


def _argument(call: cst.Call, index: int, keyword: str) -> cst.Arg | None:
    by_keyword = next((a for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return by_keyword or (positional[index] if index < len(positional) else None)


def _length_names(body: list[cst.BaseStatement], tensor: str) -> set[str]:
    """Names bound to the sequence length, dim 1 of `tensor` (batch first): `b, t = idx.size()`, `B, T, C =
    x.shape`, `t = idx.size(1)`, `t = idx.shape[1]`."""
    found: set[str] = set()
    for stmt in body:
        for assign in nodes_of_type(stmt, cst.Assign) if isinstance(stmt, cst.SimpleStatementLine) else []:
            value, target = code_of(assign.value).replace(" ", ""), assign.targets[0].target
            if value in (f"{tensor}.shape", f"{tensor}.size()") and isinstance(target, cst.Tuple) \
                    and len(target.elements) >= 2 and isinstance(target.elements[1].value, cst.Name):
                found.add(target.elements[1].value.value)
            elif value in (f"{tensor}.shape[1]", f"{tensor}.size(1)") and isinstance(target, cst.Name):
                found.add(target.value)
    return found


def _top_statement(body: list[cst.BaseStatement], node: cst.CSTNode) -> int:
    return next(i for i, stmt in enumerate(body) if any(n is node for n in walk(stmt)))


def _assigned(stmt: cst.BaseStatement) -> set[str]:
    """Names a top-level statement binds (`k = ...`, `q, k, v = ...`)."""
    found: set[str] = set()
    for assign in nodes_of_type(stmt, cst.Assign):
        for target in assign.targets:
            found |= {n.value for n in walk(target.target) if isinstance(n, cst.Name)}
    return found


def _attention(method: cst.FunctionDef) -> _Attention | None:
    """The method's attention over keys and values, or None when it has none. _Refused where it has attention
    whose keys or mask this rewrite cannot give the cache."""
    body = list(method.body.body)
    sites: list[tuple[cst.CSTNode, str, str]] = []  # (node, keys, values)
    for call in calls_in(method.body):
        if _is_sdpa(call):
            keys, values = _argument(call, 1, "key"), _argument(call, 2, "value")
            if not (keys and values and isinstance(keys.value, cst.Name) and isinstance(values.value, cst.Name)):
                raise _Refused(call, f"`{_SDPA}` is handed keys or values that are not plain names; a cache "
                                     "cannot be written in front of it")
            sites.append((call, keys.value.value, values.value.value))
    products = _products(method.body)
    for node, _, right in products:
        keys = _transposed_last_two(right)
        if keys is None:
            continue
        values = [r.value for _, _, r in products if isinstance(r, cst.Name) and r.value != keys]
        if len(values) != 1:
            raise _Refused(node, "the keys are multiplied by the queries, but no single product by the values "
                                 "follows; the attention is not recognised")
        sites.append((node, keys, values[0]))
    if not sites:
        return None
    if len({(k, v) for _, k, v in sites}) != 1:
        raise _Refused(sites[0][0], "attention reads keys and values under different names on different paths")
    keys, values = sites[0][1], sites[0][2]
    first = min(_top_statement(body, node) for node, _, _ in sites)
    if not {keys, values} <= set().union(*(_assigned(s) for s in body[:first])):
        raise _Refused(body[first], f"`{keys}` and `{values}` are not both computed before the attention "
                                    "statement, so the cache has no one place to be written")
    found = _Attention(keys, values, first)
    params = [p.name.value for p in method.params.params]
    lengths = _length_names(body, params[1]) if len(params) > 1 else set()
    for node, _, _ in sites:
        if isinstance(node, cst.Call):
            _sdpa_mask(node, keys, found)
    products_read_keys = any(not (isinstance(n, cst.Call) and _is_sdpa(n)) for n, _, _ in sites)
    _bias_rows(method, lengths, keys, found, needed=products_read_keys)
    return found


def _sdpa_mask(call: cst.Call, keys: str, found: _Attention) -> None:
    """`attn_mask=None, ..., is_causal=True` -> `attn_mask=graphmode_position_rows(self, k), ...`: the rows of the
    positions, in the mask's place (or the flag's, where the call passed no mask)."""
    causal = next((a for a in call.args if a.keyword is not None and a.keyword.value == "is_causal"), None)
    mask = _argument(call, 3, "attn_mask")
    has_mask = mask is not None and not (isinstance(mask.value, cst.Name) and mask.value.value == "None")
    if causal is None or not (isinstance(causal.value, cst.Name) and causal.value.value == "True") or has_mask:
        raise _Refused(call, f"`{_SDPA}` is not causal by `is_causal=True` alone (no mask, or a mask of the "
                             "model's own): without a causal mask a token's keys would depend on later tokens, so "
                             "no cache of them can be kept")
    place = mask or causal
    rows = cst.Arg(keyword=cst.Name("attn_mask"), value=cst.parse_expression(f"{POSITION_ROWS}(self, {keys})"),
                   equal=place.equal, comma=place.comma)
    args = [rows if a is place else a for a in call.args if a is not causal or a is place]
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    found.replacements[call] = call.with_changes(args=args)
    found.rows = True
    found.edits.append((call, "`is_causal=True` replaced by mask rows picked by the positions"))


def _bias_rows(method: cst.FunctionDef, lengths: set[str], keys: str, found: _Attention, needed: bool) -> None:
    """`self.bias[:, :, :T, :T]` (T the query length) -> `self.bias[:, :, graphmode_slots(self), :k.size(-2)]`: the
    rows of the model's own causal buffer at the positions, as wide as the keys read."""
    hits = 0
    for subscript in nodes_of_type(method.body, cst.Subscript):
        elements = list(subscript.slice)
        if not (isinstance(subscript.value, cst.Attribute) and isinstance(subscript.value.value, cst.Name)
                and subscript.value.value.value == "self" and len(elements) >= 2
                and all(is_full_slice(e) for e in elements[:-2])
                and all(_prefix_of(e, lengths) for e in elements[-2:])):
            continue
        rows = cst.SubscriptElement(cst.Index(cst.parse_expression(_slots())), comma=elements[-2].comma)
        width = elements[-1].with_changes(slice=elements[-1].slice.with_changes(
            upper=cst.parse_expression(f"{keys}.size(-2)")))
        found.replacements[subscript] = subscript.with_changes(slice=[*elements[:-2], rows, width])
        found.edits.append((subscript, "the causal buffer's rows picked by the positions, as wide as the cache"))
        hits += 1
    if needed and not hits:
        raise _Refused(method, "attention multiplies the queries by the keys, but no causal buffer sliced by the "
                               "sequence length (`self.bias[:, :, :T, :T]`) masks it; a mask of another shape (or "
                               "none) cannot be given rows by the positions")


def _prefix_of(element: cst.SubscriptElement, lengths: set[str]) -> bool:
    """`:T` with T a name bound to the sequence length."""
    part = element.slice
    return isinstance(part, cst.Slice) and part.lower is None and part.step is None \
        and isinstance(part.upper, cst.Name) and part.upper.value in lengths


class _Apply(Transformer):
    """Puts the planned replacements in, and the cache write in front of each attention's first statement."""

    def __init__(self, replacements: dict[cst.CSTNode, cst.CSTNode],
                 before: dict[cst.CSTNode, cst.BaseStatement]) -> None:
        self.replacements, self.before = replacements, before

    def on_leave(self, original_node, updated_node):
        updated = self.replacements.get(original_node, updated_node)
        if original_node in self.before:
            return cst.FlattenSentinel([self.before[original_node], updated])
        return updated


class AddedCache(GraphCodemod):
    NAME = "added_cache"
    SIZES_BUFFERS = True
    TITLE = "Add a static KV cache to a model that keeps none"
    DESCRIPTION = (
        f"The model recomputes the whole sequence every step. On the static path, every attention module writes "
        f"its keys and values into a `{BUFFERS_CLASS}` (sized by the entry's `setup_caches`) at the positions the "
        "entries carry, and attends over it with mask rows picked by those positions; the positional embeddings "
        "are taken at the positions (`forward` takes `input_pos`). Decode is then fed the new token alone. "
        "`forward` called directly still recomputes the whole sequence."
    )
    SKILL = "static-kv-cache"
    FIXES = frozenset({"GM301", "GM201", "GM302"})

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return options.recomputes_sequence and options.entry_class is not None and options.entry_class in words

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if not self.options.recomputes_sequence:  # the trace saw a cache kept, or no trace: nothing to add
            return tree
        entry = next((s for s in tree.body if isinstance(s, cst.ClassDef) and s.name.value == self.options.entry_class),
                     None)
        if entry is None:
            return tree
        try:
            attention = self._attention_classes(tree)
            replacements, edits = self._positions(entry)
        except _Refused as refused:
            self.record_manual(refused.node, refused.reason)
            return tree
        if not attention:
            self.record_manual(find_method(entry, "forward"), "no method in this file consumes keys and values the "
                               f"way attention does (`{_SDPA}`, or `q @ k.transpose(-2, -1)` then `@ v`), so no "
                               "cache can be added for it")
            return tree
        before: dict[cst.CSTNode, cst.BaseStatement] = {}
        caches: dict[str, str] = {}  # attention class -> its cache attribute
        for cls, method, found in attention:
            replacements.update(found.replacements)
            cache = next(name for name in _CACHE_ATTRIBUTES if name not in self_attributes(cls))
            caches[cls.name.value] = cache
            statement = method.body.body[found.first]
            before[statement] = cst.parse_statement(
                f"{found.keys}, {found.values} = self.{cache}.update({_slots()}, {found.keys}, {found.values})\n"
            ).with_changes(leading_lines=[_comment(  # the statement keeps its own blank lines and comments
                "every position's keys and values so far, written at the positions (Decode computes one).")])
            edits += [(statement, f"keys and values written into `self.{cache}` at the positions"), *found.edits]
        for node, summary in edits:
            self.record_edit(node, summary)
        module = tree.visit(_Apply(replacements, before))
        module = module.with_changes(body=[_with_buffers(s, caches) for s in module.body])
        wanted = [BUFFERS_CLASS, SLOTS] + ([POSITION_ROWS] if any(f.rows for _, _, f in attention) else [])
        for name in reversed(wanted):
            if not defined_at_top(module, name):
                module = insert_after_imports(module, helper_statements(name))
        return module

    def _positions(self, entry: cst.ClassDef) -> tuple[dict[cst.CSTNode, cst.CSTNode], list[tuple[cst.CSTNode, str]]]:
        """The replacements that give the entry class's `forward` an `input_pos` parameter and take its positions
        from it (they were `torch.arange` over the token input's length), and the edits they make."""
        forward = find_method(entry, "forward")
        if forward is None or not isinstance(forward.body, cst.IndentedBlock):
            raise _Refused(entry, f"`{entry.name.value}` has no `forward` to take the positions")
        params = forward.params
        names = [p.name.value for p in (*params.params, *params.kwonly_params)]
        if POSITION_TENSOR in names:
            raise _Refused(forward, f"`forward` already takes `{POSITION_TENSOR}`, yet recomputes the sequence")
        tokens = next((n for n in names[1:] if self.options.role_of(n) == "tokens"),
                      names[1] if len(names) > 1 else None)
        lengths = _length_names(list(forward.body.body), tokens) if tokens else set()
        aranges = [c for c in calls_in(forward.body) if torch_call_name(c) == "arange" and _counts_to(c, lengths)]
        tables = _table_prefixes(forward.body, lengths)
        if not (aranges or tables):
            raise _Refused(forward, "the positions are not made in `forward` as `torch.arange` over the token "
                                    "input's length (nor a positional table sliced by it), so the positional "
                                    "embeddings cannot be taken at the positions of the new tokens; no cache can be "
                                    "added")
        replacements: dict[cst.CSTNode, cst.CSTNode] = {c: cst.Name(POSITION_TENSOR) for c in aranges}
        replacements.update(tables)
        edits = [(c, f"positions taken from `{POSITION_TENSOR}` instead of counted from 0 every step") for c in aranges]
        edits += [(t, f"the positional table's rows at `{POSITION_TENSOR}` instead of its first ones") for t in tables]
        new = cst.Param(cst.Name(POSITION_TENSOR), default=cst.Name("None"),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        if isinstance(params.star_arg, cst.Param) or params.kwonly_params:
            replacements[params] = params.with_changes(kwonly_params=[*params.kwonly_params, new])
        else:
            replacements[params] = params.with_changes(params=[*params.params, new])
        edits.append((params, f"`forward` takes `{POSITION_TENSOR}` (the positions of the tokens fed)"))
        # Where the tokens are first handed to a call (the token embedding): on the static path, the tokens fed.
        fed = next((s for s in forward.body.body if any(
            isinstance(a.value, cst.Name) and a.value.value == tokens for c in calls_in(s) for a in c.args)), None)
        if fed is not None:
            edits.append((fed, "computes only the tokens fed (Decode: the new one); earlier positions' keys and "
                               "values come from the cache"))
        return replacements, edits

    def _attention_classes(self, tree: cst.Module) -> list[tuple[cst.ClassDef, cst.FunctionDef, _Attention]]:
        found = []
        for cls in (s for s in tree.body if isinstance(s, cst.ClassDef)):
            for method in cls.body.body:
                if not (isinstance(method, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock)):
                    continue
                attention = _attention(method)
                if attention is None:
                    continue
                if method.name.value != "forward" or find_method(cls, "__init__") is None:
                    raise _Refused(method, f"attention sits in `{method.name.value}` of a class without "
                                           "`__init__`, or outside `forward`; its buffers have no place")
                found.append((cls, method, attention))
        return found

def _with_buffers(stmt: cst.BaseStatement, caches: dict[str, str]) -> cst.BaseStatement:
    """An attention class (by name: the tree was rebuilt) with its cache made in `__init__`; anything else as is."""
    if not (isinstance(stmt, cst.ClassDef) and stmt.name.value in caches):
        return stmt
    create = cst.parse_statement(f"self.{caches[stmt.name.value]} = {BUFFERS_CLASS}(seq_dim=-2)\n")
    return append_to_init(stmt, [create], "keys and values of every position, sized by setup_caches and written on "
                                          "the static path only.")


def _table_prefixes(body: cst.CSTNode, lengths: set[str]) -> dict[cst.Subscript, cst.Subscript]:
    """`self.pos_emb[:, :t, :]` -> `self.pos_emb[:, input_pos, :]`: a learned positional table (a parameter) read
    by its first t rows, t the sequence length, read at the positions instead."""
    found = {}
    for subscript in nodes_of_type(body, cst.Subscript):
        elements = list(subscript.slice)
        prefixes = [i for i, e in enumerate(elements) if _prefix_of(e, lengths)]
        if isinstance(subscript.value, cst.Attribute) and isinstance(subscript.value.value, cst.Name) \
                and subscript.value.value.value == "self" and len(prefixes) == 1 \
                and all(is_full_slice(e) for i, e in enumerate(elements) if i != prefixes[0]):
            at = elements[prefixes[0]]
            elements[prefixes[0]] = at.with_changes(slice=cst.Index(cst.Name(POSITION_TENSOR)))
            found[subscript] = subscript.with_changes(slice=elements)
    return found


def _counts_to(call: cst.Call, lengths: set[str]) -> bool:
    """`torch.arange(t)`, `torch.arange(0, t)` or `torch.arange(0, t, 1)` (any keywords), t a name bound to the
    sequence length: the positions of every token of the sequence."""
    positional = [a.value for a in call.args if a.keyword is None]
    if len(positional) == 1:
        end = positional[0]
    elif len(positional) in (2, 3) and integer_value(positional[0]) == 0 \
            and (len(positional) == 2 or integer_value(positional[2]) == 1):
        end = positional[1]
    else:
        return False
    return isinstance(end, cst.Name) and end.value in lengths
