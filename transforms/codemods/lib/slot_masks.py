"""The static cache owns its validity: the op that reads the keys hides the slots not written yet.

Attention over `StaticKVBuffers` reads every slot, written or not. Where the model's own mask is one
`carried_cache` turns into rows picked by the positions, that mask hides them. Many models have none that can:

    if attention_mask is None and query.shape[2] == key.shape[2]:      # GLM, Baichuan, Phi-style SDPA code:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True)      # Prefill
    else:                                                                            # Decode: no mask at all
        out = F.scaled_dot_product_attention(query, key, value, attention_mask)

    scores = torch.matmul(query, key.transpose(2, 3)) / math.sqrt(d)  # plus a mask built per call for the
    scores = scores + attention_mask                                  # length the model counts, or none

So the mask goes where the keys are consumed, and which op that is comes from the traced run, not from names:
the op the trace saw take the growing cache in along its growing dim (`Options.cache_reads`).

- `scaled_dot_product_attention`, seen reading it: its `attn_mask` becomes `graphmode_slot_mask(self, mask,
  key)`, the model's mask (None, boolean or additive) with the unwritten slots hidden; `is_causal` goes, since
  a slot after a token's own is one not written when that token is computed.
- a product whose output grows with the keys (`q @ k^T`, `torch.matmul`, `bmm`, `baddbmm`, `einsum`): the
  product becomes `graphmode_hide_unwritten(self, product)`, its unwritten slots at the dtype's minimum before
  anything is added to it.

The helpers read the slots the `prefill`/`decode` entries write (`graphmode_static_state`) off the module, so
the op needs a method of a class (`self`); an op in a free function is a reason to give up.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.cstutil import calls_in, code_of, nodes_of_type

SDPA = "scaled_dot_product_attention"
SCORE_OPS = frozenset({"matmul", "bmm", "baddbmm", "einsum"})
SLOT_MASK = "graphmode_slot_mask"
HIDE_UNWRITTEN = "graphmode_hide_unwritten"
VISIBLE_SLOTS = "graphmode_visible_slots"
_SDPA_POSITIONS = {"query": 0, "key": 1, "value": 2, "attn_mask": 3, "dropout_p": 4, "is_causal": 5}


@dataclass
class SlotMasks:
    replace: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    edits: list[tuple[cst.CSTNode, str]] = field(default_factory=list)
    problems: list[tuple[cst.CSTNode, str]] = field(default_factory=list)
    helpers: set[str] = field(default_factory=set)  # the helper functions the rewrites call


def _called_name(call: cst.Call) -> str | None:
    """"matmul" for `torch.matmul(...)`, `F.x.matmul(...)` and `q.matmul(...)`; "f" for a bare `f(...)`."""
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None


def _products(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    """The products of the statement that may form scores (`a @ b`, `torch.matmul`, `bmm`, `baddbmm`, `einsum`),
    innermost first: `softmax(q @ k^T) @ v` holds two, and the keys' is the inner one."""
    found = [n for n in nodes_of_type(stmt, cst.BinaryOperation) if isinstance(n.operator, cst.MatrixMultiply)]
    found += [c for c in calls_in(stmt) if _called_name(c) in SCORE_OPS]
    return [n for n in found if not any(o is not n and _holds(n, o) for o in found)]


def _holds(outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    return any(n is inner for n in nodes_of_type(outer, type(inner)))


def _has_self(method: cst.FunctionDef) -> bool:
    params = method.params.params
    return bool(params) and params[0].name.value == "self" and not any(
        isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in method.decorators)


def _sdpa_rewrite(call: cst.Call, name: str) -> tuple[str, cst.Call] | None:
    """(`name = graphmode_slot_mask(self, <its mask or None>, <its key>)`, the call with `attn_mask=name` and no
    `is_causal`); None when its key is not passed plainly."""
    args = list(call.args)
    if any(a.star for a in args):
        return None
    by_name = {}
    for index, arg in enumerate(args):
        parameter = arg.keyword.value if arg.keyword is not None else \
            next((n for n, i in _SDPA_POSITIONS.items() if i == index), None)
        by_name[parameter] = index
    if "key" not in by_name:
        return None
    mask_index = by_name.get("attn_mask")
    mask = code_of(args[mask_index].value) if mask_index is not None else "None"
    owned = cst.Name(name)
    causal = by_name.get("is_causal")
    if mask_index is not None:
        args[mask_index] = args[mask_index].with_changes(value=owned)
    else:
        at = 3 if causal is None or args[causal].keyword is not None else causal
        args.insert(at, cst.Arg(owned, keyword=cst.Name("attn_mask"),
                                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        causal = None if causal is None else causal + (1 if at <= causal else 0)
    if causal is not None:
        if args[causal].keyword is None:  # the sixth positional argument
            args[causal] = args[causal].with_changes(value=cst.Name("False"))
        else:
            del args[causal]
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return f"{name} = {SLOT_MASK}(self, {mask}, {code_of(args[by_name['key']].value)})", call.with_changes(args=args)


def _free_name(method: cst.FunctionDef) -> str:
    taken = {n.value for n in nodes_of_type(method, cst.Name)}
    return next(n for n in ("slot_mask", "graphmode_slot_mask_", "graphmode_slots_visible") if n not in taken)


def plan_slot_masks(classes: dict[str, cst.ClassDef], reads: dict[int, set[tuple[str, str]]],
                    first_line) -> SlotMasks:
    """The rewrites of the statements of `classes` the trace saw read the cache (`reads`: statement line ->
    {(op, "scores" | "reads")}); `first_line(node)` is a node's first line in the file."""
    plan = SlotMasks()
    for cls in classes.values():
        for method in cls.body.body:
            if not isinstance(method, cst.FunctionDef):
                continue
            for stmt in nodes_of_type(method, cst.SimpleStatementLine):
                seen = reads.get(first_line(stmt))
                if not seen:
                    continue
                where = f"{cls.name.value}.{method.name.value}"
                sdpa = [c for c in calls_in(stmt) if _called_name(c) == SDPA] if (SDPA, "reads") in seen else []
                products = _products(stmt) if {op for op, kind in seen if kind == "scores"} & SCORE_OPS else []
                if not (sdpa or products):
                    continue
                if not _has_self(method):
                    plan.problems.append((stmt, f"`{where}` reads the cache and is no method of its module: the "
                                                "slots not written yet cannot be hidden there"))
                    continue
                if len(sdpa) > 1:
                    plan.problems.append((stmt, f"`{where}` calls `{SDPA}` twice in one statement"))
                for call in sdpa[:1]:
                    rewritten = _sdpa_rewrite(call, _free_name(method))
                    if rewritten is None:
                        plan.problems.append((call, f"`{where}` passes the keys to `{SDPA}` in a way not read here"))
                        continue
                    # The mask on a line of its own, with why: the call itself keeps its layout.
                    mask_line = cst.parse_statement(f"{rewritten[0]}\n").with_changes(leading_lines=[
                        *stmt.leading_lines, cst.EmptyLine(indent=True, comment=cst.Comment(
                            "# graphmode: attention reads every slot; the ones not written yet are hidden."))])
                    plan.replace[stmt] = cst.FlattenSentinel([
                        mask_line, stmt.deep_replace(call, rewritten[1]).with_changes(leading_lines=[])])
                    plan.helpers |= {SLOT_MASK, VISIBLE_SLOTS}
                    plan.edits.append((call, f"`{SDPA}` over the static buffers masks the slots not written yet "
                                             f"(`{SLOT_MASK}`, from the positions) instead of its own mask alone"
                                             + (" or `is_causal`" if "is_causal" in code_of(call) else "")))
                if sdpa:
                    continue
                for product in products[:1]:  # the keys' product; a second one (weights times values) is not
                    plan.replace[product] = cst.parse_expression(f"{HIDE_UNWRITTEN}(self, {code_of(product)})")
                    plan.helpers |= {HIDE_UNWRITTEN, VISIBLE_SLOTS}
                    plan.edits.append((product, f"the scores `{code_of(product)}` of every slot of the static "
                                                f"buffers hide the slots not written yet (`{HIDE_UNWRITTEN}`, from "
                                                "the positions)"))
    return plan
