"""`graphmode init`: a harness.py for a model folder, written from the model's own sources."""
from __future__ import annotations

import argparse
from pathlib import Path

from graphmode.agent.cli.consoles import console
from graphmode.agent.errors import UserError


def run_init(args: argparse.Namespace) -> int:
    """`graphmode init`: refuses (exit 2, nothing written) without model files, over an existing harness.py unless
    --force, and when the convention is unknown and none was named."""
    folder = args.path
    harness = _harness_to_write(folder, args.force)
    from graphmode.agent.targets.convention import render_harness
    from graphmode.agent.targets.hf import init_harness, is_hub_folder

    if is_hub_folder(folder) and args.convention is None:
        # A Hub folder's files import each other relatively (`from .configuration_x import ...`): its harness
        # imports the folder as a package and drives the model as its generate() does, as `--hf FOLDER --tiny`.
        text, target = init_harness(folder)
        _write_keeping_old(harness, text)
        console.print(f"wrote {harness}: {' or '.join(target.model_refs)} from config.json's auto_map, the folder "
                      "imported as a package; tiny random weights", soft_wrap=True, markup=False)
        console.print(f"then: python {harness} (one greedy run), and graphmode adapt {folder}", soft_wrap=True,
                      markup=False)
        return 0
    text, found, todo = render_harness(folder, args.convention)
    _write_keeping_old(harness, text)
    how = "named" if found.named else "detected"
    console.print(f"wrote {harness}: {found.model_class} ({found.file}), convention {found.convention} ({how})",
                  soft_wrap=True, markup=False)
    console.print(f"{todo} line(s) marked TODO(graphmode) to fill or check" if todo else
                  "nothing is left to fill in; check the sizes", soft_wrap=True, markup=False)
    console.print(f"then: python {harness} (one greedy run), and graphmode adapt {folder}", soft_wrap=True,
                  markup=False)
    return 0


def _harness_to_write(folder: Path, force: bool) -> Path:
    """The harness.py `graphmode init` writes in `folder`, after the checks that refuse it (nothing is written)."""
    from graphmode.transforms.conventions import HARNESS_FILE, model_files

    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (graphmode init takes the folder with the model's .py files)")
    if not model_files(folder):
        raise UserError(f"{folder}: no .py model file there (graphmode init reads the model's own sources)")
    harness = folder / HARNESS_FILE
    if harness.exists() and not force:
        raise UserError(f"{harness} exists; --force replaces it (keeping the old one as {HARNESS_FILE}.orig)")
    return harness


def _write_keeping_old(harness: Path, text: str) -> None:
    """Writes `text` to `harness` whole or not at all, the harness it replaces (--force) kept beside it as .orig."""
    import shutil

    from graphmode.agent.output import write_atomic

    if harness.exists():
        shutil.copyfile(harness, harness.with_name(harness.name + ".orig"))
    write_atomic(harness, text)
