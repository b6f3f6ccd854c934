"""What the compile-call rules (GM801-GM803) share: finding `torch.compile` and what backend it gets."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_dotted_name, name_of, statements
from graphmode.transforms.analysis.idioms import keyword, string_value
from graphmode.transforms.rules.base import SourceFile

GE = "ge"
NPUGRAPH_EX = "npugraph_ex"


def is_torch_compile(node: ast.AST) -> bool:
    """`torch.compile(...)`."""
    if node.__class__ is not ast.Call:
        return False
    func = node.func
    return func.__class__ is ast.Attribute and func.attr == "compile" and ast_dotted_name(func) == "torch.compile"


def backend_kind(value: ast.expr, file: SourceFile) -> str | None:
    """GE for `...get_npu_backend(...)` or "npu"; NPUGRAPH_EX for "npugraph_ex"; None otherwise."""
    if value.__class__ is ast.Call:
        name = ast_dotted_name(value.func)
        return GE if name is not None and name.split(".")[-1] == "get_npu_backend" else None
    text = string_value(value, file)
    if text == "npu":
        return GE
    if text == "npugraph_ex":
        return NPUGRAPH_EX
    return None


def module_backends(file: SourceFile) -> dict[str, str]:
    """Names assigned a backend anywhere in the file (`npu_backend = tng.get_npu_backend(...)`) -> kind."""
    kinds: dict[str, str] = {}
    for stmt in statements(file.tree.body):
        if stmt.__class__ is ast.Assign:
            kind = backend_kind(stmt.value, file)
            if kind is not None:
                for target in stmt.targets:
                    if target.__class__ is ast.Name:
                        kinds[target.id] = kind
    return kinds


def compile_backend(call: ast.Call, file: SourceFile, names: dict[str, str]) -> str | None:
    """The backend kind a `torch.compile` call asks for (see backend_kind), following a name."""
    arg = keyword(call, "backend")
    if arg is None:
        return None
    name = name_of(arg.value)
    if name is not None:
        return names.get(name)
    return backend_kind(arg.value, file)


class BackendNames:
    """Mixin for rules: `self.backend_names`, the file's names assigned a backend (module_backends),
    found once per file on first use."""

    file: SourceFile

    @property
    def backend_names(self) -> dict[str, str]:
        return self.file.fact("backend_names", lambda tree: module_backends(self.file))
