"""Turns a Python-int position argument into a position tensor.

A parameter such as `start_pos: int` becomes `input_pos: torch.Tensor`, holding the positions of the
tokens being computed (`arange(T)` in Prefill, `[pos]` in each Decode step). Its uses are rewritten
where the meaning is certain:

    torch.arange(start_pos, start_pos + seqlen, ...)  ->  input_pos
    layer(h, start_pos, ...) / layer(h, start_pos=start_pos)  ->  the tensor is passed on

Slices by the position (`self.freqs_cis[P : P + n]`, `self.cache_k[:bsz, P : P + n] = xk`) are
rewritten earlier in the chain by `sliced_tables` and `sliced_kv_cache`, which write `input_pos`
directly, so they are gone by the time this codemod runs. Any other use (arithmetic, slicing, a size)
makes the whole file ineligible: each such use is reported as a manual item and nothing in the file
changes, so call chains never end up half converted.
"""
from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from graphmode.transforms.codemods.base import GraphCodemod
from graphmode.transforms.cstutil import POSITION_TENSOR, code_of, position_params, torch_call_name
from graphmode.transforms.dispatch import Transformer


def _is_shifted_arange(call: cst.Call, name: str) -> bool:
    """`torch.arange(P, P + n, ...)` or `torch.arange(P, n + P, ...)`: exactly the new positions."""
    positional = [a.value for a in call.args if a.keyword is None]
    if torch_call_name(call) != "arange" or len(positional) != 2:
        return False
    start, end = positional
    if not (isinstance(start, cst.Name) and start.value == name and isinstance(end, cst.BinaryOperation)
            and isinstance(end.operator, cst.Add)):
        return False
    sides = [end.left, end.right]
    return any(isinstance(s, cst.Name) and s.value == name for s in sides)


class StaticPositions(GraphCodemod):
    NAME = "static_positions"
    TITLE = "Pass positions as a tensor"
    DESCRIPTION = (
        f"Renames Python-int position parameters (`start_pos: int`) to `{POSITION_TENSOR}: torch.Tensor`, the "
        "positions of the tokens being computed, and passes that tensor down the call chain; "
        f"`torch.arange(start_pos, start_pos + n)` becomes `{POSITION_TENSOR}`. Callers now pass "
        f"`torch.arange(T)` for a prompt and `torch.tensor([pos])` for each Decode step, so the step number is "
        "data, not a constant Dynamo guards on."
    )
    SKILL = "positions-as-tensors"
    FIXES = frozenset({"GM501", "GM201"})

    @classmethod
    def may_apply(cls, source, options) -> bool:
        return source.has_position_param

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        plan = _PositionPlan(self)
        tree.visit(plan)
        if plan.blocked:
            for node, reason in plan.blocked:
                self.record_manual(node, reason)
            return tree
        for node, summary in plan.edits:
            self.record_edit(node, summary)
        tree = tree.visit(_ApplyPositions(plan))
        return tree


class _PositionPlan(cst.CSTVisitor):
    """Finds every position parameter and classifies each use; nothing is changed here."""

    def __init__(self, codemod: StaticPositions) -> None:
        self.codemod = codemod
        self.params: set[cst.Param] = set()
        self.aranges: set[cst.Call] = set()
        self.passed: set[cst.Name] = set()
        self.keywords: set[cst.Arg] = set()
        self.edits: list[tuple[cst.CSTNode, str]] = []
        self.blocked: list[tuple[cst.CSTNode, str]] = []
        self._stack: list[str | None] = []
        self._scopes: list[str] = []
        # Uses are looked for only inside a function with a position parameter: a function that neither has one nor
        # holds one is not walked.
        self._wanted = codemod.source.position_functions
        self._passed_over: set[cst.FunctionDef] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.ClassDef, cst.FunctionDef)):
            self._scopes.append(node.name.value)
            if isinstance(node, cst.FunctionDef) and not self._holds_position_function(".".join(self._scopes)):
                self._passed_over.add(node)
                return False
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, (cst.ClassDef, cst.FunctionDef)):
            self._scopes.pop()
            if original_node in self._passed_over:
                return  # its visit_ handlers never ran
        super().on_leave(original_node)

    def _holds_position_function(self, qualname: str) -> bool:
        return any(name == qualname or name.startswith(f"{qualname}.") for name in self._wanted)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        param = next((p for p in position_params(node) if self._changes(node, p)), None)
        if param is not None and param.default is not None:
            self.blocked.append((param, f"`{param.name.value}` has a default value; give callers a tensor by hand"))
            param = None
        if param is not None:
            self.params.add(param)
            self.edits.append((param, f"`{param.name.value}: int` becomes `{POSITION_TENSOR}`"))
        self._stack.append(param.name.value if param is not None else None)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._stack.pop()

    def _changes(self, function: cst.FunctionDef, param: cst.Param) -> bool:
        """With a traced run, a position is an int parameter seen changing every Decode step (a name such as
        `num_pos` alone says nothing); a function the trace never saw run is left alone. Without one, the name."""
        options = self.codemod.options
        if not options.traced:
            return True
        key = (self.codemod.context.filename, self.codemod.qualname(function), param.name.value)
        return key in options.changing_int_params

    def visit_Call(self, node: cst.Call) -> bool:
        name = self._stack[-1] if self._stack else None
        if name and _is_shifted_arange(node, name):
            self.aranges.add(node)
            self.edits.append((node, f"`{code_of(node)}` is the position tensor itself"))
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        name = self._stack[-1] if self._stack else None
        if not name or node.value != name:
            return
        parent = self.codemod.get_metadata(ParentNodeProvider, node)
        if isinstance(parent, cst.Param):
            return
        if isinstance(parent, cst.Arg) and parent.value is node:
            if parent.keyword is None:
                self.passed.add(node)
                return
            if parent.keyword.value == name:
                self.passed.add(node)
                self.keywords.add(parent)
                return
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            return
        self.blocked.append((node, f"`{name}` is used in `{code_of(self._context(node)).strip()}`, which has no "
                                   f"automatic tensor equivalent; rewrite it with `{POSITION_TENSOR}` by hand"))

    def _context(self, node: cst.CSTNode) -> cst.CSTNode:
        """The smallest call or statement around a use, to show it in a message."""
        current = node
        while True:
            parent = self.codemod.get_metadata(ParentNodeProvider, current, None)
            if parent is None or isinstance(current, (cst.Call, cst.BaseSmallStatement)):
                return current
            current = parent


class _ApplyPositions(Transformer):
    """The position parameters renamed and their uses rewritten. The entry class's own `forward` needs no
    conversion of its own: only the entry points reach the static path, and they pass a position tensor, while the
    model's other callers (an int start) run the original body kept beside it (transforms.output.static_path)."""

    def __init__(self, plan: _PositionPlan) -> None:
        self.plan = plan

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        if original_node not in self.plan.params:
            return updated_node
        annotation = updated_node.annotation
        if annotation is not None:
            annotation = annotation.with_changes(annotation=cst.parse_expression("torch.Tensor"))
        return updated_node.with_changes(name=cst.Name(POSITION_TENSOR), annotation=annotation)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        return cst.Name(POSITION_TENSOR) if original_node in self.plan.aranges else updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return cst.Name(POSITION_TENSOR) if original_node in self.plan.passed else updated_node

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node in self.plan.keywords:
            return updated_node.with_changes(keyword=cst.Name(POSITION_TENSOR))
        return updated_node
