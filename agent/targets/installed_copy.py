"""`graphmode adapt --hf MODEL_TYPE --rewrite`: the installed transformers' own modeling file, as a target's source.

Where transformers' static-cache path breaks the graph or recompiles (a mask built from the cache's length, experts
dispatched through `nonzero().tolist()`, a model its authors declare not compilable), driving that path cannot verify,
and graphmode's own method applies instead: `models/TYPE/modeling_TYPE.py` of the installed release is copied into
the run's target folder, its relative imports (`from ...modeling_utils import ...`, `from .configuration_x import
...`) made absolute so that the copy imports the installed package, every line where it was. The copy is then a
source like remote code: designed for, rewritten and verified. The installed file is only read.
"""
from __future__ import annotations

import ast

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
    """`file:line calls `update_conv_state`` for the first write of a recurrent state in `installed` through the Cache
    API, or `file:line rebinds `self.X` ...` for one the file keeps in a module attribute (`_module_state`); else
    None."""
    tree = ast.parse(installed.read_text(encoding="utf-8"))
    calls = sorted((node.lineno, node.func.attr) for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and isinstance(node.func, ast.Attribute) and node.func.attr in RECURRENT_STATE_WRITES)
    if calls:
        return f"{installed.name}:{calls[0][0]} calls `{calls[0][1]}`"
    state = _module_state(tree)
    return f"{installed.name}:{state[0]} {state[1]}" if state else None


def _module_state(tree: ast.Module) -> tuple[int, str] | None:
    """(line, words) of the first state a module keeps in an attribute of its own and computes anew from itself
    every call (RecurrentGemma: `self.recurrent_states = <the scan of self.recurrent_states>`, a convolution state
    `self.conv1d_state = cat(self.conv1d_state, x)[:, :, 1:]`): an attribute `__init__` sets to None that another
    method rebinds from a value computed from the attribute itself. One grown by a bare `torch.cat` is a key/value
    sequence (legacy caches kept in attributes), and one only moved or cast (`self.X.to(...)`) is the same value:
    neither is such a state."""
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        methods = [m for m in cls.body if isinstance(m, ast.FunctionDef)]
        unset = _set_to_none(next((m for m in methods if m.name == "__init__"), None))
        for method in (m for m in methods if m.name != "__init__" and unset):
            rebound = _rebound_from_itself(method, unset)
            if rebound is not None:
                return rebound[0], f"rebinds `self.{rebound[1]}` in `{cls.name}.{method.name}` from its own value"
    return None


def _set_to_none(init: ast.FunctionDef | None) -> set[str]:
    """The attributes `__init__` sets to None (`self.state = None`)."""
    if init is None:
        return set()
    return {target.attr for node in ast.walk(init) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and node.value.value is None
            for target in node.targets if _self_attribute(target)}


def _rebound_from_itself(method: ast.FunctionDef, unset: set[str]) -> tuple[int, str] | None:
    """(line, attribute) of the first of `unset` the method rebinds from a value computed from it, in statement
    order through its locals; a bare `cat` of it (keys grown) or a cast of it is not such a value."""
    derived: dict[str, set[str]] = {}  # a local -> the attributes its value was computed from
    grown: set[str] = set()  # locals a bare `cat` made
    for node in sorted((n for n in ast.walk(method) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        sources = {n.attr for n in ast.walk(node.value) if _self_attribute(n) and n.attr in unset}
        sources |= set().union(*(derived.get(n.id, set()) for n in ast.walk(node.value) if isinstance(n, ast.Name)))
        cat = _is_cat(node.value) or (isinstance(node.value, ast.Name) and node.value.id in grown)
        for name in (t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)):
            derived[name] = derived.get(name, set()) | sources
            grown |= {name} if cat else set()
        rebound = next((t.attr for t in node.targets if _self_attribute(t) and t.attr in sources), None)
        if rebound is not None and not cat and not _converted(node.value, rebound):
            return node.lineno, rebound
    return None


def _self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _converted(value: ast.AST, attribute: str) -> bool:
    """`self.X.to(...)`, `self.X.float()`, either arm of a conditional being that, `self.X` or None: the attribute
    moved or cast, not a state computed anew."""
    if isinstance(value, ast.IfExp):
        return _converted(value.body, attribute) and _converted(value.orelse, attribute)
    if isinstance(value, ast.Constant) and value.value is None:
        return True
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in ("to", "type", "float", "half", "bfloat16", "contiguous"):
        value = value.func.value
    return _self_attribute(value) and value.attr == attribute


def _is_cat(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in (
        "cat", "concat", "concatenate")


def copy_modeling_file(installed: Path, module: str, package_folder: Path) -> Path:
    """Writes the copy of `installed` (module `module`) into `package_folder` (which must exist) under its own name;
    returns the copy. `installed` is only read."""
    copy = package_folder / installed.name
    copy.write_text(absolute_imports(installed.read_text(encoding="utf-8"), module), encoding="utf-8")
    return copy
