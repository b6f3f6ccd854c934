"""Writing a run's files: whole or not at all, and never inside the user's own folder."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import jinja2

_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", ".graphmode*")


def write_atomic(path: Path, text: str) -> None:
    """Writes to a temporary file beside `path` and renames it, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_adapted_tree(target: Path, dest: Path, rewritten: dict[str, str]) -> None:
    """A copy of the target folder with the rewritten sources in place, swapped in whole."""
    staging = dest.with_name(f".{dest.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(target, staging, ignore=_IGNORED)
    for relative, text in rewritten.items():
        (staging / relative).write_text(text, encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)


def render(template: str, **context) -> str:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("templates", ""),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return environment.get_template(template).render(**context)
