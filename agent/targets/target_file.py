"""`graphmode.toml`: one file that says what to adapt and how, for a person at a terminal and for batch runs alike.

    [target]
    harness = "harness.py"       # the harness beside the sources (the default), or:
    # hf = "llama"               # a Hugging Face model type, config.json or model folder (as --hf)
    # tiny = true                # with hf: a tiny model with random weights (as --tiny)
    # rewrite = true             # with hf: rewrite a copy of transformers' own modeling file (as --rewrite)
    # convention = "start_pos"   # no harness yet: write one for this calling convention (as `graphmode init`)
    sources = ["model.py"]       # the files graphmode may rewrite (instead of the harness's SOURCES)
    # python = "/opt/venvs/tf-4.41/bin/python"  # the interpreter the model runs under (as --python): a venv with
                                 # the transformers release its code needs; graphmode's workers run there

    [run]
    backend = "inductor"         # every [run] key is the `graphmode adapt` option of the same name
    steps = 32
    runs = 3
    similarity = 0.95
    timeout = 600
    compile_cache = ""
    batch_buckets = [1, 2, 4]
    out = "graphmode-out"        # relative to the folder the command runs in, as --out
    yes = true                   # approve every planned change (batch); false stops for confirmation

Paths in [target] are relative to the file's folder. An option given on the command line wins over the file.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphmode.agent.errors import UserError
from graphmode.runners.run_settings import SETTINGS

FILE_NAME = "graphmode.toml"
# key -> (type, what it must be), per table
TARGET_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "harness": (str, "a file name"), "hf": (str, "a model type, config.json or folder"),
    "tiny": (bool, "true or false"), "rewrite": (bool, "true or false"),
    "convention": (str, "a convention name"), "sources": (list, "a list of file names"),
    "python": (str, "a Python interpreter's path, or \"auto\""),
}
RUN_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    name: (setting.types, setting.described) for name, setting in SETTINGS.items()}


@dataclass
class TargetFile:
    path: Path
    target: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return self.path.parent

    def sources_in(self, target: Path) -> list[str] | None:
        """[target] sources, each an existing file of the target folder; None when the file names none."""
        names = self.target.get("sources")
        if names is None:
            return None
        missing = [n for n in names if not (target / n).is_file()]
        if missing:
            raise UserError(f"{self.path}: [target] sources names {', '.join(missing)}, not in {target}")
        if not names:
            raise UserError(f"{self.path}: [target] sources is empty: name the files graphmode may rewrite")
        return list(names)

    def relative(self, value: str) -> Path:
        """A [target] path, relative to the file's folder."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.folder / path

    def python(self) -> str | None:
        """[target] python: a path relative to the file's folder, or a bare name looked up on PATH (`python3.10`);
        symbolic links are kept (a venv's bin/python links to its base Python, which is not the venv)."""
        named = self.target.get("python")
        if named is None or "/" not in named:
            return named
        return os.path.abspath(self.relative(named))


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib


def find(path: Path) -> Path | None:
    """The target file PATH names: PATH itself when it is a .toml file, FOLDER/graphmode.toml, else None."""
    if path.is_file() and path.suffix == ".toml":
        return path
    if path.is_dir() and (path / FILE_NAME).is_file():
        return path / FILE_NAME
    return None


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's tables; a file that cannot be read, or is not TOML (the parser names the line), is bad input."""
    toml = _toml()
    try:
        return toml.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot be read ({error})") from None
    except toml.TOMLDecodeError as error:
        raise UserError(f"{path}: not valid TOML: {error}") from None


def load(path: Path) -> TargetFile:
    """The file, read and checked: an unknown table or key, or a value of the wrong kind, is bad input."""
    data = read_toml(path)
    unknown = sorted(set(data) - {"target", "run"})
    if unknown:
        raise UserError(f"{path}: unknown table(s) {', '.join(unknown)} (a target file has [target] and [run])")
    return checked(path, data.get("target", {}), data.get("run", {}))


def check_table(path: Path, label: str, values: Any, keys: dict[str, tuple[type | tuple[type, ...], str]]) -> dict:
    """One table's keys and the kind of each value; `label` names the table in messages ("[run]")."""
    if not isinstance(values, dict):
        raise UserError(f"{path}: {label} must be a table")
    for key, value in values.items():
        if key not in keys:
            raise UserError(f"{path}: {label} has no key {key!r} (known: {', '.join(keys)})")
        kind, what = keys[key]
        if not _is_kind(value, kind):
            raise UserError(f"{path}: {label} {key} must be {what}, got {value!r}")
    buckets = values.get("batch_buckets")
    if buckets is not None and not all(isinstance(b, int) and not isinstance(b, bool) for b in buckets):
        raise UserError(f"{path}: {label} batch_buckets must be a list of whole numbers, got {buckets!r}")
    return dict(values)


def _is_kind(value: Any, kind: type | tuple[type, ...]) -> bool:
    """Whether the value is of the kind; true or false is a number only where the kind names bool."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def checked(path: Path, target: Any, run: Any, *, labels: tuple[str, str] = ("[target]", "[run]"),
            run_keys: dict[str, tuple[type | tuple[type, ...], str]] | None = None) -> TargetFile:
    """A [target] and a [run] table, checked; a batch manifest checks each of its targets with this too, naming
    them by `labels` and allowing its own `run_keys`."""
    target_label, run_label = labels
    found = TargetFile(path=path.resolve(), target=check_table(path, target_label, target, TARGET_KEYS),
                       run=check_table(path, run_label, run, RUN_KEYS if run_keys is None else run_keys))
    target = found.target
    if "hf" in target and ({"harness", "convention"} & set(target)):
        raise UserError(f"{path}: {target_label} names hf and a harness or convention; give one way to build the model")
    for flag in ("tiny", "rewrite"):
        if target.get(flag) and "hf" not in target:
            raise UserError(f"{path}: {target_label} {flag} goes with hf")
    sources = target.get("sources")
    if sources is not None and not all(isinstance(s, str) for s in sources):
        raise UserError(f"{path}: {target_label} sources must be a list of file names, got {sources!r}")
    return found
