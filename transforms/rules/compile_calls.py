"""What the compile-call rules (GM801-GM803) share: finding `torch.compile` and what backend it gets."""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import dotted_name
from transforms.rules.idioms import keyword, string_value

GE = "ge"
NPUGRAPH_EX = "npugraph_ex"


def is_torch_compile(node: cst.CSTNode) -> bool:
    """`torch.compile(...)`."""
    return isinstance(node, cst.Call) and dotted_name(node.func) == "torch.compile"


def backend_kind(value: cst.BaseExpression) -> str | None:
    """GE for `...get_npu_backend(...)` or "npu"; NPUGRAPH_EX for "npugraph_ex"; None otherwise."""
    if isinstance(value, cst.Call):
        name = dotted_name(value.func)
        return GE if name is not None and name.split(".")[-1] == "get_npu_backend" else None
    text = string_value(value)
    if text == "npu":
        return GE
    if text == "npugraph_ex":
        return NPUGRAPH_EX
    return None


def module_backends(module: cst.Module) -> dict[str, str]:
    """Names assigned a backend anywhere in the file (`npu_backend = tng.get_npu_backend(...)`) -> kind."""
    kinds: dict[str, str] = {}

    class _Collector(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            kind = backend_kind(node.value)
            if kind is not None:
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        kinds[target.target.value] = kind

    module.visit(_Collector())
    return kinds


def compile_backend(call: cst.Call, names: dict[str, str]) -> str | None:
    """The backend kind a `torch.compile` call asks for (see backend_kind), following a name."""
    arg = keyword(call, "backend")
    if arg is None:
        return None
    if isinstance(arg.value, cst.Name):
        return names.get(arg.value.value)
    return backend_kind(arg.value)


class BackendNames:
    """Mixin for rules: fills `self.backend_names` from the module before the rule's visits."""

    backend_names: dict[str, str]

    def visit_Module(self, node: cst.Module) -> None:
        self.backend_names = module_backends(node)
