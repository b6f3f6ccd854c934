"""`graphmode adapt --hf MODEL_TYPE --rewrite`: the installed transformers' own modeling file, as a target's source.

Where transformers' static-cache path breaks the graph or recompiles (a mask built from the cache's length, experts
dispatched through `nonzero().tolist()`, a model its authors declare not compilable), driving that path cannot verify,
and graphmode's own method applies instead: `models/TYPE/modeling_TYPE.py` of the installed release is copied into
the run's target folder, its relative imports (`from ...modeling_utils import ...`, `from .configuration_x import
...`) made absolute so that the copy imports the installed package, every line where it was. The copy is then a
source like remote code: designed for, rewritten and verified. The installed file is only read.
"""
from __future__ import annotations

import sys
from pathlib import Path

import libcst as cst
from libcst.helpers import get_full_name_for_node

from graphmode.agent.errors import UserError


class _AbsoluteImports(cst.CSTTransformer):
    """Every relative `from` import of a module of package `package` (a dotted name) made absolute."""

    def __init__(self, package: str):
        super().__init__()
        self.package = package.split(".")

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        level = len(updated_node.relative)
        if not level:
            return updated_node
        if level > len(self.package):
            raise UserError(f"a relative import with {level} dots goes above the package {'.'.join(self.package)}")
        parts = self.package[:len(self.package) - (level - 1)]
        if updated_node.module is not None:
            parts = parts + get_full_name_for_node(updated_node.module).split(".")
        # The whitespace is set, not kept: `from .x import` has none between `from` and the dots' replacement.
        return updated_node.with_changes(relative=[], module=cst.parse_expression(".".join(parts)),
                                         whitespace_after_from=cst.SimpleWhitespace(" "),
                                         whitespace_before_import=cst.SimpleWhitespace(" "))


def absolute_imports(source: str, module: str) -> str:
    """`source`, the text of module `module` (`transformers.models.llama.modeling_llama`), with its relative imports
    made absolute; the rest of the text, and every line's number, as it was (a copy's tracebacks and design.md's
    `file:line` then point at the installed file's lines too)."""
    out = cst.parse_module(source).visit(_AbsoluteImports(module.rpartition(".")[0])).code
    if out.count("\n") != source.count("\n"):  # an import written over several lines keeps them: never expected
        raise UserError(f"making the imports of {module} absolute changed its line count")
    return out


def installed_modeling_file(model_class: type) -> Path:
    """The installed file that defines `model_class` (the type's causal LM): `models/TYPE/modeling_TYPE.py`, or
    another type's where the type borrows its class (gemma3_text's Gemma3ForCausalLM is in models/gemma3/)."""
    module = sys.modules[model_class.__module__]
    path = Path(getattr(module, "__file__", None) or "")
    if path.suffix != ".py" or not model_class.__module__.startswith("transformers.models."):
        raise UserError(f"{model_class.__name__} is defined in {model_class.__module__}, not in a modeling file of "
                        "transformers' models/ folder: there is no file of its own to copy and rewrite")
    return path


# transformers' Cache API for a recurrent state (Mamba's convolution and SSM states, linear attention's): a state
# that is overwritten, not a key/value sequence that grows a position a step, which is all graphmode's buffers hold.
RECURRENT_STATE_WRITES = ("update_conv_state", "update_recurrent_state")


def recurrent_state_write(installed: Path) -> str | None:
    """`file:line: cache.update_conv_state(...)` for the first write of a recurrent state in `installed`, else None."""
    import ast

    tree = ast.parse(installed.read_text(encoding="utf-8"))
    calls = sorted((node.lineno, node.func.attr) for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and isinstance(node.func, ast.Attribute) and node.func.attr in RECURRENT_STATE_WRITES)
    return f"{installed.name}:{calls[0][0]} calls `{calls[0][1]}`" if calls else None


def copy_modeling_file(installed: Path, module: str, package_folder: Path) -> Path:
    """Writes the copy of `installed` (module `module`) into `package_folder` (which must exist) under its own name;
    returns the copy. `installed` is only read."""
    copy = package_folder / installed.name
    copy.write_text(absolute_imports(installed.read_text(encoding="utf-8"), module), encoding="utf-8")
    return copy
