"""Merges the linears one input goes through (q/k/v, gate/up) into one matmul.

Recognises, in a step method of a class whose `__init__` makes `self.a = nn.Linear(n, ...)`,
`self.b = nn.Linear(n, ...)` (same input size, same bias argument), calls `self.a(x)` and `self.b(x)` of the same
name `x` in statements of one block, with `x` not assigned between them. Before the first of them it writes

    a_out, b_out = graphmode_merged_linear(self, ("a", "b"), x)

and each call becomes its output (`a, b = self.a(x), self.b(x)` becomes the merged call itself).
`graphmode_merged_linear` (helper code) stacks the weights once in eager code and makes the linears' own weights
views of the stack, so the state dict, checkpoint loading and every other caller see the parameters they always had,
in the same memory. Off the static path it calls each linear as written, so the merged call is the original
computation there, and the adapted file holds it once, in the code both paths share (`shared_merges`).

Under the NPU backends, `F.silu(self.gate(x)) * self.up(x)` (either order of the product) becomes
`torch_npu.npu_swiglu(graphmode_merged_linear(self, ("gate", "up"), x, split=False), dim=-1)`: the activation and
the product in the kernel that reads the merged output, whose first half is the gate.

Accumulation order: one matmul over the stacked weight computes each output's dot products as the separate ones
did; only the kernel's blocking may differ, and with it float rounding.
"""
from __future__ import annotations

from collections.abc import Callable

import libcst as cst
import libcst.matchers as m

from graphmode.transforms.analysis.reach import SWITCH_TEST
from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.codemods.lib.fusion import NPU, assigned_names, replaced, wants_torch_npu
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.module import defined_at_top, insert_after_imports
from graphmode.transforms.cstutil import code_of, dotted_name, find_method, nodes_of_type, \
    qualified_functions, self_attribute_name, statements_only, string_tuple, walk, with_blocks
from graphmode.transforms.dispatch import Transformer

HELPER = "graphmode_merged_linear"
STACKER = "graphmode_stack_weights"
_LINEAR = frozenset({"nn.Linear", "torch.nn.Linear", "Linear"})
_SILU = frozenset({"F.silu", "torch.nn.functional.silu", "nn.functional.silu", "torch.silu", "functional.silu"})


def _linears(cls: cst.ClassDef) -> dict[str, tuple[str, str]]:
    """`self.a = nn.Linear(n, m, bias=...)` in `__init__` -> {"a": (code of n, code of the bias argument)}."""
    init = find_method(cls, "__init__")
    if init is None:
        return {}
    found: dict[str, tuple[str, str]] = {}
    assigned: dict[str, int] = {}
    for node in nodes_of_type(init, cst.Assign):
        for target in node.targets:
            name = self_attribute_name(target.target)
            if name is None:
                continue
            assigned[name] = assigned.get(name, 0) + 1
            value = node.value
            if isinstance(value, cst.Call) and dotted_name(value.func) in _LINEAR and value.args \
                    and value.args[0].keyword is None:
                bias = next((code_of(a.value).strip() for a in value.args if a.keyword and a.keyword.value == "bias"),
                            "True")
                found[name] = (code_of(value.args[0].value).strip(), bias)
    return {name: sizes for name, sizes in found.items() if assigned[name] == 1}


class MergedProjections(StepCodemod):
    NAME = "merged_projections"
    TITLE = "Merge the linears one input goes through (q/k/v, gate/up) into one matmul"
    DESCRIPTION = (
        "On the static path, `self.q(x)`, `self.k(x)`, `self.v(x)` (and a gate and up projection) become one "
        "`F.linear` over their stacked weights, split after (`graphmode_merged_linear`): the input is read once and "
        "one kernel replaces several. The linears' weights become views of the stack, built once in eager code, so "
        "the state dict, checkpoint loading and the original path are unchanged and no memory is added. Under "
        "npugraph_ex and GE, `silu(gate) * up` then becomes `torch_npu.npu_swiglu` on the merged output."
    )
    SKILL = "fusion"
    FIXES = frozenset()
    FUSION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return "Linear" in words

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef):
        linears = _linears(original_node)
        if len(linears) < 2:
            return updated_node
        methods = {stmt: self._merged(stmt, linears) for stmt in original_node.body.body
                   if isinstance(stmt, cst.FunctionDef) and stmt.name.value != "__init__"
                   and self.in_step_code(stmt)}
        if not any(new is not None for new in methods.values()):
            return updated_node
        body = [methods.get(stmt) or updated for stmt, updated in zip(original_node.body.body, updated_node.body.body)]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not any(edit.codemod == self.NAME for edit in self.edits):
            return updated_node
        module = updated_node
        # graphmode_merged_linear asks the switch itself: off the static path it calls each linear as written.
        for name in (SWITCH_TEST, STACKER, HELPER):
            if not defined_at_top(module, name):
                module = insert_after_imports(module, helper_statements(name))
        return module

    def _merged(self, method: cst.FunctionDef, linears: dict[str, tuple[str, str]]) -> cst.FunctionDef | None:
        """The method with the projections of one input merged in each block that has them (the body, or a
        branch: `if config.pretraining_tp > 1: ... else: <the projections>`)."""
        new_blocks: dict[cst.IndentedBlock, cst.IndentedBlock] = {}
        for block in (node for node in walk(method, statements_only) if type(node) is cst.IndentedBlock):
            body = list(block.body)
            groups = _groups(body, linears)
            if groups:
                # One merge per block: the projections of one input.
                x, names, first = max(groups, key=lambda group: len(group[1]))
                new_blocks[block] = block.with_changes(body=self._rewrite(body, x, names, first))
        # Only the nodes on the way to a merged block are built again (a visit would build every one).
        return with_blocks(method, new_blocks) if new_blocks else None

    def _rewrite(self, body: list[cst.BaseStatement], x: str, names: tuple[str, ...], first: int):
        calls = {(name, x) for name in names}
        swiglu = self._swiglu(body, x, names) if self.options.fused_ops == NPU and len(names) == 2 else None
        if swiglu is not None:
            index, product, (gate, up) = swiglu
            wants_torch_npu(self.context)
            self.record_edit(body[index], f"`{gate}` and `{up}` in one matmul, SiLU and product in one kernel")
            fused = cst.parse_expression(
                f'torch_npu.npu_swiglu({HELPER}(self, ("{gate}", "{up}"), {x}, split=False), dim=-1)')
            rewritten = replaced(body[index], {product: fused})
            return [*body[:index], _commented(rewritten, "gate and up in one matmul, SiLU(gate) * up in one kernel"),
                    *body[index + 1:]]
        merged = merged_body(body, x, names, first)
        for stmt in body:
            if _calls(stmt, calls):
                self.record_edit(stmt, "outputs of the merged matmul")
        return merged

    def _swiglu(self, body, x: str, names: tuple[str, ...]):
        """The statement holding `F.silu(self.g(x)) * self.u(x)` (all the group's calls), the product, (g, u)."""
        for index, stmt in enumerate(body):
            for node in nodes_of_type(stmt, cst.BinaryOperation):
                if not isinstance(node.operator, cst.Multiply):
                    continue
                for act, other in ((node.left, node.right), (node.right, node.left)):
                    if not (isinstance(act, cst.Call) and dotted_name(act.func) in _SILU and len(act.args) == 1):
                        continue
                    gate, up = _call_of(act.args[0].value, x), _call_of(other, x)
                    if gate in names and up in names and gate != up and \
                            len(_calls_anywhere(body, {(n, x) for n in names})) == 2:
                        return index, node, (gate, up)
        return None


def merged_body(body: list[cst.BaseStatement], x: str, names: tuple[str, ...], first: int) -> list[cst.BaseStatement]:
    """The block with the calls `self.n(x)` of `names` replaced by the outputs of one `graphmode_merged_linear`
    call, written before statement `first` (the first that calls one). Where that statement is
    `a, b = self.a(x), self.b(x)`, all of the calls in order, the merged call takes its place: its outputs are the
    names it assigns."""
    def merged_call(targets: str, leading_lines) -> cst.BaseStatement:
        call = cst.parse_statement(f"{targets} = {HELPER}(self, {string_tuple(list(names))}, {x})\n")
        return _commented(call.with_changes(leading_lines=leading_lines),
                          "on the static path, one matmul over the stacked weights")

    calls = {(name, x) for name in names}
    targets = _tuple_of_calls(body[first], x, names)
    if targets is not None:
        return [*body[:first], merged_call(targets, body[first].leading_lines), *body[first + 1:]]
    outputs = {name: f"{name}_out" for name in names}
    new_body = []
    for index, stmt in enumerate(body):
        if index == first:
            new_body.append(merged_call(", ".join(outputs[name] for name in names), stmt.leading_lines))
            stmt = stmt.with_changes(leading_lines=[])
        swaps = {call: cst.Name(outputs[name]) for call, name in _calls(stmt, calls)}
        new_body.append(replaced(stmt, swaps) if swaps else stmt)
    return new_body


def _tuple_of_calls(stmt: cst.BaseStatement, x: str, names: tuple[str, ...]) -> str | None:
    """The code of the targets of `a, b = self.a(x), self.b(x)` (the calls of `names`, in order, and nothing else
    in the statement), else None."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Tuple) \
            or not isinstance(assign.value, cst.Tuple):
        return None
    targets, values = assign.targets[0].target.elements, assign.value.elements
    if len(targets) != len(names) or any(isinstance(e, cst.StarredElement) for e in [*targets, *values]):
        return None
    if tuple(_call_of(e.value, x) for e in values) != names:
        return None
    return ", ".join(code_of(e.value).strip() for e in targets)


def _call_of(node: cst.BaseExpression, x: str) -> str | None:
    """`self.a(x)` -> "a"."""
    if isinstance(node, cst.Call) and len(node.args) == 1 and node.args[0].keyword is None \
            and m.matches(node.args[0].value, m.Name(x)):
        return self_attribute_name(node.func)
    return None


def _calls(stmt: cst.CSTNode, wanted: set[tuple[str, str]]) -> list[tuple[cst.Call, str]]:
    found = []
    for call in nodes_of_type(stmt, cst.Call):
        if len(call.args) == 1 and isinstance(call.args[0].value, cst.Name):
            name = self_attribute_name(call.func)
            if (name, call.args[0].value.value) in wanted:
                found.append((call, name))
    return found


def _calls_anywhere(body, wanted) -> list:
    return [found for stmt in body for found in _calls(stmt, wanted)]


def _groups(body: list[cst.BaseStatement], linears: dict[str, tuple[str, str]]) -> list[tuple[str, tuple, int]]:
    """(x, the linears' names in call order, index of the first statement) for each input that goes through two
    or more linears of the same input size and bias, each called once, in simple statements of this block, with x
    not assigned in between (a call after an assignment reads another tensor)."""
    # Calls by the input they read: a name and how many times it had been assigned in this block before the call,
    # so that `x = self.norm(x)` between two calls separates them.
    seen: dict[tuple[str, int], list[tuple[str, int]]] = {}
    versions: dict[str, int] = {}
    for index, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine):
            for call in nodes_of_type(stmt, cst.Call):
                name = self_attribute_name(call.func)
                if name in linears and len(call.args) == 1 and call.args[0].keyword is None \
                        and isinstance(call.args[0].value, cst.Name):
                    x = call.args[0].value.value
                    seen.setdefault((x, versions.get(x, 0)), []).append((name, index))
        for assigned in assigned_names(stmt):
            versions[assigned] = versions.get(assigned, 0) + 1
    groups = []
    for (x, _), uses in seen.items():
        names = [name for name, _ in uses]
        if len(set(names)) != len(names):
            continue  # a linear called twice on it: not one projection of one input
        by_kind: dict[tuple[str, str], list[str]] = {}
        for name in names:
            by_kind.setdefault(linears[name], []).append(name)
        kind = max(by_kind.values(), key=len)
        if len(kind) < 2:
            continue
        groups.append((x, tuple(kind), min(index for name, index in uses if name in kind)))
    return groups


def _commented(stmt: cst.BaseStatement, why: str) -> cst.BaseStatement:
    comment = cst.EmptyLine(indent=True, comment=cst.Comment(f"# graphmode: {why} (fused)."))
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, comment])


def shared_merges(original: cst.Module, adapted: cst.Module,
                  method_text: Callable[[cst.CSTNode], str | None] | None = None) -> cst.Module:
    """`original` with, in each function, the merges the chain wrote in its adapted form: off the static path
    `graphmode_merged_linear` calls each linear as written, so the merged call is the model's own computation on
    both paths, and the code both share holds it once instead of a fork around the projections
    (transforms/output/static_path.py). A merge goes where the same projections of the same input are; the NPU form
    (`split=False` under a fused activation) is a static path's alone and stays there. `method_text`: the code of a
    method of `adapted` as the chain already generated it (ParsedSource.method_text), or None; a method whose code
    does not name the helper holds no merge, and its calls are not walked."""
    # A function the chain handed on as it was parsed (the same node) holds no merge: only the others are read, and
    # of those only the ones the original has (a merge goes into the original's function of that name): the
    # functions the chain added, its helpers and entries, are some 30 on a llama file.
    own = {qualname: id(function) for qualname, function in qualified_functions(original)}
    untouched = set(own.values())
    written = {qualname: merges for qualname, function in qualified_functions(adapted)
               if qualname in own and id(function) not in untouched and _may_hold_merge(function, method_text)
               and (merges := _merged_calls(function))}
    if not written:
        return original

    class _Merge(Transformer):
        def __init__(self) -> None:
            self.scope: list[str] = []

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            self.scope.append(node.name.value)

        def leave_ClassDef(self, original_node, updated_node):
            self.scope.pop()
            return updated_node

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            return False  # holds no function: left as it is, not built again

        def leave_FunctionDef(self, original_node, updated_node):
            merges = written.get(".".join([*self.scope, original_node.name.value]))
            if not merges:
                return updated_node
            new_blocks: dict[cst.IndentedBlock, cst.IndentedBlock] = {}
            for block in (n for n in walk(original_node, statements_only) if type(n) is cst.IndentedBlock):
                body = list(block.body)
                for x, names in merges:
                    first = next((index for group_x, group, index in _groups(body, dict.fromkeys(names, ("", "")))
                                  if (group_x, group) == (x, names)), None)
                    if first is not None:
                        new_blocks[block] = block.with_changes(body=merged_body(body, x, names, first))
                        break
            # Only the nodes on the way to a merged block are built again (a visit would build every one).
            return with_blocks(original_node, new_blocks) if new_blocks else updated_node

    return original.visit(_Merge())


def _may_hold_merge(function: cst.FunctionDef, method_text: Callable[[cst.CSTNode], str | None] | None) -> bool:
    text = method_text(function) if method_text is not None else None
    return text is None or HELPER in text


def _merged_calls(function: cst.FunctionDef) -> list[tuple[str, tuple[str, ...]]]:
    """(input, names) of each `graphmode_merged_linear(self, ("a", "b"), x)` with split outputs in the function."""
    found = []
    for call in nodes_of_type(function, cst.Call):
        if not (isinstance(call.func, cst.Name) and call.func.value == HELPER and len(call.args) == 3
                and all(a.keyword is None for a in call.args) and isinstance(call.args[1].value, cst.Tuple)
                and isinstance(call.args[2].value, cst.Name)):
            continue
        names = tuple(e.value.evaluated_value for e in call.args[1].value.elements
                      if isinstance(e.value, cst.SimpleString))
        if len(names) == len(call.args[1].value.elements):
            found.append((call.args[2].value.value, names))
    return found
