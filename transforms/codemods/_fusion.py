"""What the fusion codemods share: how the file spells `torch.nn.functional`, and the torch_npu import."""
from __future__ import annotations

import ast

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from graphmode.transforms.cstutil import code_of

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


def same_code(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return code_of(a).strip() == code_of(b).strip()
