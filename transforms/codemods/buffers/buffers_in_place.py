"""Writes a buffer the step recomputes into its own memory, instead of binding a new tensor to it.

    self.inv_freq = 1.0 / (ext_factors * self.base**inv_freq_shape)    # a new tensor every step

becomes

    graphmode_write_buffer(self, "inv_freq", 1.0 / (ext_factors * self.base**inv_freq_shape))

A captured graph (npugraph_ex, CUDA graphs) replays against the addresses it was captured with: a buffer rebound
every step leaves the replay reading the memory of the step it was captured in. `graphmode_write_buffer` copies the
value into the buffer where shape, dtype and device agree, and binds it as the original did otherwise (the first
write to a buffer registered as None, in eager Prefill). Only `self.NAME = ...` in step code is touched, where the
file makes NAME a buffer (`register_buffer`, `nn.Buffer`), and the statement is neither the buffer's first value
(under `if self.NAME is None:`) nor in a function that registers buffers anew (a table built at a new length); the
values every later read sees are the same. A buffer moved and cast to where it already is on every call
(`self.pos_encoding = self.pos_encoding.to(device=..., dtype=...)`, CTRL) is written the same way: Dynamo breaks its
graph at a buffer's registration, and not at a copy.
"""
from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import ParentNodeProvider

from graphmode.transforms.analysis.buffers import first_value_lines, registered_buffers
from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import WRITE_BUFFER
from graphmode.transforms.codemods.lib.module import defined_at_top, insert_after_imports
from graphmode.transforms.cstutil import code_of
from graphmode.transforms.positions import module_code

_COMMENT = "# graphmode: written into the buffer's memory, which a captured graph keeps reading."


class BuffersInPlace(StepCodemod):
    NAME = "buffers_in_place"
    TITLE = "Write buffers the step recomputes in place"
    DESCRIPTION = (
        "`self.name = value` in step code, where `name` is a registered buffer, becomes "
        "`graphmode_write_buffer(self, \"name\", value)`: the value is copied into the buffer's memory when shape, "
        "dtype and device agree, and bound as before otherwise (the first write). Every later read sees the same "
        "values; a captured graph keeps reading the memory it was captured with."
    )
    SKILL = "static-buffers"
    FIXES = frozenset({"GM203"})
    IDIOM_IN_ONE_FUNCTION = True

    @classmethod
    def may_apply(cls, source, options) -> bool:
        return not source.words.isdisjoint({"register_buffer", "Buffer"})

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._buffers = registered_buffers(self.source.tree) if tree is self.source.module else \
            registered_buffers(ast.parse(module_code(tree)))
        module = super().transform_module_impl(tree)
        if self.edits and not defined_at_top(module, WRITE_BUFFER):
            module = insert_after_imports(module, helper_statements(WRITE_BUFFER))
        return module

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine):
        found = self._rebound_buffer(original_node, updated_node)
        if found is None:
            return updated_node
        owner, name, value = found
        self.record_edit(original_node, f"`{owner}.{name}` is written into the buffer's memory")
        call = cst.parse_statement(f'{WRITE_BUFFER}({owner}, "{name}", {code_of(value).strip()})\n')
        comment = cst.EmptyLine(indent=True, comment=cst.Comment(_COMMENT))
        return call.with_changes(leading_lines=[*updated_node.leading_lines, comment])

    def _rebound_buffer(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                        ) -> tuple[str, str, cst.BaseExpression] | None:
        """(owner, buffer, value) where the line is `self.buffer = value` in step code, neither the buffer's first
        value nor in a function that makes buffers anew (tables built at a new length: new tensors in any case)."""
        assign = updated.body[0] if len(updated.body) == 1 else None
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        if not (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
                and target.attr.value in self._buffers):
            return None
        owner, name = target.value.value, target.attr.value
        function = self._function(original)
        if function is None or owner != self._first_parameter(function) or not self.in_step_code(original):
            return None
        # The chain's `ast` parse of the function: the first values and the buffers it makes are read off it, as
        # GM203 reads them (transforms.analysis.buffers).
        parsed = self.ast_of(function)
        if self._lines(original)[0] in first_value_lines(parsed) or registered_buffers(parsed):
            return None  # a buffer's first value, or tables built anew: new tensors in any case
        return owner, name, assign.value

    def _function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        current = node
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.get_metadata(ParentNodeProvider, current, None)
        return current

    @staticmethod
    def _first_parameter(function: cst.FunctionDef) -> str | None:
        """The name of the function's first parameter (`self`), or None."""
        return function.params.params[0].name.value if function.params.params else None
