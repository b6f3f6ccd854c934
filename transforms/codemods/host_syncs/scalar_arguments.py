"""Moves a tensor given as an op's Python-number argument (`alpha=`, `beta=`, `value=`) into the operand it scales.

    attn_scores = torch.baddbmm(attn_scores, query, key.transpose(1, 2), beta=1.0,
                                alpha=torch.tensor(1.0, dtype=self.norm_factor.dtype) / self.norm_factor)

`alpha` and `beta` of `baddbmm`, `addmm` and their kin are Python numbers to the op. Given a 0-dim tensor,
the op reads it on the host every call, a sync that Dynamo cannot put in a graph, so the graph breaks
there in every layer. The op is linear in each operand (`beta * input + alpha * (batch1 @ batch2)`), so
the tensor becomes a factor of the operand it scales and stays on the device:

    attn_scores = torch.baddbmm(attn_scores, query * (torch.tensor(1.0, dtype=self.norm_factor.dtype)
                                / self.norm_factor), key.transpose(1, 2), beta=1.0)

The products are the same up to rounding (the factor is applied before the matrix product instead of after).
Which arguments are tensors is what the traced run saw (a host sync on that statement in Decode); without a
trace, only an argument built by a torch call is taken for one. Number literals and plain attributes are
left alone: `alpha=self.inv_norm_factor` is usually a Python float.
"""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.analysis.idioms import produces_tensor
from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.cstutil import code_of, dotted_name

# op -> {scalar keyword: (position, keyword) of the operand it multiplies}, positions counted for `torch.op(...)`;
# the method form `input.op(...)` has them one lower.
_SCALED_OPERANDS: dict[str, dict[str, tuple[int, str]]] = {
    "baddbmm": {"alpha": (1, "batch1"), "beta": (0, "input")},
    "addbmm": {"alpha": (1, "batch1"), "beta": (0, "input")},
    "addmm": {"alpha": (1, "mat1"), "beta": (0, "input")},
    "addmv": {"alpha": (1, "mat"), "beta": (0, "input")},
    "addr": {"alpha": (1, "vec1"), "beta": (0, "input")},
    "addcmul": {"value": (1, "tensor1")},
    "addcdiv": {"value": (1, "tensor1")},
}
_COMMENT = "# graphmode: the tensor scale multiplies an operand; as the op's number argument it was read on the host."


def _is_number(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    return isinstance(node, cst.UnaryOperation) and _is_number(node.expression)


def _factor(node: cst.BaseExpression) -> str:
    """The factor's code, in parentheses when it is an operation, on one line."""
    text = " ".join(code_of(node).split())
    if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation, cst.BooleanOperation, cst.IfExp)) \
            and not node.lpar:
        return f"({text})"
    return text


class ScalarArguments(StepCodemod):
    NAME = "scalar_arguments"
    TITLE = "Multiply tensor scales into the operands instead of passing them as `alpha`/`beta`"
    DESCRIPTION = (
        "`torch.baddbmm(input, b1, b2, alpha=<tensor>)` (and `addmm`, `addbmm`, `addmv`, `addr`, `addcmul`, "
        "`addcdiv`) reads the tensor on the host every call, which breaks the graph; the tensor becomes a factor "
        "of the operand it scales (`b1 * (t)`), which the op's linearity makes equal up to rounding."
    )
    SKILL = "host-syncs"
    FIXES = frozenset({"GM101"})
    IDIOM_IN_ONE_FUNCTION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return not words.isdisjoint(_SCALED_OPERANDS)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._synced = {line for file, line in self.options.host_sync_lines if file == self.context.filename}
        # (the statement, scales moved in it), innermost last; its line is looked up only when a scale is found
        self._statements: list[tuple[cst.SimpleStatementLine, list[str]]] = []
        return super().transform_module_impl(tree)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statements.append((node, []))

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        _, moved = self._statements.pop()
        if not moved:
            return updated_node
        return updated_node.with_changes(leading_lines=[
            *updated_node.leading_lines, cst.EmptyLine(indent=True, comment=cst.Comment(_COMMENT))])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = dotted_name(original_node.func)
        op = name.rsplit(".", 1)[-1] if name else None
        if op not in _SCALED_OPERANDS or not self._statements or not self.in_step_code(original_node):
            return updated_node
        shift = 0 if name == f"torch.{op}" else 1  # `input.op(b1, b2, ...)`: the input is the receiver
        args = list(updated_node.args)
        moved = []
        for keyword, (position, operand_keyword) in _SCALED_OPERANDS[op].items():
            scale = next((a for a in args if a.keyword is not None and a.keyword.value == keyword), None)
            if scale is None or _is_number(scale.value) or not self._is_tensor(original_node, keyword):
                continue
            target = next((a for a in args if a.keyword is not None and a.keyword.value == operand_keyword), None)
            if target is None:
                positional = [a for a in args if a.keyword is None and not a.star]
                index = position - shift
                target = positional[index] if 0 <= index < len(positional) else None
            if target is None:
                continue  # the operand is the receiver (`input.op(..., beta=t)`): not rewritten
            scaled = cst.parse_expression(f"{_factor(target.value)} * {_factor(scale.value)}")
            index = args.index(scale)
            if index == len(args) - 1 and index > 0:  # the new last argument keeps the call's closing layout
                args[index - 1] = args[index - 1].with_changes(comma=scale.comma)
            args = [a.with_changes(value=scaled) if a is target else a for a in args if a is not scale]
            moved.append(keyword)
        if not moved:
            return updated_node
        self._statements[-1][1].extend(moved)
        self.record_edit(original_node, f"`{op}`'s tensor {', '.join(f'`{k}`' for k in moved)} moved into the "
                                        "operand it scales")
        return updated_node.with_changes(args=args)

    def _is_tensor(self, call: cst.Call, keyword: str) -> bool:
        """Whether the call's `keyword=` argument is a tensor. A host sync on the statement in the traced Decode says
        so; without a trace, a torch call building it, judged on the chain's `ast` parse of the original call (the
        updated call's nodes have no position: a keyword is given once, so the original's argument is the same)."""
        if self.options.traced:
            return self._lines(self._statements[-1][0])[0] in self._synced
        value = next(a.value for a in call.args if a.keyword is not None and a.keyword.value == keyword)
        return produces_tensor(self.ast_of(value))
