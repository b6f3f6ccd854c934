"""The run settings of `graphmode adapt`, in one place: name, default, the values allowed and what each one means.

The command line (agent/cli/main.py), graphmode.toml's [run] table (agent/targets/target_file.py), a batch manifest's
run keys (agent/batch/manifest.py), the workflow's `RunOptions` (agent/workflow/state.py) and verify's own defaults all
read them from here, so a default or a bound is written once. Standard library only: a usage error is refused before
torch or pydantic is imported.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_STEPS = 32  # enough Decode steps to cross the length thresholds a model branches on (64, 2**n)


@dataclass(frozen=True)
class Setting:
    name: str  # the [run] key; the command-line flag is --name with '-' for '_'
    default: Any
    types: tuple[type, ...]  # what a TOML value may be
    described: str  # what a TOML value must be, for messages ("a whole number")
    help: str  # the --help text, without the default
    refuse: Callable[[Any], str | None] = lambda value: None  # why a value of the right type is refused, or None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def problem(self, value: Any) -> str | None:
        """Why `value` is refused for this setting (type or bounds), or None."""
        if not isinstance(value, self.types) or (bool in self.types) != isinstance(value, bool):
            return f"must be {self.described}"
        return self.refuse(value)


def _a_folder_or_off(value: str) -> str | None:
    """A compile-cache setting names a folder that exists or can be made: a file there, or on the way to it, is
    refused before any analysis (the cache is first written by verify, minutes later)."""
    if value in ("", "off"):
        return None
    path = Path(value).expanduser()
    for folder in (path, *path.absolute().parents):
        if folder.exists():
            return None if folder.is_dir() else f"{folder} is a file, not a folder"
    return None


def _positive_sizes(value: list) -> str | None:
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        return "must be a list of positive batch sizes"
    return None


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("backend", "auto", (str,), "a backend name", "the compile backend (see --help's list)"),
    Setting("out", "graphmode-out", (str,), "a folder",
            "output folder; the run writes to OUT/<target name>/"),
    Setting("steps", MIN_STEPS, (int,), "a whole number",
            f"Decode steps to compare and time; at least {MIN_STEPS}, enough to cross the length thresholds a model's "
            "code branches on, where a graph would otherwise break or recompile unseen",
            lambda v: None if v >= MIN_STEPS else
            f"must be at least {MIN_STEPS} (Decode steps that cross length thresholds)"),
    Setting("runs", 3, (int,), "a whole number",
            "fresh processes per side (eager original, graph adapted); figures are their median [min, max]",
            lambda v: None if v >= 1 else "must be at least 1 (each side needs a run)"),
    Setting("similarity", 0.95, (int, float), "a number",
            "lowest acceptable difflib ratio of the graph side's tokens against eager's",
            lambda v: None if 0 <= v <= 1 else "must be a ratio between 0 and 1"),
    Setting("compile_cache", "", (str,), "a folder or 'off'",
            "inductor's on-disk compile cache for the graph runs: a folder kept across sessions, or 'off' (every run "
            "compiles cold); default: a fresh one in the run folder, so run 1 compiles cold and the report shows the "
            "warm-up later runs save", _a_folder_or_off),
    Setting("timeout", 600.0, (int, float), "a number of seconds",
            "the most one worker process may take (the traced run, the probe, each verify run); one that takes "
            "longer is stopped and reported with the step and its last output line",
            lambda v: None if v > 0 else "must be a number of seconds above 0"),
    Setting("batch_buckets", None, (list,), "a list of batch sizes",
            "batch sizes a server pads its batches to: the static buffers are sized for the largest, and verify pads "
            "the prompt to each, checks the real rows are unchanged and reports each bucket's captures, warm-up and "
            "memory", _positive_sizes),
    Setting("yes", False, (bool,), "true or false", "approve every planned change without asking"),
    Setting("rounds", 2, (int,), "a whole number",
            "the most design -> verify rounds: after a failed verification, graphmode maps each failure to the "
            "original's lines, plans what the adapted run revealed, drops a change that alters the tokens (found by "
            "bisecting the applied changes) and verifies again; 1 = no repair round",
            lambda v: None if 1 <= v <= 5 else "must be between 1 and 5"),
)}


def default(name: str) -> Any:
    return SETTINGS[name].default


def help_with_default(name: str) -> str:
    """The --help text, with the default where there is one worth saying."""
    setting = SETTINGS[name]
    if setting.default in (None, "", False):
        return setting.help
    return f"{setting.help} (default: {setting.default})"


def parse_buckets(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8], sorted ascending; ValueError with a one-line reason otherwise."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise ValueError("no batch sizes given; expected a list such as 1,2,4,8")
    sizes = []
    for part in parts:
        # isdecimal() refuses signs, spaces, '_' and fractions that int() would accept or round.
        if not (part.isascii() and part.isdecimal()) or int(part) < 1:
            raise ValueError(f"{part!r} is not a positive integer batch size (expected e.g. 1,2,4,8)")
        sizes.append(int(part))
    repeated = sorted({size for size in sizes if sizes.count(size) > 1})
    if repeated:
        raise ValueError(f"batch size {', '.join(map(str, repeated))} given more than once")
    return sorted(sizes)
