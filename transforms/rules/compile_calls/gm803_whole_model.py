"""GM803: the whole model compiled, rather than its Decode entry."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import (FUNCTION_TYPES, arg_value, ast_dotted_name, first_arg, is_positional,
                                                   is_starred)
from graphmode.transforms.analysis.astutil import name_of, statements
from graphmode.transforms.analysis.idioms import has_positional, keyword
from graphmode.transforms.rules.base import Rule
from graphmode.transforms.rules.compile_calls.calls import is_torch_compile

_ENTRY_HINTS = ("decode", "step")


def _function_names(module: ast.Module) -> set[str]:
    return {s.name for s in statements(module.body) if isinstance(s, FUNCTION_TYPES)}


def _whole_model(target: ast.expr, functions: set[str]) -> bool:
    """A model object (`model`, `self.model`) or its `forward`, not a Decode function."""
    name = name_of(target)
    if name is not None:
        return not any(h in name.lower() for h in _ENTRY_HINTS) and (name not in functions or name == "forward")
    if target.__class__ is ast.Attribute:
        attr = target.attr
        return attr == "forward" or attr == "model" or attr.endswith("_model")
    return False


def _is_compile_decorator(decorator: ast.expr) -> bool:
    target = decorator.func if decorator.__class__ is ast.Call else decorator
    return ast_dotted_name(target) == "torch.compile"


class WholeModelCompiled(Rule):
    CODE = "GM803"
    MESSAGE = (
        "`{name}` compiles the whole model, so Prefill and its prompt lengths share the compiled function; "
        "compile only the Decode entry (`torch.compile(model.decode, ...)`) and run Prefill eagerly"
    )
    SKILL = "compile-calls"
    VALID = (
        # Only the Decode entry is compiled.
        """
        import torch


        def build(model):
            return torch.compile(model.decode, backend="npugraph_ex", fullgraph=True)
        """,
        # A function of the file whose name says it is the step.
        """
        import torch


        def decode_one_token(model, token, input_pos):
            return model(token, input_pos)


        decode = torch.compile(decode_one_token, fullgraph=True)
        """,
        # `re.compile(pattern)` takes a positional argument: not a model's compile.
        """
        import re

        WORD = re.compile(r"\\w+")
        """,
    )
    INVALID = (
        """
        import torch


        def build(model):
            return torch.compile(model, backend="npugraph_ex", fullgraph=True)
        """,
        # nn.Module.compile() compiles the module's whole forward in place.
        """
        import torch


        def build(model):
            model.compile(backend="npugraph_ex", fullgraph=True)
            return model
        """,
        """
        import torch


        class Model(torch.nn.Module):
            @torch.compile(fullgraph=True)
            def forward(self, x):
                return self.layers(x)
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if func.__class__ is not ast.Attribute or func.attr != "compile":
            return
        if is_torch_compile(node):
            self._check_torch_compile(node)
        elif (
            ast_dotted_name(func.value) != "torch"
            and not any(h in self.file.code_of(func.value, node).lower() for h in _ENTRY_HINTS)
            and not has_positional(node)
        ):
            self.report(node, self.MESSAGE.format(name=f"{self.file.code_of(func, node)}()"))

    def _check_torch_compile(self, node: ast.Call) -> None:
        """`torch.compile(model)`: reported when what it compiles is the whole model."""
        model = _compiled(node)
        if model is None:
            return
        functions = self.file.fact("function_names", _function_names)
        if _whole_model(arg_value(model), functions):
            self.report(node, self.MESSAGE.format(name=f"torch.compile({self.file.code_of(arg_value(model), node)})"))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name != "forward":
            return
        for decorator in node.decorator_list:
            if _is_compile_decorator(decorator):
                self.report(self.file.decorator_start(decorator), self.MESSAGE.format(name="@torch.compile"))


def _compiled(call: ast.Call) -> ast.expr | ast.keyword | None:
    """What a torch.compile call compiles: its `model=` keyword, else its first positional argument (not `*args`)."""
    model = keyword(call, "model")
    if model is not None:
        return model
    first = first_arg(call)
    if first is not None and is_positional(first) and not is_starred(first):
        return first
    return None
