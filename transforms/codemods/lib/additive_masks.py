"""An additive `-inf` causal mask turned boolean, when every use of it in the file is seen.

Hand-written graph-mode code (gpt-fast) keeps a `tril` buffer of booleans, True where a column is visible, and
fills the hidden scores: each `scores + mask` becomes `scores.masked_fill(~mask, float("-inf"))`. Adding 0 or
-inf and filling with -inf give the same scores, bit for bit. The uses are followed by name: through the
functions of the file that take a parameter of that name, where the mask may only be added, tested against
None, or passed on to a call defined in the file (or to `scaled_dot_product_attention`, whose boolean masks
mean the same). Any other use, a mask that leaves the file (returned, stored), a parameter of another `*mask*`
name, or a finite fill (`finfo.min`) keeps the additive float mask.
"""
from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.codemods.lib.mask_recognition import MaskBuild, find_mask, mask_reader, shape_dependent_use
from graphmode.transforms.cstutil import code_of, find_method, names_in, position_param
from graphmode.transforms.dispatch import Transformer

_NEGATIVE_INFINITY = frozenset({'float("-inf")', '-float("inf")', "-math.inf", "-torch.inf", "-float(math.inf)"})
_SDPA = frozenset({"scaled_dot_product_attention"})
_FILLED = "# graphmode: the mask is boolean now (True: visible); filled with -inf, the scores are unchanged."


def _is_negative_infinity(fill: cst.BaseExpression | None) -> bool:
    return fill is not None and code_of(fill).replace("'", '"').replace(" ", "").lower() in _NEGATIVE_INFINITY


def boolean_diagonal(diagonal: cst.BaseExpression | str) -> str:
    """`triu(d)` hides the columns from d on; the visible ones are `tril(d - 1)` (written bare when 0)."""
    text = diagonal if isinstance(diagonal, str) else code_of(diagonal)
    try:
        value = int(text) - 1
    except ValueError:
        return f"({text}) - 1"
    return "" if value == 0 else str(value)


@dataclass
class BooleanPlan:
    """The method that builds the mask, its name, and each use rewritten: expressions (`a + mask`) by
    their original node, statements (`a += mask`, or any holding a rewritten expression) as a function of
    the updated statement."""

    method: cst.FunctionDef
    name: str
    expressions: dict[cst.CSTNode, cst.BaseExpression] = field(default_factory=dict)
    statements: dict[cst.CSTNode, Callable[[cst.SimpleStatementLine], cst.SimpleStatementLine]] = \
        field(default_factory=dict)


class ApplyPlan(Transformer):
    """The plan's rewrites, applied to original statements outside the main traversal."""

    def __init__(self, plan: BooleanPlan) -> None:
        self.plan = plan

    def leave_BinaryOperation(self, original_node, updated_node):
        return self.plan.expressions.get(original_node, updated_node)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        rewrite = self.plan.statements.get(original_node)
        return rewrite(updated_node) if rewrite else updated_node


def _filled(other: cst.BaseExpression, name: str, fill: str) -> cst.BaseExpression:
    """`other.masked_fill(~name, fill)`, `other` in parentheses unless it is a primary expression."""
    primary = isinstance(other, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or other.lpar
    text = code_of(other) if primary else f"({code_of(other)})"
    return cst.parse_expression(f"{text}.masked_fill(~{name}, {fill})")


def _with_comment(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    return statement.with_changes(leading_lines=[
        *statement.leading_lines, cst.EmptyLine(indent=True, comment=cst.Comment(_FILLED))])


def plan_boolean(module: cst.Module, functions: dict[str, cst.FunctionDef]) -> BooleanPlan | None:
    """The one additive -inf mask of the file that can become boolean, with the rewrite of every use;
    None when there is none, more than one, or a use that is not understood. `functions` are the file's
    top-level functions (`mask_reader`)."""
    found = []
    for cls in (s for s in module.body if isinstance(s, cst.ClassDef)):
        for method in cls.body.body:
            if isinstance(method, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock):
                body = list(method.body.body)
                build = find_mask(body, mask_reader(cls, method, functions))
                if isinstance(build, MaskBuild):
                    found.append((cls, method, body, build))
    if len(found) != 1:
        return None
    cls, method, body, build = found[0]
    if (build.kind != "full" or build.cast or not _is_negative_infinity(build.fill)
            or position_param(method) is None or find_method(cls, "__init__") is None
            or shape_dependent_use(build.name, body[build.last + 1 :]) is not None):
        return None
    return _plan_uses(module, method, body[build.last + 1 :], build.name, code_of(build.fill))


def _plan_uses(module: cst.Module, method: cst.FunctionDef, after: list[cst.BaseStatement], name: str,
               fill: str) -> BooleanPlan | None:
    """Every use of the mask `name` in the file, rewritten for a boolean mask; None when one is not understood."""
    plan = BooleanPlan(method, name)
    top_level = _top_level_names(module)
    functions: list[cst.FunctionDef] = []

    class _Functions(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            functions.append(node)

    module.visit(_Functions())
    carriers = []
    for func in functions:
        params = [p.name.value for p in (*func.params.params, *func.params.kwonly_params, *func.params.posonly_params)]
        if any("mask" in p.lower() and p != name for p in params):
            return None  # a mask under another name: where this one goes cannot be followed by name
        if name in params and func is not method:
            carriers.append(func.body)
    checker = _UseChecker(plan, name, fill, top_level)
    for node in [*after, *carriers]:
        node.visit(checker)
        if checker.unknown:
            return None
    return plan if plan.expressions or any(s for s in checker.augmented) else None


def _top_level_names(module: cst.Module) -> tuple[set[str], set[str]]:
    """(functions and classes defined in the file, every other top-level name: imports, assignments)."""
    defined, other = set(), set(dir(builtins))
    for stmt in module.body:
        if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
            defined.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    if isinstance(small.names, cst.ImportStar):
                        other.add("*")
                        continue
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname else alias.name
                        other.add(code_of(bound).split(".")[0])
                else:
                    other |= names_in(small)
        else:
            other |= names_in(stmt)
    return defined, other - defined


class _UseChecker(cst.CSTVisitor):
    """Walks code after the mask is built, and the bodies of functions that receive it, accepting only
    `x + mask` / `mask + x`, `x += mask`, `mask is [not] None`, and passing it on to a call defined here
    (or to scaled_dot_product_attention); records the rewrite of the first two in the plan."""

    def __init__(self, plan: BooleanPlan, name: str, fill: str, top_level: tuple[set[str], set[str]]) -> None:
        self.plan, self.name, self.fill = plan, name, fill
        self.defined, self.outside = top_level
        self.unknown = False
        self.accepted: set[int] = set()  # ids of Name nodes whose use is understood
        self.augmented: list[cst.CSTNode] = []
        self._statements: list[cst.SimpleStatementLine] = []

    def _is_mask(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Name) and node.value == self.name

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statements.append(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statements.pop()

    def _rewrites_statement(self) -> None:
        if self._statements:
            self.plan.statements.setdefault(self._statements[-1], _with_comment)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if not isinstance(node.operator, cst.Add):
            return
        for side, other in ((node.right, node.left), (node.left, node.right)):
            if self._is_mask(side) and self.name not in names_in(other) and self._statements:
                self.accepted.add(id(side))
                filled = _filled(other, self.name, self.fill)
                self.plan.expressions[node] = filled.with_changes(lpar=node.lpar, rpar=node.rpar)
                self._rewrites_statement()
                return

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if (isinstance(node.operator, cst.AddAssign) and self._is_mask(node.value)
                and isinstance(node.target, cst.Name) and node.target.value != self.name
                and self._statements and len(self._statements[-1].body) == 1):
            self.accepted.add(id(node.value))
            target, filled = node.target.value, _filled(node.target, self.name, self.fill)

            def rewrite(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
                assign = cst.Assign([cst.AssignTarget(cst.Name(target))], filled)
                return _with_comment(statement.with_changes(body=[assign]))

            self.plan.statements[self._statements[-1]] = rewrite
            self.augmented.append(node)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if (self._is_mask(node.left) and len(node.comparisons) == 1
                and isinstance(node.comparisons[0].operator, (cst.Is, cst.IsNot))
                and isinstance(node.comparisons[0].comparator, cst.Name)
                and node.comparisons[0].comparator.value == "None"):
            self.accepted.add(id(node.left))

    def visit_Call(self, node: cst.Call) -> None:
        func, root = node.func, node.func
        while isinstance(root, (cst.Attribute, cst.Subscript, cst.Call)):
            root = root.func if isinstance(root, cst.Call) else root.value
        sdpa = (func.attr.value if isinstance(func, cst.Attribute) else
                func.value if isinstance(func, cst.Name) else None) in _SDPA
        # Code of this file: a method (`self.attention(...)`), a module held in a local (`layer(...)`), or a
        # function defined here; never something imported or built in, whose idea of a mask is unknown.
        here = isinstance(root, cst.Name) and "*" not in self.outside and (
            root.value == "self" or root.value in self.defined or root.value not in self.outside)
        for position, arg in enumerate(node.args):
            if not self._is_mask(arg.value) or arg.star:
                continue
            to_sdpa = sdpa and (arg.keyword.value == "attn_mask" if arg.keyword is not None else position == 3)
            if to_sdpa or (here and not sdpa):
                self.accepted.add(id(arg.value))

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name and id(node) not in self.accepted:
            self.unknown = True

    def visit_Param(self, node: cst.Param) -> bool:
        return False  # a parameter's own name is not a use

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # `x.mask` is not the mask: only the object is looked at
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # `f(mask=...)`: the keyword is not a use
        return False
