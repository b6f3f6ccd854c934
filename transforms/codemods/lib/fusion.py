"""What the fusion codemods share: how the file spells `torch.nn.functional`, and the torch_npu import."""
from __future__ import annotations

import ast
from collections.abc import Mapping

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from graphmode.transforms.cstutil import code_of, names_in, walk

NPU = "npu"
CPU = "cpu"


def functional_prefix(tree: ast.Module, context: CodemodContext) -> str:
    """How this file names `torch.nn.functional` at module level (`F`, `nn.functional`), or the full dotted name,
    whose `import torch` is then asked for."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name == "torch.nn.functional" and alias.asname:
                    return alias.asname
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0:
            for alias in stmt.names:
                if stmt.module == "torch.nn" and alias.name == "functional":
                    return alias.asname or "functional"
                if stmt.module == "torch" and alias.name == "nn" and alias.asname in (None, "nn"):
                    return "nn.functional"
    AddImportsVisitor.add_needed_import(context, "torch")
    return "torch.nn.functional"


def wants_torch_npu(context: CodemodContext) -> None:
    """The NPU form calls torch_npu's operators: the file imports torch_npu (it runs on an Ascend host only)."""
    AddImportsVisitor.add_needed_import(context, "torch_npu")


def bare(node: cst.BaseExpression) -> cst.BaseExpression:
    """The expression without the parentheses around it (code and matching see through them)."""
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def same_code(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return code_of(a).strip() == code_of(b).strip()


def replaced(node: cst.CSTNode, replacements: Mapping[cst.CSTNode, cst.CSTNode]) -> cst.CSTNode:
    """`node` with each key of `replacements` (a node inside it, by identity) swapped for its value; an expression
    keeps the parentheses around the one it stands in for."""
    class _Swap(cst.CSTTransformer):
        def on_leave(self, original_node, updated_node):
            new = replacements.get(original_node)
            if new is None:
                return updated_node
            if getattr(original_node, "lpar", None) and not getattr(new, "lpar", True):
                return new.with_changes(lpar=original_node.lpar, rpar=original_node.rpar)
            return new

    return node.visit(_Swap())


def assigned_names(stmt: cst.CSTNode) -> set[str]:
    """The names a statement assigns, augmented assignments included."""
    names: set[str] = set()
    for node in walk(stmt):  # one walk for both kinds: the names are a set, so their order does not matter
        if type(node) is cst.AssignTarget or type(node) is cst.AugAssign:
            names |= names_in(node.target)
    return names
