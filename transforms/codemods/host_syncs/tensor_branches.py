"""Turns a Python branch on a tensor value into a selection on the device, where that keeps its meaning.

    if torch.isinf(hidden).any():                        # reads the device to choose a path
        limit = torch.finfo(hidden.dtype).max - 1000
        hidden = hidden.clamp(-limit, limit)

becomes

    limit = torch.finfo(hidden.dtype).max - 1000
    hidden = torch.where(torch.isinf(hidden).any(), hidden.clamp(-limit, limit), hidden)

Both sides are computed and `torch.where` picks one per element; the condition is a 0-dim tensor, so it
picks the same side everywhere, as the `if` did. That is the same result only when the body is one update
of a tensor by an elementwise op of itself (`clamp`, `nan_to_num`, arithmetic with numbers),
which keeps its shape and dtype; helper assignments before it must be pure (numbers, `finfo`).
A static part of the test (`x.dtype == torch.float16 and ...`) stays a Python `if`, which Dynamo settles
while tracing. Any other branch on a tensor value is reported with the reason and left as it is.

An `if`/`else` that binds one name from two values of one kind (the same `torch` call with the same keywords, as
LongRoPE rotaries pick their factors), on a tensor test or one the trace saw compare the positions with a number,

    if seq_len > self.original_max_position_embeddings:
        ext_factors = torch.tensor(self.long_factor, dtype=torch.float32, device=x.device)
    else:
        ext_factors = torch.tensor(self.short_factor, dtype=torch.float32, device=x.device)

becomes one selection of the two, which holds however far the static path's positions reach (the branch may flip
mid-generation, past the original length):

    ext_factors = torch.where(
        seq_len > self.original_max_position_embeddings,
        torch.tensor(self.long_factor, dtype=torch.float32, device=x.device),
        torch.tensor(self.short_factor, dtype=torch.float32, device=x.device),
    )

A test the trace saw compare how far the positions reach with a Python int (dynamic NTK rotary embeddings)

    seq_len = torch.max(position_ids) + 1
    if seq_len > self.max_position_embeddings:           # recompute the rotary frequencies

gets the static path's own limit in front of it, in the same comparison:

    if graphmode_position_limit(self) > self.max_position_embeddings and seq_len > self.max_position_embeddings:

No position the entries pass reaches the number of slots `setup_caches` allocated, so the count of positions is
at most that limit and the test means what it meant. Where the limit is at most the bound (`setup_caches` never
allocates past the config's `max_position_embeddings`), the first part is a Python `False` that Dynamo settles,
and the compiled Decode never reads the device for the second.
"""
from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import ParentNodeProvider

from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import POSITION_LIMIT as LIMIT  # the static path's slots
from graphmode.transforms.codemods.lib.module import defined_at_top, insert_after_imports
from graphmode.transforms.cstutil import calls_in, code_of, dotted_name, only_raises, single_assignment

# Calls whose result a test can only use after reading tensor data on the host.
_VALUE_METHODS = frozenset({"any", "all"})
_VALUE_TORCH = frozenset({"torch.any", "torch.all"})
# Elementwise updates that keep the shape and dtype of the tensor they update.
# (Not masked_fill: computed on both sides, its fill value is checked against the dtype and may raise where
# the branch was never taken.)
_ELEMENTWISE_METHODS = frozenset({"clamp", "clip", "clamp_min", "clamp_max", "nan_to_num", "abs", "neg", "relu",
                                  "tanh", "sigmoid"})
_PURE_CALLS = frozenset({"torch.finfo", "torch.iinfo", "float", "abs", "min", "max"})
_COMMENT = "# graphmode: was `if {test}:`; both sides computed, `torch.where` selects on the device."
_ELSE_COMMENT = "# graphmode: both values computed; `torch.where` picks one on the device."
_LIMIT_COMMENT = "# graphmode: positions on the static path stay below `{limit}(self)`, which settles this test."
# The trace's comparison (tensor on the left) -> the operators that spell it with the tensor on either side.
_TENSOR_LEFT = {"gt": cst.GreaterThan, "ge": cst.GreaterThanEqual}
_TENSOR_RIGHT = {"gt": cst.LessThan, "ge": cst.LessThanEqual}


def _value_calls(node: cst.CSTNode) -> list[cst.Call]:
    return [call for call in calls_in(node) if dotted_name(call.func) in _VALUE_TORCH or (
        isinstance(call.func, cst.Attribute) and call.func.attr.value in _VALUE_METHODS and not call.args)]


def _split_test(test: cst.BaseExpression) -> tuple[cst.BaseExpression | None, cst.BaseExpression] | None:
    """(static part or None, tensor part) for `T`, `not T` and `S and T`; None for anything else."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        left, right = test.left, test.right
        if not _value_calls(left) and _value_calls(right):
            tensor = _tensor_condition(right)
            return (left, tensor) if tensor is not None else None
        return None
    tensor = _tensor_condition(test)
    return (None, tensor) if tensor is not None else None


def _tensor_condition(test: cst.BaseExpression) -> cst.BaseExpression | None:
    """The test as a boolean tensor: a value call itself, or `not` of one."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _tensor_condition(test.expression)
        return None if inner is None else cst.parse_expression(f"torch.logical_not({code_of(inner)})")
    if isinstance(test, cst.Call) and test in _value_calls(test):
        return test
    return None


def _updates_itself(name: str, value: cst.BaseExpression, numbers: set[str]) -> bool:
    """`value` is an elementwise op of `name` with numbers, names bound to numbers, or attributes only."""
    def is_number(node: cst.BaseExpression) -> bool:
        if isinstance(node, (cst.Integer, cst.Float)):
            return True
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            return is_number(node.expression)
        return isinstance(node, cst.Name) and node.value in numbers

    def is_self(node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Name) and node.value == name

    if isinstance(value, cst.BinaryOperation):
        return (is_self(value.left) and is_number(value.right)) or (is_number(value.left) and is_self(value.right))
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
        return False
    method = value.func.attr.value
    if method not in _ELEMENTWISE_METHODS:
        return False
    receiver = value.func.value
    args = [a.value for a in value.args]
    if is_self(receiver):  # x.clamp(-limit, limit)
        others = args
    elif dotted_name(receiver) == "torch" and args and is_self(args[0]):  # torch.clamp(x, -limit, limit)
        others = args[1:]
    else:
        return False
    return all(is_number(a) for a in others)


def _pure_number(value: cst.BaseExpression) -> bool:
    """An expression whose calls are only `torch.finfo(...)`-like: no tensor work, no host read."""
    calls: list[cst.Call] = []

    class _Collector(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            calls.append(call)

    value.visit(_Collector())
    return all(dotted_name(c.func) in _PURE_CALLS for c in calls)


class TensorBranches(StepCodemod):
    NAME = "tensor_branches"
    TITLE = "Select on the device instead of branching on tensor values"
    DESCRIPTION = (
        "An `if` whose test reads a tensor value (`.any()`, `.all()`) and whose body updates one tensor with an "
        "elementwise op of itself (`clamp`, `nan_to_num`, arithmetic with numbers) becomes "
        "`x = torch.where(test, updated, x)`: both sides are computed on the device and one is selected, so "
        "Decode no longer waits for the device to choose a path and the graph does not break. Results are "
        "identical; the update now runs every step. An `if`/`else` that binds one name from the same `torch` call "
        "in both arms (LongRoPE's factors) becomes `name = torch.where(test, a, b)`, both values computed. A static "
        "part of the test stays a Python `if`. A test the "
        "trace saw compare how far the positions reach with a number (dynamic NTK rotary scaling) gets the static "
        "path's number of slots tested first: no position reaches it, so the meaning is kept, and with the cache "
        "sized within the bound the test is settled while tracing, without reading the device."
    )
    SKILL = "refactoring-principles"
    FIXES = frozenset({"GM402"})
    IDIOM_IN_ONE_FUNCTION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return not words.isdisjoint(_VALUE_METHODS) or bool(options.position_tests)  # `torch.any(x)` names `any`

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._position_tests = {line: op for file, line, op in self.options.position_tests
                                if file == self.context.filename}
        module = super().transform_module_impl(tree)
        if any(LIMIT in edit.summary for edit in self.edits) and not defined_at_top(module, LIMIT):
            module = insert_after_imports(module, helper_statements(LIMIT))
        return module

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        if not self.in_step_code(original_node):
            return updated_node
        selected = self._select_between(original_node, updated_node)
        if selected is not None:
            return selected
        settled = self._settled_by_limit(original_node, updated_node)
        if settled is not None:
            return settled
        if not _value_calls(original_node.test):
            return updated_node
        if only_raises(original_node):
            return updated_node  # a check that raises runs in eager code only (hoist_item)
        rewritten = self._rewrite(original_node)
        if isinstance(rewritten, str):
            self.record_manual(original_node, f"`if {code_of(original_node.test)}:` decides on a tensor value, but "
                                              f"{rewritten}; select with `torch.where`/`masked_fill` by hand, or "
                                              "decide in the eager caller")
            return updated_node
        self.record_edit(original_node, f"`if {code_of(original_node.test)}:` became a `torch.where` selection")
        return rewritten

    def _select_between(self, original: cst.If, node: cst.If) -> cst.SimpleStatementLine | None:
        """`name = torch.where(test, a, b)` for `if test: name = a` / `else: name = b`, where the test is a tensor
        (a value call, or a comparison the trace saw take a tensor) and `a` and `b` are values of one kind."""
        split = _split_test(node.test)
        if split is not None and split[0] is None:
            condition = split[1]
        elif self._lines(original)[0] in self._position_tests:
            condition = node.test
        else:
            return None
        arms = _else_arms(node)
        if arms is None:
            return None
        (name, chosen), (other, otherwise) = arms
        if name != other or not _one_kind(chosen, otherwise):
            return None
        test = self._one_line(original.test)
        self.record_edit(original, f"`if {test}:` / `else:` became a `torch.where` selection of `{name}`")
        select = cst.parse_statement(f"{name} = torch.where(\n    {code_of(condition).strip()},\n"
                                     f"    {code_of(chosen).strip()},\n    {code_of(otherwise).strip()},\n)\n")
        comment = cst.EmptyLine(indent=True, comment=cst.Comment(_ELSE_COMMENT))
        return select.with_changes(leading_lines=[*node.leading_lines, comment])

    def _settled_by_limit(self, original: cst.If, updated: cst.If) -> cst.If | None:
        """The branch with the static path's limit tested first, where the trace saw its test compare how far the
        positions reach with a Python int in a method (the limit is read from the module)."""
        op = self._position_tests.get(self._lines(original)[0])
        test = original.test
        if op is None or not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
            return None
        target = test.comparisons[0]
        if isinstance(target.operator, _TENSOR_LEFT[op]):
            bound = target.comparator
        elif isinstance(target.operator, _TENSOR_RIGHT[op]):
            bound = test.left
        else:
            return None
        module = self._module_parameter(original)
        if module is None:
            return None
        limit = cst.Comparison(cst.parse_expression(f"{LIMIT}({module})"),
                               [cst.ComparisonTarget(_TENSOR_LEFT[op](), bound.deep_clone())])
        self.record_edit(original, f"`if {self._one_line(test)}:` tests `{LIMIT}({module})` first, which settles it "
                                   "without reading the device")
        comment = cst.EmptyLine(indent=True, comment=cst.Comment(_LIMIT_COMMENT.format(limit=LIMIT)))
        return updated.with_changes(test=cst.BooleanOperation(limit, cst.And(), updated.test),
                                    leading_lines=[*updated.leading_lines, comment])

    def _one_line(self, test: cst.BaseExpression) -> str:
        """The original test as it reads, for a comment: a test written over several lines (its own comments inside)
        is put on one, as Python's AST prints it (the chain's parse of it); a comment cannot hold a line break."""
        code = code_of(test).strip()
        return code if "\n" not in code else ast.unparse(self.ast_of(test))

    def _module_parameter(self, node: cst.CSTNode) -> str | None:
        """The name of the enclosing method's module (`self`), or None outside a method."""
        current = self.get_metadata(ParentNodeProvider, node, None)
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.get_metadata(ParentNodeProvider, current, None)
        if current is None or not current.params.params:
            return None
        static = any(dotted_name(d.decorator) in ("staticmethod", "classmethod") for d in current.decorators)
        owner = self.get_metadata(ParentNodeProvider, current, None)
        owner = self.get_metadata(ParentNodeProvider, owner, None) if isinstance(owner, cst.IndentedBlock) else owner
        return None if static or not isinstance(owner, cst.ClassDef) else current.params.params[0].name.value

    def _rewrite(self, node: cst.If) -> cst.BaseStatement | cst.FlattenSentinel | str:
        """The selection, or why the branch cannot become one."""
        split = _split_test(node.test)
        if split is None:
            return "its test mixes the tensor value with other conditions in a form not recognised"
        if node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
            return "it has an else branch"
        static, tensor = split
        *helpers, last = node.body.body
        numbers: set[str] = set()
        for helper in helpers:
            assigned = single_assignment(helper)
            if assigned is None or not _pure_number(assigned[1]) or _value_calls(assigned[1]):
                return f"its body does more than compute numbers before one update (`{_statement_text(helper)}`)"
            numbers.add(assigned[0])
        assigned = single_assignment(last)
        if assigned is None or not _updates_itself(assigned[0], assigned[1], numbers):
            return (f"`{_statement_text(last)}` is not an elementwise update of a tensor by itself and numbers, "
                    "so the two sides may differ in shape, dtype or kind")
        name, value = assigned
        select = cst.parse_statement(f"{name} = torch.where({code_of(tensor)}, {code_of(value)}, {name})\n")
        comment = cst.EmptyLine(indent=True, comment=cst.Comment(_COMMENT.format(test=self._one_line(node.test))))
        body = [h.with_changes(leading_lines=[]) for h in helpers] + [select]
        if static is not None:
            return node.with_changes(test=static, body=node.body.with_changes(body=body),
                                     leading_lines=[*node.leading_lines, comment])
        body[0] = body[0].with_changes(leading_lines=[*node.leading_lines, comment])
        return cst.FlattenSentinel(body)


def _else_arms(node: cst.If) -> tuple[tuple[str, cst.BaseExpression], tuple[str, cst.BaseExpression]] | None:
    """The (name, value) each arm of `if ...: name = a` / `else: name = b` binds; None for any other shape."""
    if not isinstance(node.orelse, cst.Else):
        return None
    arms = []
    for block in (node.body, node.orelse.body):
        if not isinstance(block, cst.IndentedBlock) or len(block.body) != 1:
            return None
        assigned = single_assignment(block.body[0])
        if assigned is None or _value_calls(assigned[1]):
            return None
        arms.append(assigned)
    return arms[0], arms[1]


def _one_kind(first: cst.BaseExpression, second: cst.BaseExpression) -> bool:
    """Two values `torch.where` can select between as the branch did: the same `torch` call with the same keywords
    (dtype, device) and as many positional arguments, or two plain names or attributes."""
    if isinstance(first, (cst.Name, cst.Attribute)) and isinstance(second, (cst.Name, cst.Attribute)):
        return True
    if not (isinstance(first, cst.Call) and isinstance(second, cst.Call)):
        return False
    callee = dotted_name(first.func)
    if callee is None or not callee.startswith("torch.") or callee != dotted_name(second.func):
        return False

    def keywords(call: cst.Call) -> list[tuple[str, str]]:
        return [(a.keyword.value, code_of(a.value).strip()) for a in call.args if a.keyword is not None]

    def positional(call: cst.Call) -> int:
        return sum(1 for a in call.args if a.keyword is None and not a.star)

    return keywords(first) == keywords(second) and positional(first) == positional(second)


def _statement_text(stmt: cst.BaseStatement) -> str:
    """The statement's code without its comments and indentation."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return "; ".join(code_of(small).strip() for small in stmt.body)
    return code_of(stmt).strip().splitlines()[0]
