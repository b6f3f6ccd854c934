"""Keeps a scalar read with `.item()` as a tensor when it only feeds tensor arithmetic.

    scale = self.logit_scale.exp().item()      # waits for the device, copies one number to the host
    logits = logits * scale

becomes

    scale = self.logit_scale.exp()             # a 0-dim tensor, computed on the device
    logits = logits * scale

A 0-dim tensor in arithmetic with a tensor promotes like the Python number it replaces (it counts as a
scalar), so the result has the same values and dtype; Decode no longer waits for the device mid-step and
Dynamo no longer breaks its graph there. Only step code is touched, and only when every use of the name
is an operand of `+ - * / **` next to something that is not a number literal. A name also used as a
Python number (a slice bound, `range`, an `if`, a format string) is reported with the line of that use:
it must be computed in the eager caller and passed in, or the code rewritten to index with a tensor.
`int(t)`, `float(t)` and `t.tolist()` of a tensor are reported the same way and left as they are: as a
tensor, `int` would no longer truncate and a list would no longer be a list.
"""
from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from graphmode.transforms.analysis.idioms import produces_tensor, tensor_names
from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.cstutil import code_of, host_sync_call, single_assignment, walk

_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.Power)
_COMMENT = "# graphmode: stays a 0-dim tensor (was `.item()`): only tensor arithmetic reads it."


def _item_source(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`E.item()` -> E."""
    return value.func.value if host_sync_call(value) == "item" else None


def _is_number_literal(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    return isinstance(node, cst.UnaryOperation) and _is_number_literal(node.expression)


class HostScalars(StepCodemod):
    NAME = "host_scalars"
    TITLE = "Keep scalars read with `.item()` on the device"
    DESCRIPTION = (
        "`x = t.item()` in step code, where `x` only feeds tensor arithmetic, becomes `x = t`: a 0-dim tensor "
        "promotes like the number it replaces, so values and dtypes stay the same, and Decode no longer waits "
        "for the device mid-step nor breaks its graph there."
    )
    SKILL = "host-syncs"
    FIXES = frozenset({"GM101"})

    IDIOM_IN_ONE_FUNCTION = True

    @classmethod
    def may_apply(cls, source, options) -> bool:
        # A file with no `.item()` is left alone, its `int()`/`float()` conversions too (those words are in every
        # file); a `.tolist()` is always a read to report.
        return not source.words.isdisjoint({"item", "tolist"})

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return not words.isdisjoint({"item", "int", "float", "tolist"})  # a read to keep, or a conversion to report

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef):
        if not self.in_step_code(original_node) or not isinstance(original_node.body, cst.IndentedBlock):
            return updated_node
        replace: dict[cst.CSTNode, cst.CSTNode] = {}
        tensors: frozenset[str] | None = None
        for stmt in original_node.body.body:
            assigned = single_assignment(stmt)
            source = _item_source(assigned[1]) if assigned else None
            if source is None:
                conversion = _conversion(assigned[1]) if assigned else None
                if conversion is not None:
                    # The rules' guess at which local names hold tensors (transforms.analysis.idioms), read off the
                    # chain's `ast` parse of this function.
                    tensors = tensor_names(self.ast_of(original_node)) if tensors is None else tensors
                    if produces_tensor(self.ast_of(conversion[1]), tensors):
                        self.record_manual(stmt, f"`{assigned[0]} = {code_of(assigned[1]).strip()}` waits for the "
                                                 f"device and makes a Python {conversion[0]}; compute it in the eager "
                                                 "caller and pass it in, or keep working on the tensor")
                continue
            name = assigned[0]
            problem = self._non_tensor_use(original_node, name)
            if problem:
                self.record_manual(stmt, f"`{name} = {code_of(assigned[1]).strip()}` waits for the device, and "
                                         f"`{name}` is used as a Python number ({problem}); compute it in the eager "
                                         "caller and pass it in, or index with a tensor instead")
                continue
            new = stmt.with_changes(body=[stmt.body[0].with_changes(value=source)], leading_lines=[
                *stmt.leading_lines, cst.EmptyLine(indent=True, comment=cst.Comment(_COMMENT))])
            replace[stmt] = new
            self.record_edit(stmt, f"`{name}` stays a tensor instead of `.item()`")
        if not replace:
            return updated_node
        body = [replace.get(original, new) for original, new in zip(original_node.body.body, updated_node.body.body)]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def _non_tensor_use(self, function: cst.FunctionDef, name: str) -> str | None:
        """Why `name` cannot stay a tensor (the first use that needs a number), or None."""
        reads, assignments = _reads_and_assignments(function, name)
        if assignments != 1:
            return "it is assigned more than once"
        if not reads:
            return "it is never read"
        return next(filter(None, (self._needs_a_number(use) for use in reads)), None)

    def _needs_a_number(self, use: cst.Name) -> str | None:
        """Where this read needs a number: anything but arithmetic, or arithmetic with a number literal."""
        parent = self.get_metadata(ParentNodeProvider, use)
        if not (isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, _ARITHMETIC)):
            return f"line {self._lines(use)[0]}"
        other = parent.right if parent.left is use else parent.left
        return f"line {self._lines(use)[0]}, with a number literal" if _is_number_literal(other) else None


def _reads_and_assignments(function: cst.FunctionDef, name: str) -> tuple[list[cst.Name], int]:
    """The names reading `name` in the function's body, and how many plain `name = ...` assign it."""
    uses: list[cst.Name] = []
    targets: list[cst.Name] = []
    for node in walk(function.body):  # in a CSTVisitor's order, without building every node again
        if type(node) is cst.Name and node.value == name:
            uses.append(node)
        elif type(node) is cst.AssignTarget and isinstance(node.target, cst.Name) and node.target.value == name:
            targets.append(node.target)
    return [use for use in uses if not any(use is target for target in targets)], len(targets)


def _conversion(value: cst.BaseExpression) -> tuple[str, cst.BaseExpression] | None:
    """`int(E)` / `float(E)` -> ("int", E); `E.tolist()` -> ("list", E)."""
    if not isinstance(value, cst.Call):
        return None
    if isinstance(value.func, cst.Name) and value.func.value in ("int", "float") and len(value.args) == 1 \
            and value.args[0].keyword is None and not value.args[0].star:
        return value.func.value, value.args[0].value
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "tolist" and not value.args:
        return "list", value.func.value
    return None

