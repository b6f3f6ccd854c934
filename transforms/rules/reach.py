"""Which functions of a file run in a model step: the ones rules may report in.

The roots are the step methods of module classes (`forward`, `decode`, ...); from there the
functions they call, as `self.method(...)` or as a function of the same file, are followed.
A training loop or a data loader that no step calls is not reached, so it is not reported.
"""
from __future__ import annotations

import libcst as cst

STEP_METHODS = frozenset({"forward", "decode", "prefill", "decode_one_token", "prefill_forward", "_forward"})


def reachable_functions(module: cst.Module) -> set[cst.FunctionDef]:
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    classes = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)}
    methods = {name: _methods(cls) for name, cls in classes.items()}

    pending: list[tuple[cst.FunctionDef, str | None]] = [
        (method, name) for name, found in methods.items() for method_name, method in found.items()
        if method_name in STEP_METHODS
    ] + [(function, None) for name, function in functions.items() if name in STEP_METHODS]
    reached: set[cst.FunctionDef] = set()
    while pending:
        function, owner = pending.pop()
        if function in reached:
            continue
        reached.add(function)
        calls = _Calls()
        function.visit(calls)
        for name in calls.on_self:
            method = _lookup(owner, name, classes, methods)
            if method is not None:
                pending.append((method, owner))
        for name in calls.plain:
            if name in functions:
                pending.append((functions[name], None))
    return reached


def _methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}


def _lookup(owner: str | None, name: str, classes: dict[str, cst.ClassDef],
            methods: dict[str, dict[str, cst.FunctionDef]]) -> cst.FunctionDef | None:
    """`self.name` on class `owner`, looking through its bases that are defined in the same file."""
    seen: set[str] = set()
    while owner is not None and owner in classes and owner not in seen:
        seen.add(owner)
        if name in methods[owner]:
            return methods[owner][name]
        bases = [b.value for b in classes[owner].bases if isinstance(b.value, cst.Name)]
        owner = next((b for b in bases if b in classes), None)
    return None


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.on_self: set[str] = set()
        self.plain: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name):
            self.plain.add(func.value)
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            self.on_self.add(func.attr.value)
