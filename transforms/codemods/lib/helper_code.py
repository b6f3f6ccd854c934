"""The helper code the codemods insert into the adapted file, taken by name from `helper-code/helpers.py`.

That file is ordinary Python that imports torch, so graphmode never imports it (`graphmode scan` runs without
torch): it ships as package data and is parsed here with libcst. Each definition is copied as written there,
docstring and inner comments included, so what the adapted file gets is exactly that text. The codemods insert
definitions into the file they rewrite; at the end of the chain they move to one module beside it,
`graphmode_static.py` (`helper_module_text`, transforms/output/helper_module.py), which the adapted file imports.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import libcst as cst

HELPER_CODE = Path(__file__).parents[1] / "helper-code" / "helpers.py"


@cache
def _definitions() -> dict[str, cst.ClassDef | cst.FunctionDef]:
    """The top-level classes and functions of the helper file, by name (parsed once per process)."""
    module = cst.parse_module(HELPER_CODE.read_text(encoding="utf-8"))
    return {s.name.value: s for s in module.body if isinstance(s, (cst.ClassDef, cst.FunctionDef))}


def helper_names() -> frozenset[str]:
    """Every helper the file defines."""
    return frozenset(_definitions())


def helper_statements(name: str) -> list[cst.BaseStatement]:
    """The definition of helper `name`, for `insert_after_imports`. The comment lines above it stay behind (they
    are for graphmode's maintainers)."""
    definition = _definitions().get(name)
    if definition is None:
        raise KeyError(f"{HELPER_CODE} defines no helper named {name!r}")
    # Not a deep copy (copying the helpers took 0.024 s of the chain's 0.78 s on a llama file): the definition's
    # nodes are shared with `_definitions`' parse and with every tree this helper went into before. That is safe
    # because libcst's nodes never change, and what graphmode keys by node identity (a codemod's plans, the chain's
    # parents, positions and tables in ParsedSource) is built for one tree and read in that tree only, which holds
    # each helper once (every insertion is guarded by `defined_at_top`). The node inserted is new
    # (`with_changes`), so no two trees share their top-level statement.
    return [definition.with_changes(leading_lines=())]


HELPER_MODULE_DOCSTRING = '''"""The static path's helpers, imported by the model files beside it (written by graphmode).

graphmode adapted the model files of this folder so that their Decode step runs as one graph: the `prefill` and
`decode` entries put the model on a static path, whose caches, masks and positions keep the same shapes from step
to step; every other call runs the model's own code as it was. This module holds what that path needs beyond the
model's own code: the caches, the mask rows, the switch between the two paths. It imports only torch, and is the
same text for every model graphmode adapts, so the adapted files of one folder share it.
"""'''


@cache
def helper_module_text() -> str:
    """`graphmode_static.py`: every helper of the helper file, each as `helper_statements` inserts it, under the
    file's imports and a docstring for the user."""
    module = cst.parse_module(HELPER_CODE.read_text(encoding="utf-8"))
    imports = [s.with_changes(leading_lines=()) for s in module.body
               if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], (cst.Import, cst.ImportFrom))]
    gap = [cst.EmptyLine(), cst.EmptyLine()]
    definitions = [helper_statements(name)[0].with_changes(leading_lines=gap) for name in _definitions()]
    docstring = cst.parse_statement(HELPER_MODULE_DOCSTRING + "\n")
    return cst.Module(body=[docstring, *imports, *definitions]).code


def helper_source(name: str) -> str:
    """The text `helper_statements(name)` inserts (as a module of its own, without the blank lines before it)."""
    return cst.Module(body=helper_statements(name)).code
