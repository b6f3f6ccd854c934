"""GM803: the whole model compiled, rather than its Decode entry."""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import code_of, dotted_name
from transforms.rules.base import Rule
from transforms.rules.compile_calls import is_torch_compile
from transforms.rules.idioms import keyword

_ENTRY_HINTS = ("decode", "step")


def _function_names(module: cst.Module) -> set[str]:
    found: set[str] = set()

    class _Collector(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            found.add(node.name.value)

    module.visit(_Collector())
    return found


def _whole_model(target: cst.BaseExpression, functions: set[str]) -> bool:
    """A model object (`model`, `self.model`) or its `forward`, not a Decode function."""
    if isinstance(target, cst.Name):
        name = target.value
        return not any(h in name.lower() for h in _ENTRY_HINTS) and (name not in functions or name == "forward")
    if isinstance(target, cst.Attribute):
        attr = target.attr.value
        return attr == "forward" or attr == "model" or attr.endswith("_model")
    return False


def _is_compile_decorator(decorator: cst.Decorator) -> bool:
    target = decorator.decorator
    if isinstance(target, cst.Call):
        target = target.func
    return dotted_name(target) == "torch.compile"


class WholeModelCompiled(Rule):
    CODE = "GM803"
    MESSAGE = (
        "`{name}` compiles the whole model, so Prefill and its prompt lengths share the compiled function; "
        "compile only the Decode entry (`torch.compile(model.decode, ...)`) and run Prefill eagerly"
    )
    SKILL = "compile-calls"

    def visit_Module(self, node: cst.Module) -> None:
        self._functions = _function_names(node)

    def visit_Call(self, node: cst.Call) -> None:
        if is_torch_compile(node):
            model = keyword(node, "model")
            if model is None and node.args and node.args[0].keyword is None and not node.args[0].star:
                model = node.args[0]
            if model is not None and _whole_model(model.value, self._functions):
                self.report(node, self.MESSAGE.format(name=f"torch.compile({code_of(model.value)})"))
        elif (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "compile"
            and dotted_name(node.func.value) != "torch"
            and not any(h in code_of(node.func.value).lower() for h in _ENTRY_HINTS)
            and not any(a.keyword is None for a in node.args)
        ):
            self.report(node, self.MESSAGE.format(name=f"{code_of(node.func)}()"))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value != "forward":
            return
        for decorator in node.decorators:
            if _is_compile_decorator(decorator):
                self.report(decorator, self.MESSAGE.format(name="@torch.compile"))
