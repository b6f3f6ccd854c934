"""Adapted texts as graphmode's writers leave them, for the tests that run them: with graphmode_static.py, the helper
module the adapted file imports (transforms/output/helper_module.py), where the import finds it."""
from __future__ import annotations

import importlib.util
import sys
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType

from graphmode.transforms.codemods.lib.helper_code import helper_module_text
from graphmode.transforms.output.helper_module import FILE_NAME, helper_modules


def write_adapted(folder: Path, files: dict[str, str]) -> None:
    """The adapted texts (path relative to `folder` -> text) written into `folder`, with the helper module beside
    those that import it, as every writer of adapted files leaves them."""
    for relative, text in {**files, **helper_modules(files)}.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text, encoding="utf-8")


def import_adapted(path: Path, name: str) -> ModuleType:
    """The adapted file `path` imported under `name` (registered first: dataclasses and `inspect` look it up), its
    plain `from graphmode_static import ...` answered by the helper module. A fixture's output has none beside it
    (the fixtures are the file alone), so the module is written once per process into a folder of its own, last on
    sys.path; the text is the same for every adapted file."""
    _helper_module_folder()
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def _helper_module_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="graphmode-static-"))
    (folder / FILE_NAME).write_text(helper_module_text(), encoding="utf-8")
    sys.path.append(str(folder))
    return folder
