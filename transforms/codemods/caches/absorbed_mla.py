"""Multi-head latent attention (DeepSeek-V2/V3) caches its compressed latent, not the keys and values expanded from it.

MLA compresses each token to a latent of `kv_lora_rank` numbers plus one rope key of `qk_rope_head_dim`, shared by
every head; `kv_b_proj` expands the latent to each head's key part and value. transformers' DeepSeek files (4.5x)
expand first and cache what comes out:

    k_nope, k_pe = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
    k_nope = self.kv_b_proj(self.kv_a_layernorm(k_nope)).view(key_shape).transpose(1, 2)
    k_nope, value_states = torch.split(k_nope, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
    ...
    query_states = torch.cat((q_nope, q_pe), dim=-1)
    key_states = torch.cat((k_nope, k_pe), dim=-1)
    key_states, value_states = self.kv_cache.update(cache_position, key_states, value_states)   # cache_object's
    ...
    attn_output, attn_weights = attention_interface(self, query_states, key_states, value_states, attention_mask,
                                                    ..., scaling=self.scaling, ...)

so the static cache holds `heads x (key + value head sizes)` per token: 8.9x the latent at DeepSeek-V2-Lite's sizes,
71x at V3's. After cache_object, on the static path, this codemod caches the latent and the rope key instead (a
`StaticLatentCache`, sized by the split's own widths) and absorbs `kv_b_proj`, as serving engines run MLA's Decode:
the query takes its key half (`q_nope @ W_UK` scores against the latent) and the output its value half (attention
weighs the latent, then `W_UV`), in `graphmode_absorbed_mla`. The statements that only built the expanded keys,
values and the concatenated query go from the static path; the model's own path keeps them.

It acts only where every piece is found in the one method: the `kv_b_proj` expansion of a split's first part, the
static write of the keys and values, the concatenated query (`torch.cat((q_nope, q_pe), dim=-1)`) and an attention
call taking `(self, query, keys, values, mask, ..., scaling=...)`; and where nothing after the attention call reads
the expanded tensors. Else the file keeps cache_object's expanded cache, and a person is told so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.codemods.base import GraphCodemod
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import CACHE_CLASS
from graphmode.transforms.codemods.lib.module import ReplaceNodes, defined_at_top, insert_after_imports, \
    transform_statements
from graphmode.transforms.cstutil import calls_in, code_of, dotted_name, find_method, names_in, walk

UP_PROJECTION = "kv_b_proj"  # DeepSeek's name for the latent's up-projection, in every release and remote file
LATENT_CACHE = "StaticLatentCache"
ABSORBED_ATTENTION = "graphmode_absorbed_mla"
_STATIC_WRITE = "self.kv_cache.update"


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(indent=True, comment=cst.Comment(f"# graphmode: {text}"))


def _not_graphmodes(lines) -> list[cst.EmptyLine]:
    """A statement's leading lines less graphmode's own comments (cache_object's, on the write replaced here)."""
    return [line for line in lines if not (line.comment and line.comment.value.startswith("# graphmode:"))]


def _assign(stmt: cst.CSTNode) -> tuple[list[str], cst.BaseExpression] | None:
    """`a = v`, `a, b = v` or `a: T = v` alone on a line -> (the names bound, v)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    small = stmt.body[0]
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
        return [small.target.value], small.value
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
        return None
    target = small.targets[0].target
    if isinstance(target, cst.Name):
        return [target.value], small.value
    if isinstance(target, cst.Tuple) and all(isinstance(e.value, cst.Name) for e in target.elements):
        return [e.value.value for e in target.elements], small.value
    return None


def _bound_names(stmt: cst.CSTNode) -> set[str]:
    """Every plain name a statement (an `if` block included) assigns."""
    targets = [n.target for n in walk(stmt) if isinstance(n, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign))]
    names = [e.value for t in targets for e in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else [])]
    return {n.value for n in [*targets, *names] if isinstance(n, cst.Name)}


def _split_of(stmt: cst.CSTNode) -> tuple[str, str, str, cst.BaseExpression, cst.BaseExpression] | None:
    """`a, b = torch.split(x, [wa, wb], dim=-1)` -> ("a", "b", "x", wa, wb)."""
    assigned = _assign(stmt)
    if assigned is None or len(assigned[0]) != 2 or not isinstance(assigned[1], cst.Call) \
            or dotted_name(assigned[1].func) != "torch.split" or len(assigned[1].args) != 3:
        return None
    source, widths, dim = (a.value for a in assigned[1].args)
    if not (isinstance(source, cst.Name) and isinstance(widths, (cst.List, cst.Tuple)) and len(widths.elements) == 2
            and code_of(dim).replace(" ", "") == "-1"):
        return None
    return assigned[0][0], assigned[0][1], source.value, widths.elements[0].value, widths.elements[1].value


@dataclass
class _Method:
    """What one attention method's absorption rewrites, by node identity."""

    replace: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    drop: set[cst.CSTNode] = field(default_factory=set)
    cache: str = ""  # the StaticLatentCache construction for __init__


@dataclass
class _Recognised:
    """The statements of one attention method the absorption rewrites (indexes into its body), and the names and
    expressions it reads from them."""

    write_at: int  # `K, V = self.kv_cache.update(slots, K, V)`, the static write cache_object made
    slots: str
    keys: str
    values: str
    expand_at: int  # the statement calling `self.kv_b_proj(<latent>)`
    expanded: list[str]  # what it binds
    latent_input: cst.BaseExpression  # `self.kv_a_layernorm(k_nope)`: the latent the cache takes
    rope_key: str
    latent_width: cst.BaseExpression
    rope_width: cst.BaseExpression
    call_at: int  # the attention call over the written keys and values
    returned: list[str]
    attention: str
    query: str
    mask: str
    scaling: str
    q_nope: str
    q_pe: str


def _recognised(body: list[cst.BaseStatement]) -> _Recognised | None:
    """The write, the expansion, the latent's split, the attention call and its concatenated query, each found once
    and in that order; None where any is missing or ambiguous."""
    write = _static_write(body)
    expansion = _expansion(body)
    if write is None or expansion is None or expansion[0] > write[0]:
        return None
    (write_at, write_call), (expand_at, call) = write, expansion
    keys, values = (code_of(a.value) for a in write_call.args[1:])
    expanded = _assign(body[expand_at])
    if expanded is None or len(expanded[0]) != 1:
        return None
    latent_input = call.args[0].value
    split = _latent_split(body[:expand_at], latent_input)
    attention = _attention_call(body, write_at, keys, values)
    if split is None or attention is None:
        return None
    call_at, returned, attention_call, positional = attention
    scaling = next((code_of(a.value) for a in attention_call.args if a.keyword and a.keyword.value == "scaling"),
                   None)
    pieces = _query_pieces(body[expand_at + 1:write_at], positional[1])
    name = dotted_name(attention_call.func)
    if scaling is None or name is None or pieces is None:
        return None
    return _Recognised(write_at, code_of(write_call.args[0].value), keys, values, expand_at, list(expanded[0]),
                       latent_input, split[1], split[3], split[4], call_at, returned, name, positional[1],
                       positional[4], scaling, *pieces)


def _static_write(body: list[cst.BaseStatement]) -> tuple[int, cst.Call] | None:
    """The one `K, V = self.kv_cache.update(slots, K, V)`."""
    writes = [(i, a[1]) for i, s in enumerate(body) if (a := _assign(s)) and isinstance(a[1], cst.Call)
              and dotted_name(a[1].func) == _STATIC_WRITE and len(a[0]) == 2 and len(a[1].args) == 3]
    return writes[0] if len(writes) == 1 else None


def _expansion(body: list[cst.BaseStatement]) -> tuple[int, cst.Call] | None:
    """The one statement calling `self.kv_b_proj(<latent>)`."""
    found = [(i, call) for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
             for call in calls_in(s) if dotted_name(call.func) == f"self.{UP_PROJECTION}" and len(call.args) == 1]
    return found[0] if len(found) == 1 else None


def _latent_split(before: list[cst.BaseStatement], latent_input: cst.BaseExpression):
    """The split of kv_a_proj's output into the latent and the rope key, read before the expansion; its widths size
    the cache in `__init__`, so they may read nothing but `self`."""
    splits = [found for s in before if (found := _split_of(s)) and found[0] in names_in(latent_input)]
    if len(splits) != 1 or not names_in(splits[0][3]) | names_in(splits[0][4]) <= {"self"}:
        return None
    return splits[0]


def _attention_call(body: list[cst.BaseStatement], write_at: int, keys: str, values: str):
    """The one call after the write that takes the written keys and values third and fourth: (its index, the two
    names it binds, the call, its positional arguments as code)."""
    calls = [(i, a[0], a[1], positional) for i, s in enumerate(body[write_at + 1:], write_at + 1)
             if (a := _assign(s)) and len(a[0]) == 2 and isinstance(a[1], cst.Call)
             and len(positional := [code_of(x.value) for x in a[1].args if x.keyword is None]) >= 5
             and positional[2:4] == [keys, values]]
    return calls[0] if len(calls) == 1 else None


def _query_pieces(between: list[cst.BaseStatement], query: str) -> tuple[str, str] | None:
    """`query = torch.cat((q_nope, q_pe), ...)` between the expansion and the write -> (q_nope, q_pe)."""
    concatenated = [a[1] for s in between if (a := _assign(s)) and a[0] == [query]]
    if len(concatenated) != 1 or not isinstance(concatenated[0], cst.Call) \
            or dotted_name(concatenated[0].func) != "torch.cat":
        return None
    pieces = concatenated[0].args[0].value
    if not isinstance(pieces, (cst.Tuple, cst.List)) or len(pieces.elements) != 2:
        return None
    q_nope, q_pe = (code_of(e.value) for e in pieces.elements)
    return q_nope, q_pe


def _drop_expansion(plan: _Method, body: list[cst.BaseStatement], found: _Recognised) -> bool:
    """Drops from the static path what only the expanded keys and values (or the concatenated query, or the
    attention function's choice) fed, and the assignments only those read; False where something after attention
    reads the expanded tensors. The rope key keeps its value from before any statement dropped here rebinds it
    (`k_pe = k_pe.expand(...)`, to the expanded keys' head count)."""
    expanded_names = set(found.expanded)
    for stmt in body[found.expand_at + 1:found.call_at]:
        if stmt is body[found.write_at]:
            continue
        bound = _bound_names(stmt)
        if names_in(stmt) & expanded_names or (bound and bound <= {found.query, found.attention}):
            plan.drop.add(stmt)
            expanded_names |= bound - {found.rope_key}
    if any(names_in(s) & (expanded_names - set(found.returned)) for s in body[found.call_at + 1:]):
        return False
    # Assignments the dropped statements alone read (`key_shape = (...)`), computing nothing: gone with them.
    gone = {body[found.expand_at], *plan.drop}
    kept = [s for s in body if s not in gone]
    for stmt in body[:found.expand_at]:
        assigned = _assign(stmt)
        if assigned and len(assigned[0]) == 1 and not calls_in(assigned[1]) \
                and assigned[0][0] in set().union(*map(names_in, gone)) \
                and not any(assigned[0][0] in names_in(s) for s in kept if s is not stmt):
            plan.drop.add(stmt)
    return True


class AbsorbedMLA(GraphCodemod):
    NAME = "absorbed_mla"
    SIZES_BUFFERS = True
    REQUIRES = ("cache_object",)
    TITLE = "Cache MLA's compressed latent and absorb its up-projection into the query and the output"
    DESCRIPTION = (
        f"Where multi-head latent attention expands its latent through `{UP_PROJECTION}` before the static cache "
        "write (transformers' DeepSeek-V2/V3 files), the static path caches the normed latent and the rope key "
        f"instead (a `{LATENT_CACHE}`: kv_lora_rank + qk_rope_head_dim per token, shared by every head, in place of "
        f"heads x (key + value head sizes)), and attention runs over the latent with `{UP_PROJECTION}` absorbed "
        f"(`{ABSORBED_ATTENTION}`: `q_nope @ W_UK` scores against the latent, the weighed latent goes through W_UV). "
        "Same result up to rounding (the products are associated the other way); Decode reads the latent alone."
    )
    SKILL = "static-kv-cache"
    FIXES = frozenset()

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return UP_PROJECTION in words and "kv_cache" in words

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        classes = {s.name.value: s for s in tree.body if isinstance(s, cst.ClassDef)}
        plans: list[tuple[str, _Method]] = []  # (class name, the rewrite of one of its methods)
        unrewritten: list[cst.FunctionDef] = []
        for cls in classes.values():
            for method in cls.body.body:
                if not (isinstance(method, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock)
                        and f"{_STATIC_WRITE}(" in code_of(method)):
                    continue
                plan = self._plan(cls, method)
                if plan is None:
                    unrewritten.append(method)
                else:
                    plans.append((cls.name.value, plan))
        if not plans:
            for method in unrewritten:  # MLA all the same: say what its expanded cache costs
                if f"self.{UP_PROJECTION}(" in code_of(method):
                    self.record_manual(method, f"MLA whose keys and values `{UP_PROJECTION}` expands are cached, in a "
                                               f"form `{self.NAME}` does not recognise (it needs the expansion, the "
                                               "concatenated query and an attention call taking `scaling=`): the "
                                               "static cache holds heads x (key + value sizes) per token; cache the "
                                               "latent and the rope key and absorb the up-projection by hand")
            return tree
        if unrewritten:  # one cache shape for the file: every static write must take the latent, or none
            self.edits.clear()
            self.record_manual(unrewritten[0], f"this method writes `self.kv_cache` in a form `{self.NAME}` does not "
                                               "recognise, while another takes the latent; the expanded cache stays")
            return tree
        replace: dict[cst.CSTNode, cst.CSTNode] = {}
        drop: set[cst.CSTNode] = set()
        for name, plan in plans:
            created = self._cache_creation(classes, classes[name])
            if created is None:
                self.edits.clear()
                self.record_manual(classes[name], f"no `__init__` of `{name}` or its bases creates `self.kv_cache`")
                return tree
            replace[created] = cst.parse_statement(f"self.kv_cache = {plan.cache}\n").with_changes(
                leading_lines=[*created.leading_lines, _comment(
                    "MLA's latent and rope key, shared by every head; the expanded keys and values are never held.")])
            self.record_edit(created, f"`self.kv_cache` holds the latent and the rope key ({plan.cache})")
            replace.update(plan.replace)
            drop |= plan.drop
        touched = {self.source.top_level_statement(n) for n in [*replace, *drop]}
        module = transform_statements(tree, ReplaceNodes(replace, drop), touched)
        for helper in (CACHE_CLASS, LATENT_CACHE, ABSORBED_ATTENTION):  # the latent cache subclasses the other
            if not defined_at_top(module, helper):
                module = insert_after_imports(module, helper_statements(helper))
        return module

    def _plan(self, cls: cst.ClassDef, method: cst.FunctionDef) -> _Method | None:
        body = list(method.body.body)
        found = _recognised(body)
        if found is None:
            return None
        plan = _Method()
        if not _drop_expansion(plan, body, found):
            return None  # something after attention reads the expanded tensors
        taken = names_in(method)
        latent = next(n for n in ("latent", "kv_latent", "graphmode_latent") if n not in taken)
        plan.replace[body[found.expand_at]] = cst.parse_statement(
            f"{latent} = {code_of(found.latent_input)}.unsqueeze(1)\n").with_changes(
            leading_lines=[*body[found.expand_at].leading_lines, _comment(
                f"the latent is cached, not the keys and values {UP_PROJECTION} expands it to (absorbed below).")])
        plan.replace[body[found.write_at]] = cst.parse_statement(
            f"{latent}, {found.rope_key} = self.kv_cache.update({found.slots}, {latent}, {found.rope_key})\n"
        ).with_changes(leading_lines=[*_not_graphmodes(body[found.write_at].leading_lines), _comment(
            "latent and rope key written in place, one row per token shared by every head.")])
        returned = found.returned
        plan.replace[body[found.call_at]] = cst.parse_statement(
            f"{returned[0]}, {returned[1]} = {ABSORBED_ATTENTION}(self.{UP_PROJECTION}, {found.q_nope}, "
            f"{found.q_pe}, {latent}, {found.rope_key}, {found.mask}, {found.scaling})\n").with_changes(
                leading_lines=[*body[found.call_at].leading_lines, _comment(
                    f"attention over the latent, {UP_PROJECTION} taken into the query and the output.")])
        plan.cache = f"{LATENT_CACHE}({code_of(found.latent_width)}, {code_of(found.rope_width)})"
        self.record_edit(body[found.expand_at], f"the latent is cached, not the keys and values `{UP_PROJECTION}` "
                                                "expands it to")
        self.record_edit(body[found.call_at], f"attention over the latent with `{UP_PROJECTION}` absorbed")
        for stmt in sorted(plan.drop, key=body.index):
            self.record_edit(stmt, "dropped from the static path: it built the expanded keys, values or query")
        return plan

    @staticmethod
    def _cache_creation(classes: dict[str, cst.ClassDef], cls: cst.ClassDef) -> cst.BaseStatement | None:
        """The `self.kv_cache = StaticKVCache(...)` line cache_object put in this class's `__init__` or a base's."""
        seen: set[str] = set()
        current: cst.ClassDef | None = cls
        while current is not None and current.name.value not in seen:
            seen.add(current.name.value)
            init = find_method(current, "__init__")
            for stmt in (init.body.body if init is not None else []):
                assigned = isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
                    and isinstance(stmt.body[0], cst.Assign) and code_of(stmt.body[0].targets[0].target) == \
                    "self.kv_cache" and isinstance(stmt.body[0].value, cst.Call) \
                    and dotted_name(stmt.body[0].value.func) == CACHE_CLASS
                if assigned:
                    return stmt
            bases = [b.value.value for b in current.bases if isinstance(b.value, cst.Name)]
            current = next((classes[b] for b in bases if b in classes), None)
        return None

