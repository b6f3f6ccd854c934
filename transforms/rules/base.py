"""What every rule shares: a code, a message, the skill that explains it, and `report()`.

A rule is a libcst visitor (TorchFix style). All rules of a scan run in one batched pass.
"""
from __future__ import annotations

from typing import ClassVar

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider

from transforms.findings import Finding

class _Guard:
    """`not torch.compiler.is_compiling()` (or `torch._dynamo.is_compiling()`), spaces ignored."""

    _TEXTS = {"nottorch.compiler.is_compiling()", "nottorch._dynamo.is_compiling()"}

    def matches(self, test: cst.BaseExpression) -> bool:
        return cst.Module([]).code_for_node(test).replace(" ", "") in self._TEXTS


_EAGER_GUARD = _Guard()


class Rule(cst.BatchableCSTVisitor):
    CODE: ClassVar[str]
    MESSAGE: ClassVar[str]
    SKILL: ClassVar[str]
    # Codemods (transforms.codemods) that remove this hazard where they recognise its idiom; empty
    # when only a person can fix it.
    FIXED_BY: ClassVar[tuple[str, ...]] = ()
    METADATA_DEPENDENCIES = (PositionProvider, ParentNodeProvider)

    def __init__(self, path: str, step_functions: set[cst.FunctionDef]) -> None:
        super().__init__()
        self.path = path
        self.step_functions = step_functions  # see transforms.rules.reach
        self.findings: list[Finding] = []

    def report(self, node: cst.CSTNode, message: str | None = None) -> None:
        start = self.get_metadata(PositionProvider, node).start
        self.findings.append(
            Finding(
                code=self.CODE,
                path=self.path,
                line=start.line,
                column=start.column + 1,
                message=message or self.MESSAGE,
                skill=self.SKILL,
                function=self.qualname(node),
                autofix=bool(self.FIXED_BY),
            )
        )

    def _enclosing(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """Enclosing functions and classes, innermost first."""
        chain: list[cst.CSTNode] = []
        current = node
        while True:
            try:
                current = self.get_metadata(ParentNodeProvider, current)
            except KeyError:
                return chain
            if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
                chain.append(current)

    def qualname(self, node: cst.CSTNode) -> str:
        return ".".join(n.name.value for n in reversed(self._enclosing(node)))

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for scope in self._enclosing(node):
            if isinstance(scope, cst.FunctionDef):
                return scope
        return None

    def in_step_code(self, node: cst.CSTNode) -> bool:
        """Inside a function a model step reaches (see transforms.rules.reach), and not under an
        `if not torch.compiler.is_compiling():` guard (eager-only code)."""
        reached = any(s in self.step_functions for s in self._enclosing(node) if isinstance(s, cst.FunctionDef))
        return reached and not self._eager_only(node)

    def _eager_only(self, node: cst.CSTNode) -> bool:
        current = node
        while not isinstance(current, cst.FunctionDef):
            current = self.get_metadata(ParentNodeProvider, current)
            if isinstance(current, cst.If) and _EAGER_GUARD.matches(current.test):
                return True
        return False
