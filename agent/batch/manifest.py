"""A batch manifest: the targets `graphmode batch` adapts, each in the target-file format (agent.targets.target_file).

    [defaults]                   # [run] options every target shares (out: the batch's output folder)
    backend = "inductor"
    runs = 3
    target_timeout = 3600        # the most one target's whole run may take, in seconds

    [[target]]
    path = "../legacy_llm"       # a folder with a harness.py (or with a graphmode.toml, read as its target file)

    [[target]]
    name = "llama-tiny"          # optional: the target's folder in the output; derived from path or hf
    hf = "llama"                 # any [target] key of a graphmode.toml: harness, hf, tiny, convention, sources
    tiny = true
    python = "venvs/tf-4.41/bin/python"  # the interpreter its model runs under (a venv with the transformers
                                 # release it needs); each target may name its own, so one batch covers them all
    run = { runs = 1 }           # this target's own [run] options, over [defaults]

Paths are relative to the manifest's folder. Everything is checked before anything runs, so a typo in target 19
is bad input (exit 2) rather than a failure an hour in.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphmode.agent.errors import UserError
from graphmode.agent.targets import target_file
from graphmode.runners.run_settings import SETTINGS

# Batch-only [run] keys. target_timeout bounds a whole target (adapt's own `timeout` bounds each of its worker
# processes); it is not part of a target's key, since it limits the run rather than changing its result.
_BATCH_RUN_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "target_timeout": ((int, float), "a number of seconds"),
}
# A target's own run table: the batch decides where each target writes, so `out` is for [defaults] only.
TARGET_RUN_KEYS = {**{k: v for k, v in target_file.RUN_KEYS.items() if k != "out"}, **_BATCH_RUN_KEYS}
DEFAULT_KEYS = {**target_file.RUN_KEYS, **_BATCH_RUN_KEYS}
_ENTRY_KEYS = ("name", "path", "run", *target_file.TARGET_KEYS)
DEFAULT_TARGET_TIMEOUT = 3600.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


@dataclass
class BatchTarget:
    """One target, resolved: absolute paths, and the options it runs with after defaults and overrides."""

    name: str
    target: dict[str, Any]  # a [target] table with absolute paths
    run: dict[str, Any]  # its effective [run] options, without `out` (the batch decides it)
    target_timeout: float
    shown_as: str  # what the progress lines and the summary call it (the manifest's own spelling)

    @property
    def key(self) -> str:
        """What the result depends on: a finished target whose key is unchanged is not run again."""
        text = json.dumps({"target": self.target, "run": self.run}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def target_file_text(self) -> str:
        """The graphmode.toml this target runs from (written into its batch folder, a record of what ran)."""
        lines = [f"# graphmode batch: target {self.name}; `graphmode adapt` ran from this file", "[target]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in self.target.items()]
        lines += ["", "[run]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in self.run.items()]
        return "\n".join(lines) + "\n"


@dataclass
class Manifest:
    path: Path
    out: Path  # the batch's output folder, absolute
    targets: list[BatchTarget] = field(default_factory=list)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def load_manifest(path: Path, *, out: Path | None = None, overrides: dict[str, Any] | None = None,
                  target_timeout: float | None = None) -> Manifest:
    """The manifest, checked whole. `out`, `overrides` ([run] options) and `target_timeout` come from the command
    line and win over the file, as they do for `graphmode adapt`."""
    data = target_file.read_toml(path)
    unknown = sorted(set(data) - {"defaults", "target"})
    if unknown:
        raise UserError(f"{path}: unknown table(s) {', '.join(unknown)} (a manifest has [defaults] and [[target]])")
    defaults = target_file.check_table(path, "[defaults]", data.get("defaults", {}), DEFAULT_KEYS)
    entries = data.get("target")
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{path}: no targets: add one [[target]] table per target")
    folder = path.resolve().parent
    # The output folder: --out, else [defaults] out (relative to where the command runs, as --out), else
    # graphmode-out/<manifest name>.
    named = defaults.pop("out", None)
    batch_out = (out or (Path(named).expanduser() if named else Path("graphmode-out") / path.stem)).resolve()
    targets: list[BatchTarget] = []
    for number, entry in enumerate(entries, 1):
        found = _target(path, folder, number, entry, defaults, overrides or {}, target_timeout)
        _check_fits(path, found, targets, batch_out)
        targets.append(found)
    _check_interpreters(path, targets)
    return Manifest(path=path.resolve(), out=batch_out, targets=targets)


def _check_fits(path: Path, found: BatchTarget, targets: list[BatchTarget], batch_out: Path) -> None:
    """A new target can join the batch: its name is not taken, and the batch does not write into its folder."""
    twin = next((t for t in targets if t.name == found.name), None)
    if twin is not None:
        raise UserError(f"{path}: two targets are named {found.name!r} ({twin.shown_as} and {found.shown_as}); "
                        "give one of them its own name = \"...\"")
    home = Path(found.target["harness"]).parent if "harness" in found.target else None
    if home is not None and (batch_out == home or home in batch_out.parents):
        raise UserError(f"{path}: the output folder {batch_out} is inside target {found.name}'s folder; give "
                        "the batch another --out")


def _check_interpreters(path: Path, targets: list[BatchTarget]) -> None:
    """Each interpreter the targets name can run graphmode's workers: checked once per interpreter, before any target
    runs (a well under a second each)."""
    from graphmode.runners.environments import AUTO  # standard library only: no torch
    from graphmode.runners.interpreter import InterpreterError, check

    checked: set[str] = set()
    for found in targets:
        named = found.target.get("python")
        if named is None or named == AUTO or named in checked:  # AUTO: made or found when the target runs
            continue
        try:
            check(named, f"{path}: [[target]] {found.name} python")
        except InterpreterError as error:
            raise UserError(str(error)) from None
        checked.add(named)


def _target(path: Path, folder: Path, number: int, entry: Any, defaults: dict[str, Any], overrides: dict[str, Any],
            target_timeout: float | None) -> BatchTarget:
    name, label = _entry_name(path, number, entry)
    spec = {key: entry[key] for key in target_file.TARGET_KEYS if key in entry}
    run = entry.get("run", {})
    if isinstance(run, dict) and "out" in run:
        raise UserError(f"{path}: {label}: run has out; the batch writes each target to OUT/<name> (set OUT with "
                        "--out or [defaults] out)")
    checked = target_file.checked(path, spec, run, labels=(label, f"{label} run"), run_keys=TARGET_RUN_KEYS)
    base_target, base_run = _its_own_file(path, folder, label, entry.get("path"))
    spec = {**base_target, **_absolute(folder, checked.target)}
    _check_one_way(path, label, entry, spec)
    spec = _checked_spec(path, folder, label, entry.get("path"), spec)
    shown_as = entry.get("path") or entry.get("harness") or (f"hf {entry['hf']}" if "hf" in entry else "")
    own = {**base_run, **checked.run}
    timeout = _target_timeout(path, label, own, defaults, target_timeout)
    effective = _effective_run(path, label, defaults, own, overrides)
    return BatchTarget(name=name or _derived_name(spec), target=spec, run=effective, target_timeout=timeout,
                       shown_as=str(shown_as or name))


def _entry_name(path: Path, number: int, entry: Any) -> tuple[Any, str]:
    """The entry's own name (None when it gives none) and the label its errors use; refuses an entry that is not a
    table, has an unknown key, or a name that cannot be a folder."""
    label = f"[[target]] {number}"
    if not isinstance(entry, dict):
        raise UserError(f"{path}: {label} must be a table")
    unknown = [key for key in entry if key not in _ENTRY_KEYS]
    if unknown:
        raise UserError(f"{path}: {label} has no key {unknown[0]!r} (known: {', '.join(_ENTRY_KEYS)})")
    name = entry.get("name")
    if name is not None and not (isinstance(name, str) and _NAME.match(name)):
        raise UserError(f"{path}: {label} name must be a folder name (letters, digits, '.', '_', '-'), got {name!r}")
    return name, (f"[[target]] {name}" if name else label)


def _check_one_way(path: Path, label: str, entry: dict[str, Any], spec: dict[str, Any]) -> None:
    """The entry says how to build its model exactly once: a path folder, or hf, harness or convention."""
    if "path" in entry:
        if not isinstance(entry["path"], str):
            raise UserError(f"{path}: {label} path must be a folder, got {entry['path']!r}")
        if "hf" in entry:
            raise UserError(f"{path}: {label} names path and hf; give one way to build the model")
    elif not any(key in spec for key in ("hf", "harness", "convention")):
        raise UserError(f"{path}: {label} says nothing to adapt: give path (a folder with a harness.py), harness, "
                        "hf, or convention")


def _target_timeout(path: Path, label: str, own: dict[str, Any], defaults: dict[str, Any],
                    target_timeout: float | None) -> float:
    """The target's time limit: the command line's, else its own, else [defaults]'; popped from `own`, since it
    limits the run rather than being one of adapt's options."""
    timeout = own.pop("target_timeout", defaults.get("target_timeout", DEFAULT_TARGET_TIMEOUT))
    timeout = target_timeout if target_timeout is not None else timeout
    if timeout <= 0:
        raise UserError(f"{path}: {label} target_timeout must be above 0, got {timeout!r}")
    return float(timeout)


def _effective_run(path: Path, label: str, defaults: dict[str, Any], own: dict[str, Any],
                   overrides: dict[str, Any]) -> dict[str, Any]:
    """The [run] options the target runs with: [defaults], then its own, then the command line's, checked."""
    effective = {"yes": True, **{k: v for k, v in defaults.items() if k != "target_timeout"}, **own,
                 **{k: v for k, v in overrides.items() if v is not None}}
    _check_options(path, label, effective)
    if effective.get("compile_cache") not in (None, "", "off"):  # as adapt reads it: relative to where it runs
        effective["compile_cache"] = str(Path(effective["compile_cache"]).expanduser().resolve())
    return effective


def _check_options(path: Path, label: str, run: dict[str, Any]) -> None:
    """The values `graphmode adapt` would refuse, refused now, before any target runs."""
    from graphmode.runners.backends import BACKEND_NAMES  # the registry only: no torch

    for key, value in run.items():
        said = SETTINGS[key].problem(value) if key in SETTINGS else None
        if key == "backend" and not said and value not in BACKEND_NAMES:
            said = f"must be one of {', '.join(BACKEND_NAMES)}"
        if said:
            raise UserError(f"{path}: {label}: {key} = {value!r} {said}")


def _its_own_file(path: Path, folder: Path, label: str, where: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A `path` folder's own graphmode.toml (or a .toml `path`): its [target] and [run], under the entry's keys.
    Its paths are made absolute against its own folder, and its `out` is dropped (the batch decides it)."""
    if not isinstance(where, str):
        return {}, {}
    place = (folder / where).expanduser().resolve()
    if not place.exists():
        raise UserError(f"{path}: {label} path {where!r} does not exist ({place})")
    found = target_file.find(place)
    if found is None:
        if place.is_file() and place.name != "harness.py":
            raise UserError(f"{path}: {label} path must be a target folder, its harness.py or a graphmode.toml, "
                            f"got {where!r}")
        return {}, {}
    own = target_file.load(found)
    run = {k: v for k, v in own.run.items() if k != "out"}
    return _absolute(own.folder, own.target), run


def _absolute(folder: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """[target] paths against `folder`; an `hf` that names no file there is a model type and stays as written."""
    spec = dict(spec)
    if "harness" in spec:
        spec["harness"] = str((folder / spec["harness"]).expanduser().resolve())
    if "/" in spec.get("python", ""):  # not resolved: a venv's bin/python is a link out of the venv
        spec["python"] = os.path.abspath((folder / spec["python"]).expanduser())
    if "hf" in spec:
        local = (folder / spec["hf"]).expanduser()
        if local.exists():
            spec["hf"] = str(local.resolve())
        elif "/" in spec["hf"] or spec["hf"].endswith(".json"):
            raise UserError(f"{folder}: hf {spec['hf']!r} names a file or folder that does not exist ({local})")
    return spec


def _checked_spec(path: Path, folder: Path, label: str, where: str | None, spec: dict[str, Any]) -> dict[str, Any]:
    """The [target] table adapt will read, with every file it names there: a harness.py, or a convention (with
    the folder it applies to), or hf; and the sources in that folder."""
    if "hf" in spec:
        if {"harness", "convention"} & set(spec):
            raise UserError(f"{path}: {label} names hf and a harness or convention; give one way to build the model")
        return spec
    if where is not None:
        place = (folder / where).expanduser().resolve()
        harness = place if place.name == "harness.py" else (place.parent if place.is_file() else place) / "harness.py"
        spec = {**spec, "harness": str(harness)}
    if "harness" not in spec:
        raise UserError(f"{path}: {label} names a convention but no folder: give path (the folder of the model "
                        "sources)")
    harness = Path(spec["harness"])
    if harness.name != "harness.py":
        raise UserError(f"{path}: {label} harness must name a file called harness.py, got {harness.name!r}")
    if not harness.parent.is_dir():
        raise UserError(f"{path}: {label}: the target folder {harness.parent} does not exist")
    _check_builder(path, label, harness, spec.get("convention"))
    _check_sources(path, label, harness.parent, spec.get("sources"))
    return spec


def _check_builder(path: Path, label: str, harness: Path, convention: Any) -> None:
    """A convention is a known one; without one, the harness.py exists."""
    if convention is not None:
        from graphmode.transforms.conventions import CONVENTIONS  # stdlib `ast` only

        if convention not in (*CONVENTIONS, "auto"):
            raise UserError(f"{path}: {label} convention must be one of {', '.join(CONVENTIONS)} or auto, got "
                            f"{convention!r}")
    elif not harness.is_file():
        raise UserError(f"{path}: {label}: no harness.py in {harness.parent} (write one with `graphmode init`, or "
                        "name a convention)")


def _check_sources(path: Path, label: str, home: Path, sources: Any) -> None:
    """Each file `sources` names is in the target folder, and the list, when given, is not empty."""
    missing = [s for s in sources or [] if not (home / s).is_file()]
    if missing:
        raise UserError(f"{path}: {label} sources names {', '.join(missing)}, not in {home}")
    if sources == []:
        raise UserError(f"{path}: {label} sources is empty: name the files graphmode may rewrite")


def _derived_name(spec: dict[str, Any]) -> str:
    """A target's default name: its folder's, or hf-<model type or folder>."""
    if "hf" in spec:
        local = Path(spec["hf"])
        base = (local.parent.name if local.suffix == ".json" else local.name) if local.is_absolute() else spec["hf"]
        return "hf-" + re.sub(r"[^A-Za-z0-9._-]", "_", base)
    return re.sub(r"[^A-Za-z0-9._-]", "_", Path(spec["harness"]).parent.name) or "target"
