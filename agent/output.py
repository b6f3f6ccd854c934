"""Writing a run's files: whole or not at all, and never inside the user's own folder."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jinja2


_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", ".graphmode*")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# A plain open() gives a new file 0o666 less the umask; mkstemp gives 0o600, which would make the run's
# reports unreadable to the rest of a team that shares the folder.
_FILE_MODE = 0o666 & ~_umask()


def write_atomic(path: Path, text: str) -> None:
    """Writes to a temporary file beside `path` and renames it, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def swapped_in(dest: Path) -> Iterator[Path]:
    """A staging folder beside `dest` to fill; when the block ends without error it replaces `dest` whole, so a
    reader never sees half a folder, and after an error `dest` is as it was."""
    staging = dest.with_name(f".{dest.name}.staging")
    remove_tree(staging)
    staging.mkdir(parents=True)
    try:
        yield staging
        remove_tree(dest)
        staging.rename(dest)
    except BaseException:
        remove_tree(staging)
        raise


def write_adapted_tree(target: Path, dest: Path, rewritten: dict[str, str]) -> None:
    """A copy of the target folder with the rewritten sources in place, and graphmode's helper module beside those
    that import it, swapped in whole. The copy takes the files' contents, not their modes: a read-only target must
    not give a read-only copy that nobody can write the rewrites into, or delete."""
    # Imported here: the module reads libcst, which the commands that use this file's other helpers never import
    # (their refusals come before it; tests/test_refusals.py).
    from graphmode.transforms.output.helper_module import helper_modules

    rewritten = {**rewritten, **helper_modules(rewritten)}
    with swapped_in(dest) as staging:
        shutil.copytree(target, staging, ignore=_IGNORED, copy_function=shutil.copyfile, dirs_exist_ok=True)
        for folder, _, _ in os.walk(staging):  # copytree copies each folder's mode at the end
            os.chmod(folder, 0o777 & ~_umask())
        for relative, text in rewritten.items():
            (staging / relative).write_text(text, encoding="utf-8")


def write_overlaid_tree(target: Path, overlay: Path, dest: Path, skip: tuple[str, ...] = ()) -> None:
    """A copy of the target folder with every file of `overlay` (an adapted folder, perhaps edited by hand, or one
    holding only the files a rewrite changed) in place over it, swapped in whole; `skip`: names of overlay files that
    are no source (fix.json). Both folders are only read."""
    with swapped_in(dest) as staging:
        shutil.copytree(target, staging, ignore=_IGNORED, copy_function=shutil.copyfile, dirs_exist_ok=True)
        ignored = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", ".graphmode*", *skip)
        shutil.copytree(overlay, staging, ignore=ignored, copy_function=shutil.copyfile, dirs_exist_ok=True)
        for folder, _, _ in os.walk(staging):
            os.chmod(folder, 0o777 & ~_umask())


def remove_tree(path: Path) -> None:
    """Removes a folder this run wrote, making read-only entries writable first; nothing when it is absent."""
    def retry(function, name, _):
        os.chmod(os.path.dirname(name) or ".", 0o700)
        if os.path.isdir(name) and not os.path.islink(name):
            os.chmod(name, 0o700)
        function(name)

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=retry)


def render(template: str, **context) -> str:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("graphmode.templates", ""),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    # Python literals for generated code (tojson would write true/false/null).
    environment.filters["pyrepr"] = repr
    return environment.get_template(template).render(**context)


LOCK_NAME = ".graphmode.lock"


@contextlib.contextmanager
def run_folder_lock(run_dir: Path, session: str) -> Iterator[None]:
    """Holds the run folder for one session while it works: a second session writing into the same folder would
    mix the two runs' files (and one report would carry the other's figures). The lock is the kernel's
    (`flock`), so a session that dies releases it; the file only names who holds it, and is removed on every way
    out of the block (an error, Ctrl-C, a finished run), so the folder never says a run is in progress when none is.
    A killed process leaves the file but not the lock, which the next session takes over."""
    from graphmode.agent.errors import UserError

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    handle = _locked(path)
    if handle is None:
        try:
            holder = path.read_text(encoding="utf-8").strip()
        except OSError:
            holder = ""
        raise UserError(f"{run_dir} is in use by graphmode session {holder or 'another session'}; wait for it to "
                        "finish, or give this run another --out")
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(session)
        handle.flush()
        yield
    finally:
        # Removed while still held: a session waiting to open it then finds the file gone, or a new one (_locked).
        path.unlink(missing_ok=True)
        handle.close()


def _locked(path: Path):
    """The lock file at `path`, open and held (flock), or None when another session holds it. A holder removes the
    file before it lets go, so a lock taken on a file that is no longer at `path` is let go and taken again on the
    file that is."""
    while True:
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()
