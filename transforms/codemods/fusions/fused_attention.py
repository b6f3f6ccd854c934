"""Turns a hand-written attention into one fused attention operator.

Recognises, in one block of step code, the chain

    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)      # or q @ k.transpose(-2, -1), `* scale`, no scale
    if mask is not None:                                            # optional, guarded or not:
        scores = scores + mask                                      #   an additive mask, or
        scores = scores.masked_fill(~mask, float("-inf"))           #   a boolean one (True: visible)
    probs = F.softmax(scores.float(), dim=-1).type_as(q)            # any spelling; dtype=torch.float32; a cast
    probs = F.dropout(probs, p=p, training=self.training)           # optional
    out = torch.matmul(probs, v) ...                                # or probs @ v, inside a longer expression

where the scores and the probabilities are read nowhere after the last line (a function that returns its attention
weights keeps them). Checks that only raise, and read the scores (`if scores.size() != ...: raise`), go with them:
on the static path no tensor holds the scores any more.

- Portable form (CUDA backends; not on CPU, where Inductor's own fusion of the chain is faster at Decode sizes):
  `F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
  dropout_p=..., scale=...)`, the scale written out (SDPA's default is not the model's when it scales otherwise).
- NPU form (npugraph_ex, GE): `torch_npu.npu_fused_infer_attention_score(q, k, v, atten_mask=..., num_heads=...,
  num_key_value_heads=..., input_layout="BNSD", scale=...)[0]`, whose mask is True where a position is hidden: the
  boolean mask inverted, an additive one's negative entries. No `actual_seq_lengths`: a static KV cache is read
  whole and the mask hides the slots not yet written, so no per-step list of Python ints (a recompile each step
  under npugraph_ex) enters the graph. Only with dropout absent: the inference kernel has none.

Accumulation order: the fused kernels accumulate the softmax and the weighted sum in their own order (in q's
dtype where the original upcast the softmax to float32): logits move by float rounding, which verification
measures.
"""
from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.codemods.lib.fusion import CPU, NPU, bare, functional_prefix, replaced, wants_torch_npu
from graphmode.transforms.cstutil import code_of, dotted_name, integer_value, names_in, none_test, nodes_of_type, \
    only_raises, single_assignment

_SOFTMAX = frozenset({"torch.softmax", "F.softmax", "nn.functional.softmax", "torch.nn.functional.softmax",
                      "functional.softmax"})
_DROPOUT = frozenset({"F.dropout", "nn.functional.dropout", "torch.nn.functional.dropout", "functional.dropout",
                      "torch.dropout"})
_KEY_TRANSPOSES = ({2, 3}, {-2, -1})


@dataclass
class _Chain:
    q: cst.BaseExpression
    k: cst.BaseExpression
    scale: str | None  # code of the scale SDPA is given; None: the scores were not scaled (scale 1)
    mask: cst.BaseExpression | None
    mask_kind: str  # "additive" | "visible" | "" (none)
    mask_guard: str | None  # `name` of `if name is not None:` around the masking
    dropout: cst.BaseExpression | None  # the `p` of a training-only dropout
    removed: list[int]  # indexes in the block of the statements that go
    output: int  # index of the statement holding `probs @ v`
    product: cst.BaseExpression  # the `probs @ v` node in it
    v: cst.BaseExpression
    names: tuple[str, ...]  # the scores' and probabilities' names


def _int_of(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        value = integer_value(node.expression)
        return None if value is None else -value
    return integer_value(node)


def _matmul_operands(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """`torch.matmul(a, b)` / `a @ b` -> (a, b)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return node.left, node.right
    if isinstance(node, cst.Call) and dotted_name(node.func) == "torch.matmul" and len(node.args) == 2 \
            and all(a.keyword is None for a in node.args):
        return node.args[0].value, node.args[1].value
    return None


def _transposed_key(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`k.transpose(2, 3)` (or -2, -1 in either order) -> k."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "transpose" \
            and len(node.args) == 2 and {_int_of(a.value) for a in node.args} in _KEY_TRANSPOSES:
        return node.func.value
    return None


def _scores(value: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression, str | None] | None:
    """`matmul(q, k^T) [/ s | * s]` -> (q, k, the scale's code or None)."""
    scale = None
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Divide, cst.Multiply)):
        divisor = code_of(value.right).strip()
        scale = f"1 / {divisor}" if isinstance(value.operator, cst.Divide) else divisor
        if isinstance(value.operator, cst.Divide) and isinstance(value.right, cst.BinaryOperation):
            scale = f"1 / ({divisor})"
        value = value.left
    operands = _matmul_operands(bare(value))
    if operands is None:
        return None
    key = _transposed_key(operands[1])
    return (operands[0], key, scale) if key is not None else None


def _masking(stmt: cst.BaseStatement, scores: str) -> tuple[cst.BaseExpression, str] | None:
    """`scores = scores + M` -> (M, "additive"); `scores = scores.masked_fill(~M, float("-inf"))` -> (M, "visible")."""
    assigned = single_assignment(stmt)
    if assigned is None or assigned[0] != scores:
        return None
    value = assigned[1]
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add) \
            and m.matches(value.left, m.Name(scores)) and scores not in names_in(value.right):
        return value.right, "additive"
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and value.func.attr.value == "masked_fill" and m.matches(value.func.value, m.Name(scores)) \
            and len(value.args) == 2 and isinstance(value.args[0].value, cst.UnaryOperation) \
            and isinstance(value.args[0].value.operator, cst.BitInvert) \
            and code_of(value.args[1].value).replace("'", '"').strip() == 'float("-inf")':
        return value.args[0].value.expression, "visible"
    return None


def _softmax_of(value: cst.BaseExpression) -> str | None:
    """The name of the scores a last-dim softmax (cast or not, before or after) takes."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and value.func.attr.value in ("type_as", "to", "float") and not _is_softmax(value):
        value = value.func.value
    if not _is_softmax(value):
        return None
    operand = value.func.value if isinstance(value.func, cst.Attribute) and value.func.attr.value == "softmax" \
        and dotted_name(value.func) not in _SOFTMAX else value.args[0].value
    args = value.args if operand is not value.args[0].value else value.args[1:]
    dims = [a.value for a in args if a.keyword is None or a.keyword.value == "dim"]
    others = [a for a in args if a.keyword is not None and a.keyword.value not in ("dim", "dtype")]
    if len(dims) != 1 or _int_of(dims[0]) not in (-1, 3) or others:
        return None
    if isinstance(operand, cst.Call) and isinstance(operand.func, cst.Attribute) \
            and operand.func.attr.value == "float" and not operand.args:
        operand = operand.func.value
    return operand.value if isinstance(operand, cst.Name) else None


def _is_softmax(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Call) and (dotted_name(value.func) in _SOFTMAX or (
        isinstance(value.func, cst.Attribute) and value.func.attr.value == "softmax" and bool(value.args)))


def _dropout_p(stmt: cst.BaseStatement, probs: str) -> cst.BaseExpression | None:
    """`probs = F.dropout(probs, p=P, training=self.training)` -> P."""
    assigned = single_assignment(stmt)
    if assigned is None or assigned[0] != probs or not isinstance(assigned[1], cst.Call) \
            or dotted_name(assigned[1].func) not in _DROPOUT:
        return None
    args = assigned[1].args
    if not args or not m.matches(args[0].value, m.Name(probs)):
        return None
    named = {a.keyword.value: a.value for a in args[1:] if a.keyword is not None}
    positional = [a.value for a in args[1:] if a.keyword is None]
    p = named.get("p", positional[0] if positional else None)
    training = named.get("training", positional[1] if len(positional) > 1 else None)
    if p is None or not m.matches(training, m.Attribute(value=m.Name("self"), attr=m.Name("training"))):
        return None
    return p


class FusedAttention(StepCodemod):
    NAME = "fused_attention"
    TITLE = "Compute a hand-written attention with one fused attention operator"
    DESCRIPTION = (
        "Replaces matmul -> scale -> mask -> softmax -> matmul on the static path with "
        "`F.scaled_dot_product_attention` under the CUDA backends (not on CPU, where Inductor fuses the chain "
        "itself, faster at Decode sizes), or with "
        "`torch_npu.npu_fused_infer_attention_score` (BNSD layout, the mask inverted to its hidden-is-True "
        "convention, no per-step lengths) under npugraph_ex and GE: one kernel instead of four or five, and the "
        "scores and probabilities (one row per head and cached position) are never written to memory. The softmax "
        "is accumulated in the kernel's order and dtype: logits move by float rounding."
    )
    SKILL = "fusion"
    FIXES = frozenset()
    FUSION = True
    IDIOM_IN_ONE_FUNCTION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        # Not on CPU: there Inductor fuses the hand-written chain into one softmax kernel, which at Decode sizes (one
        # query row) is faster than the CPU flash-attention kernel SDPA becomes (measured on the bundled example:
        # Decode 0.31-0.44 ms/token with it, 0.18-0.25 without).
        return (options.fused_ops != CPU and "softmax" in words and "transpose" in words
                and ("matmul" in words or ":MatMult" in words))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef):
        if self.options.fused_ops == CPU or not self.in_step_code(original_node):
            return updated_node
        asked: list[ast.AST] = []

        def function() -> ast.AST:
            """The function's `ast`, asked for only once a chain is found: its position costs a generation of the
            function, and most step functions with the words hold no chain."""
            if not asked:
                asked.append(self.ast_of(original_node))
            return asked[0]

        new_blocks: dict[cst.IndentedBlock, cst.IndentedBlock] = {}
        for block in nodes_of_type(original_node, cst.IndentedBlock):
            rebuilt = self._block(block, function)
            if rebuilt is not None:
                new_blocks[block] = rebuilt
        return replaced(original_node, new_blocks) if new_blocks else updated_node

    def _block(self, block: cst.IndentedBlock, function: Callable[[], ast.AST]) -> cst.IndentedBlock | None:
        body = list(block.body)
        changed = False
        for index in range(len(body)):
            chain = self._chain(body, index, function)
            if chain is None:
                continue
            for removed in chain.removed:
                self.record_edit(block.body[removed], "inside the fused attention operator")
            self.record_edit(block.body[chain.output], "one fused attention operator")
            fused = self._fused_call(chain)
            statements = _with_fused(body[chain.output], chain.product, fused, function())
            comment = cst.EmptyLine(indent=True, comment=cst.Comment(
                "# graphmode: fused attention; no score matrix in memory."))
            leading = [*body[chain.removed[0]].leading_lines, *statements[0].leading_lines, comment]
            statements[0] = statements[0].with_changes(leading_lines=leading)
            for removed in chain.removed:
                body[removed] = None
            body[chain.output] = statements
            changed = True
        if not changed:
            return None
        flat = [s for item in body if item is not None for s in (item if isinstance(item, list) else [item])]
        return block.with_changes(body=flat)

    def _chain(self, body: list, start: int, function: Callable[[], ast.AST]) -> _Chain | None:
        first = body[start]
        assigned = single_assignment(first) if first is not None else None
        if assigned is None:
            return None
        scores_name, value = assigned
        parsed = _scores(value)
        if parsed is None:
            return None
        q, k, scale = parsed
        removed, mask, mask_kind, guard, probs_name, dropout = [start], None, "", None, None, None
        index = start + 1
        while index < len(body):
            stmt = body[index]
            if stmt is None or isinstance(stmt, list):  # a statement an earlier chain of this block rewrote
                return None
            if only_raises(stmt) and scores_name in names_in(stmt):
                removed.append(index)
            elif mask is None and probs_name is None and (found := _masking(stmt, scores_name)) is not None:
                mask, mask_kind = found
                removed.append(index)
            elif mask is None and probs_name is None and isinstance(stmt, cst.If) and stmt.orelse is None \
                    and (found := self._guarded_mask(stmt, scores_name)) is not None:
                mask, mask_kind, guard = found
                removed.append(index)
            elif probs_name is None and (product := _product_in(stmt, scores_name, inline_softmax=True)):
                # `softmax(scores) @ v` in one expression: the probabilities have no name of their own.
                names = (scores_name,)
                chain = _Chain(q, k, scale, mask, mask_kind, guard, None, removed, index, product[0], product[1],
                               names)
                return chain if self._unread_after(stmt, names, function) and self._fits(chain) else None
            elif probs_name is None and (assigned := single_assignment(stmt)) is not None \
                    and _softmax_of(assigned[1]) == scores_name:
                probs_name = assigned[0]
                removed.append(index)
            elif probs_name is not None and dropout is None and (p := _dropout_p(stmt, probs_name)) is not None:
                dropout = p
                removed.append(index)
            elif probs_name is not None:
                product = _product_in(stmt, probs_name)
                if product is None:
                    return None
                names = tuple(dict.fromkeys((scores_name, probs_name)))
                chain = _Chain(q, k, scale, mask, mask_kind, guard, dropout, removed, index, product[0], product[1],
                               names)
                return chain if self._unread_after(stmt, names, function) and self._fits(chain) else None
            else:
                return None
            index += 1
        return None

    def _guarded_mask(self, stmt: cst.If, scores: str):
        """`if name is not None:` holding only the masking (and checks that raise) -> (mask, kind, name)."""
        tested = none_test(stmt.test)
        if tested is None or tested[1] or not isinstance(stmt.body, cst.IndentedBlock):
            return None
        inner = [s for s in stmt.body.body if not only_raises(s)]
        found = _masking(inner[0], scores) if len(inner) == 1 else None
        if found is None or not (isinstance(found[0], cst.Name) and found[0].value == tested[0]):
            return None
        return found[0], found[1], tested[0]

    def _unread_after(self, stmt: cst.BaseStatement, names: tuple[str, ...], function: Callable[[], ast.AST]
                      ) -> bool:
        """No line after `stmt` reads the scores or the probabilities (a returned attention map keeps them)."""
        end = self._lines(stmt)[1]
        return not any(isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names
                       and node.lineno > end for node in ast.walk(function()))

    def _fits(self, chain: _Chain) -> bool:
        # The inference kernel has no dropout; a model that trains with it keeps its own attention under NPU.
        return not (self.options.fused_ops == NPU and chain.dropout is not None)

    def _fused_call(self, chain: _Chain) -> cst.BaseExpression:
        q, k, v = (code_of(bare(x)).strip() for x in (chain.q, chain.k, chain.v))
        scale = chain.scale or "1.0"
        if self.options.fused_ops == NPU:
            wants_torch_npu(self.context)
            hidden = {"visible": "~{m}", "additive": "{m} < 0"}.get(chain.mask_kind, "")
            args = [q, k, v]
            if chain.mask is not None:
                mask = code_of(chain.mask).strip()
                text = hidden.format(m=mask if isinstance(chain.mask, cst.Name) else f"({mask})")
                args.append(f"atten_mask=None if {chain.mask_guard} is None else {text}" if chain.mask_guard
                            else f"atten_mask={text}")
            args += [f"num_heads={q}.shape[1]", f"num_key_value_heads={k}.shape[1]", 'input_layout="BNSD"',
                     f"scale={scale}"]
            return cst.parse_expression(f"torch_npu.npu_fused_infer_attention_score({', '.join(args)})[0]")
        prefix = functional_prefix(self.source.unnumbered_tree, self.context)
        args = [q, k, v]
        if chain.mask is not None:
            args.append(f"attn_mask={code_of(chain.mask).strip()}")
        if chain.dropout is not None:
            args.append(f"dropout_p={code_of(chain.dropout).strip()} if self.training else 0.0")
        args.append(f"scale={scale}")
        return cst.parse_expression(f"{prefix}.scaled_dot_product_attention({', '.join(args)})")


def _product_in(stmt: cst.BaseStatement, probs: str, inline_softmax: bool = False
                ) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The `probs @ v` node of a simple statement, and v; with `inline_softmax`, `softmax(scores) @ v` where
    `probs` names the scores."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    for node in [*nodes_of_type(stmt, cst.Call), *nodes_of_type(stmt, cst.BinaryOperation)]:
        operands = _matmul_operands(node)
        if operands is None or probs in names_in(operands[1]):
            continue
        left = bare(operands[0])
        if (_softmax_of(left) == probs) if inline_softmax else m.matches(left, m.Name(probs)):
            return node, operands[1]
    return None


def _with_fused(stmt: cst.SimpleStatementLine, product: cst.BaseExpression, fused: cst.BaseExpression,
                function: ast.AST) -> list[cst.SimpleStatementLine]:
    """`out = probs @ v` -> [`out = fused`]; a product inside a longer expression gets a line of its own first,
    so the fused call reads as one call: [`attention = fused`, `out = attention.transpose(...)...`]."""
    assigned = single_assignment(stmt)
    if assigned is not None and bare(assigned[1]) is product or assigned is not None and assigned[1] is product:
        return [replaced(stmt, {product: fused})]
    taken = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
    name = next(n for n in ("attention", "attn", "graphmode_attention") if n not in taken)
    first = cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=fused)])
    return [first, replaced(stmt, {product: cst.Name(name)}).with_changes(leading_lines=[])]
