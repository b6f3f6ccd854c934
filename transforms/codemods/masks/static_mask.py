"""Replaces a causal mask built inside forward with its rows at the positions, computed per call.

Recognises, in a method that takes a position, the usual construction

    mask = None
    if seqlen > 1:
        mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
        mask = torch.triu(mask, diagonal=1)
        mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask])

(with or without the guard; a fix-up for one kind of device inside it, `if mask.device.type == "mps": ...`,
goes with it) and turns it into `mask = graphmode_filled_rows(self, input_pos, float("-inf"), 1)`: the
rows of the square mask for the positions being computed, one column per slot of the static KV cache,
computed from the positions inside the graph. The square itself is never built: its memory would grow
with the square of the context length (64 GiB as float32 at 131072 positions). Columns past each
position are hidden, which also hides the not-yet-written slots of a static KV cache.

Two more forms get the same treatment:

    mask = torch.tril(torch.ones(seqlen, seqlen, dtype=torch.bool))    # or torch.ones(...).tril(), .view(...)
    mask = _make_causal_mask(seqlen, start_pos)                        # or self._make_causal_mask(...)

The boolean form becomes `graphmode_causal_rows(self, input_pos)` (True: visible). A helper call
is rewritten only when the helper is defined in the same file and builds one of the two masks (full +
triu or tril of ones, with the past columns prepended); the helper itself stays.

An additive `-inf` mask (full + triu) whose every use in the file is seen becomes boolean too, the form
hand-written graph-mode code uses (gpt-fast): boolean rows, True where a column is visible, and each
`scores + mask` becomes `scores.masked_fill(~mask, float("-inf"))`. Adding 0 or -inf and filling with
-inf give the same scores, bit for bit. The uses are followed by name: through the functions of the file
that take a parameter of that name, where the mask may only be added, tested against None, or passed on
to a call defined in the file (or to `scaled_dot_product_attention`, whose boolean masks mean the same).
Any other use, a mask that leaves the file (returned, stored), a parameter of another `*mask*` name, or a
finite fill (`finfo.min`) keeps the additive float mask.
Why it matters: Inductor rewrites matmul + additive mask + softmax + matmul into its CPU flash
attention kernel, which at Decode sizes (one query row) is slower than the fused softmax it generates
for `masked_fill` (bench/three_way.py).

This module is the rewrite; which masks are recognised is `_mask_recognition`, and which additive masks
can become boolean, with the rewrite of their uses, is `_additive_masks`.
"""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.codemods.lib.additive_masks import ApplyPlan, BooleanPlan, boolean_diagonal, plan_boolean
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.mask_recognition import HELPER_NAME, MASK_WORDS, find_mask, mask_reader, \
    mentions_helper, shape_dependent_use
from graphmode.transforms.codemods.lib.module import BufferCodemod, defined_at_top, insert_after_imports, replace_method
from graphmode.transforms.cstutil import POSITION_TENSOR, position_param
from graphmode.transforms.vocabulary import SAME_FILE_MASK_HELPERS


CAUSAL_ROWS = "graphmode_causal_rows"  # the boolean rows of the positions (True: visible)
FILLED_ROWS = "graphmode_filled_rows"  # the rows of an additive mask, `fill` where hidden


class StaticMask(BufferCodemod):
    NAME = "static_mask"
    TITLE = "Compute the causal mask's rows from the positions"
    DESCRIPTION = (
        "Replaces the causal mask built on every call (`torch.full` + `triu`, often only when the input is "
        "longer than one token, so its shape changes with the prompt) with the mask's rows at the positions "
        "computed, one column per slot of the static KV cache: the same shape at every Decode step, and no "
        "(length, length) square held in memory. Decode now gets a mask too, which hides the "
        "unwritten slots of the static KV cache. Scores are unchanged for every written position. "
        "An additive `-inf` mask whose every use in the file is an addition (`scores + mask`) becomes boolean "
        "(True: visible) and each addition `scores.masked_fill(~mask, float(\"-inf\"))`: the same scores, "
        "and the form Inductor compiles to its own fused softmax instead of its slower CPU flash-attention "
        "kernel at Decode sizes."
    )
    SKILL = "static-buffers"
    FIXES = frozenset({"GM201", "GM401"})

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return not words.isdisjoint(MASK_WORDS) or any(HELPER_NAME.match(word) for word in words)
    REQUIRES = ("static_positions",)

    def __init__(self, context, options) -> None:
        super().__init__(context, options)
        self._functions: dict[str, cst.FunctionDef] = {}
        self._boolean: BooleanPlan | None = None  # an additive mask that becomes boolean, with its uses
        self._helpers: set[str] = set()  # the helpers the rows are computed with

    def visit_Module(self, node: cst.Module) -> None:
        self._functions = {s.name.value: s for s in node.body if isinstance(s, cst.FunctionDef)}
        self._boolean = plan_boolean(node, self._functions)

    def passes_over(self, qualname: str) -> bool:
        return self._boolean is None and super().passes_over(qualname)  # the boolean plan rewrites statements

    def leave_BinaryOperation(self, original_node, updated_node):
        if self._boolean is not None and original_node in self._boolean.expressions:
            return self._boolean.expressions[original_node]
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        plan = self._boolean
        if plan is None or original_node not in plan.statements:
            return updated_node
        self.record_edit(original_node, f"`{plan.name}` is boolean now: hidden scores are filled with -inf "
                                        "instead of adding an -inf mask")
        return plan.statements[original_node](updated_node)

    def rewrite_method(self, cls, updated_node, method, body):
        if method.name.value in SAME_FILE_MASK_HELPERS:
            return None  # transformers' mask method: cache_object replaces its call sites instead
        build = find_mask(body, mask_reader(cls, method, self._functions))
        if isinstance(build, str):
            self.record_manual(next((s for s in body if mentions_helper(s)), body[0]), build)
            return None
        if build is None:
            return None
        if position_param(method) is None:
            self.record_manual(body[build.first], "a causal mask is built here, but the method takes no position")
            return None
        if build.checked_uses and (use := shape_dependent_use(build.name, body[build.last + 1 :])) is not None:
            self.record_manual(body[build.first], f"`{build.name}` is used as `{use}` later; rows by position "
                                                  "have a column per slot of the static cache, so that use needs "
                                                  "a look")
            return None
        boolean = self._boolean is not None and self._boolean.method is method
        rows = self._rows(build, boolean)
        select = cst.parse_statement(f"{build.name} = {rows}{build.cast}\n").with_changes(
            leading_lines=[
                *body[build.first].leading_lines,
                cst.EmptyLine(indent=True, comment=cst.Comment(
                    "# graphmode: the causal rows of these positions.")),
            ]
        )
        for stmt in body[build.first : build.last + 1]:
            self.record_edit(stmt, f"`{build.name}` computed as the causal mask's rows of the positions")
        rest = body[build.last + 1 :]
        if boolean:
            # Uses in this method, rewritten on the original statements (the traversal's are discarded).
            rest = [s.visit(ApplyPlan(self._boolean)) for s in rest]
        return replace_method(updated_node, method.name.value, method.with_changes(
            body=method.body.with_changes(body=[*body[: build.first], select, *rest])))

    def _rows(self, build, boolean: bool) -> str:
        """The expression computing the mask's rows at the positions: the boolean rows of `tril` (True: visible), or
        the rows of `full(fill).triu(diagonal)`; each built by a helper from the positions, never as a square."""
        position = POSITION_TENSOR
        if boolean or build.kind == "ones":
            diagonal = boolean_diagonal(build.diagonal) if boolean else (
                "" if build.diagonal == "0" else build.diagonal)
            self._helpers.add(CAUSAL_ROWS)
            rows = f"{CAUSAL_ROWS}(self, {position}{', ' + diagonal if diagonal else ''})"
            if not boolean and build.dtype != "torch.bool":
                rows += f".to({build.dtype or 'torch.get_default_dtype()'})"
            return rows
        self._helpers.update((CAUSAL_ROWS, FILLED_ROWS))
        fill = cst.Module([]).code_for_node(build.fill)
        diagonal = build.diagonal if isinstance(build.diagonal, str) else cst.Module([]).code_for_node(build.diagonal)
        dtype = f", dtype={cst.Module([]).code_for_node(build.dtype.value)}" if build.dtype else ""
        return f"{FILLED_ROWS}(self, {position}, {fill}, {diagonal}{dtype})"

    def finish_module(self, module: cst.Module) -> cst.Module:
        # No buffer of a size graphmode chose: the rows are computed from the positions, so no size constants.
        for name in (FILLED_ROWS, CAUSAL_ROWS):
            if name in self._helpers and not defined_at_top(module, name):
                module = insert_after_imports(module, helper_statements(name))
        return module
