"""Turns key/value caches held by the module and sliced at a Python-int position into static buffers.

Recognises the Meta reference style, in a class whose `__init__` creates the caches with
`torch.zeros` and a method that takes a position `P`:

    self.cache_k = torch.zeros((max_batch_size, max_seq_len, n_kv_heads, head_dim))   # __init__
    self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk                           # forward
    keys = self.cache_k[:bsz, : start_pos + seqlen]

The caches, as `__init__` builds them, become buffers (`graphmode_cache_buffers`: they follow the model's `.to()`,
and `setup_caches` allocates them again for the sequences and positions it serves), the write becomes
`self.cache_k[:bsz].index_copy_(1, input_pos, xk)` and the read takes the whole buffer (`self.cache_k[:bsz]`):
attention runs over every slot and the causal mask hides the ones not written yet.
`self.cache_k = self.cache_k.to(...)` in the method is dropped (a buffer follows the model). A cache written but
never read back whole (or the reverse), a slice of another shape, or a cache not created with `torch.zeros` in
`__init__` is left to a person.
"""
from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import CACHE_BUFFERS
from graphmode.transforms.codemods.lib.module import (
    BufferCodemod,
    ReplaceNodes,
    defined_at_top,
    insert_after_imports,
    moves_to_device,
    replace_method,
)
from graphmode.transforms.cstutil import (
    POSITION_TENSOR,
    code_of,
    find_method,
    is_full_slice,
    is_position_prefix,
    is_position_window,
    names_in,
    position_param,
    self_attribute_name,
    string_tuple,
    torch_call_name,
)


def _leading(elements: list[cst.SubscriptElement], dim: int, name: str) -> list[cst.SubscriptElement] | None:
    """The elements before the sequence dimension, with trailing `:` removed; None when an element before
    it is not `:` or `:n` free of the position, or one after it is not `:`."""
    before, after = elements[:dim], elements[dim + 1 :]
    for element in before:
        part = element.slice
        if not (isinstance(part, cst.Slice) and part.lower is None and part.step is None
                and (part.upper is None or name not in names_in(part.upper))):
            return None
    if not all(is_full_slice(e) for e in after):
        return None
    while before and is_full_slice(before[-1]):
        before = before[:-1]
    if before:
        before[-1] = before[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return before


class _Use:
    def __init__(self, node: cst.Subscript, attribute: str, kind: str, dim: int,
                 leading: list[cst.SubscriptElement], statement: cst.SimpleStatementLine | None) -> None:
        self.node, self.attribute, self.kind, self.dim, self.leading, self.statement = \
            node, attribute, kind, dim, leading, statement


def _zeros_cache(init: cst.FunctionDef, attribute: str) -> tuple[cst.SimpleStatementLine, cst.Call] | None:
    """`self.A = torch.zeros(shape...)` (optionally `.cuda()`) in __init__, and the zeros call."""
    for stmt in init.body.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1
                and self_attribute_name(stmt.body[0].targets[0].target) == attribute):
            continue
        value = stmt.body[0].value
        if isinstance(value, cst.Call) and not value.args and isinstance(value.func, cst.Attribute) \
                and value.func.attr.value == "cuda":
            value = value.func.value
        return (stmt, value) if torch_call_name(value) == "zeros" else None
    return None


def _sizes(call: cst.Call) -> list | None:
    """The sizes a zeros call is given (one shape tuple or list, or one argument each); None where one is starred."""
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) == 1 and isinstance(positional[0].value, (cst.Tuple, cst.List)):
        sizes = list(positional[0].value.elements)
    else:
        sizes = positional
    if any(isinstance(s, cst.StarredElement) or getattr(s, "star", "") for s in sizes):
        return None
    return sizes


class SlicedKVCache(BufferCodemod):
    NAME = "sliced_kv_cache"
    SIZES_BUFFERS = True
    TITLE = "Write module-held KV caches in place at the position tensor"
    DESCRIPTION = (
        "Registers the key/value caches the attention module holds (`self.cache_k = torch.zeros(...)`) as "
        "buffers of the model's own size, which `setup_caches` allocates again for the sequences and positions it "
        "serves, writes them with "
        f"`index_copy_` at `{POSITION_TENSOR}` instead of `cache[:bsz, start_pos : start_pos + n] = x`, and reads "
        "the whole buffer instead of `cache[:bsz, : start_pos + n]`. Attention runs over every slot and the causal "
        "mask hides unwritten ones, so every Decode step has the same shapes and addresses. The per-call "
        "`.to(...)` reassignment of the caches is dropped."
    )
    SKILL = "static-kv-cache"
    FIXES = frozenset({"GM302"})

    @classmethod
    def may_apply(cls, source, options) -> bool:
        return source.has_position_param
    REQUIRES = ("static_positions", "static_mask")

    def _uses(self, method: cst.FunctionDef, name: str) -> tuple[list[_Use], list[cst.Subscript]]:
        """Slices of `self.X` that mention the position: recognised ones, and the rest."""
        uses: list[_Use] = []
        unknown: list[cst.Subscript] = []
        codemod = self

        class _Collector(cst.CSTVisitor):
            def visit_Subscript(self, node: cst.Subscript) -> None:
                attribute = self_attribute_name(node.value)
                if attribute is None or not any(name in names_in(e.slice) for e in node.slice):
                    return
                elements = list(node.slice)
                parent = codemod.get_metadata(ParentNodeProvider, node)
                statement = None
                if isinstance(parent, cst.AssignTarget):
                    assign = codemod.get_metadata(ParentNodeProvider, parent)
                    line = codemod.get_metadata(ParentNodeProvider, assign)
                    kind = "write" if len(assign.targets) == 1 and isinstance(line, cst.SimpleStatementLine) \
                        and len(line.body) == 1 else "other"
                    statement = line
                    windows = [i for i, e in enumerate(elements) if is_position_window(e, name)]
                else:
                    kind = "read"
                    windows = [i for i, e in enumerate(elements) if is_position_prefix(e, name)]
                leading = _leading(elements, windows[0], name) if len(windows) == 1 and kind != "other" else None
                if leading is None:
                    unknown.append(node)
                else:
                    uses.append(_Use(node, attribute, kind, windows[0], leading, statement))

        method.visit(_Collector())
        return uses, unknown

    def rewrite_method(self, cls, updated, method, body):
        param = position_param(method)
        if method.name.value == "__init__" or param is None:
            return None
        uses, unknown = self._uses(method, param.name.value)
        if not uses and not unknown:
            return None
        if unknown:
            for node in unknown:
                self.record_manual(node, f"`{code_of(node)}` slices a module-held cache by the position in a shape "
                                         "not recognised; write it with `index_copy_` at the position tensor by hand")
            return None
        init = find_method(cls, "__init__")
        caches: dict[str, tuple[cst.SimpleStatementLine, int]] = {}  # the statement building it, its sequence dim
        for attribute in dict.fromkeys(u.attribute for u in uses):
            mine = [u for u in uses if u.attribute == attribute]
            kinds = {u.kind for u in mine}
            if kinds != {"write", "read"}:
                missing = "read back whole (`[:bsz, : P + n]`)" if "read" not in kinds else "written at the position"
                self.record_manual(mine[0].node, f"`self.{attribute}` is sliced by the position but never {missing}; "
                                                 "rewrite its reads and writes together by hand")
                return None
            if len({u.dim for u in mine}) != 1:
                self.record_manual(mine[0].node, f"`self.{attribute}` is sliced by the position along different "
                                                 "dimensions")
                return None
            found = _zeros_cache(init, attribute) if init is not None else None
            sizes = _sizes(found[1]) if found else None
            if sizes is None or len(sizes) <= mine[0].dim or mine[0].dim == 0:
                self.record_manual(mine[0].node, f"`self.{attribute}` is not created in __init__ as "
                                                 "`torch.zeros(shape)` with the sequence dimension in its shape, "
                                                 "after the batch")
                return None
            caches[attribute] = (found[0], mine[0].dim)

        replace: dict[cst.CSTNode, cst.CSTNode] = {}
        first_write = True
        for use in uses:
            base = use.node.value
            whole = use.node.with_changes(slice=use.leading) if use.leading else base
            if use.kind == "read":
                replace[use.node] = whole
                self.record_edit(use.node, f"`self.{use.attribute}` read whole; the mask hides unwritten slots")
                continue
            value = use.statement.body[0].value
            write = cst.parse_statement(f"CACHE.index_copy_({use.dim}, {POSITION_TENSOR}, VALUE)\n")
            call = write.body[0].value
            write = write.visit(ReplaceNodes({call.func.value: whole, call.args[2].value: value}, set()))
            leading_lines = list(use.statement.leading_lines)
            if first_write:
                leading_lines.append(cst.EmptyLine(indent=True, comment=cst.Comment(
                    "# graphmode: written in place; attention reads all slots.")))
                first_write = False
            replace[use.statement] = write.with_changes(leading_lines=leading_lines)
            self.record_edit(use.statement, f"`self.{use.attribute}` written with `index_copy_` at "
                                            f"`{POSITION_TENSOR}`")
        drop = {s for s in body for a in caches if moves_to_device(s, a)}
        for stmt in drop:
            self.record_edit(stmt, "device move dropped: the cache is a buffer and follows the model")
        updated = replace_method(updated, method.name.value, method.visit(ReplaceNodes(replace, drop)))

        # __init__: the model's own caches, as built, made buffers that setup_caches allocates again.
        current_init = find_method(updated, "__init__")
        built = {code_of(stmt) for stmt, _ in caches.values()}
        last = max(i for i, s in enumerate(current_init.body.body) if code_of(s) in built)
        calls = []
        for dim in dict.fromkeys(d for _, d in caches.values()):
            names = string_tuple([a for a, (_, d) in caches.items() if d == dim])
            calls.append(cst.parse_statement(f"{CACHE_BUFFERS}(self, {names}, seq_dim={dim})\n"))
        calls[0] = calls[0].with_changes(leading_lines=[cst.EmptyLine(indent=True, comment=cst.Comment(
            "# graphmode: buffers (they follow the model), sized again by setup_caches."))])
        for attribute, (stmt, _) in caches.items():
            self.record_edit(stmt, f"`self.{attribute}` made a buffer that setup_caches sizes")
        body = list(current_init.body.body)
        return replace_method(updated, "__init__", current_init.with_changes(
            body=current_init.body.with_changes(body=[*body[:last + 1], *calls, *body[last + 1:]])))

    def finish_module(self, module: cst.Module) -> cst.Module:
        if defined_at_top(module, CACHE_BUFFERS):
            return module
        return insert_after_imports(module, helper_statements(CACHE_BUFFERS))


