"""`--python auto`: the environment a target's code needs, made by graphmode and kept for the next run.

Remote code is written against one transformers release. Where this interpreter's release cannot run it (the names
the code uses, runners.releases), graphmode makes a venv that can: the newest release of the range every name the
code uses allows, with this interpreter's torch release (pinned: nothing installed later may change it) and the packages
the code imports that a wheel can be had for. The venv does not see this interpreter's packages: a newer package
here (a kernels hub of transformers 5's time) would be imported by the older release and fail. Each environment is kept
under GRAPHMODE_HOME/envs, named by what it holds, and reused by every later run and batch target that needs the
same. It counts as made only once its manifest is written, last; a make that was interrupted is started again, and
two runs that need the same environment at once take turns (a lock file). uv makes it where uv is installed, pip
otherwise. A package that cannot be had (no network, no such release) stops the run with the command that failed.

Standard library only: the agent decides the interpreter before anything imports torch.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from graphmode.runners.interpreter import graphmode_home, release
from graphmode.runners.measure.env_info import package_version
from graphmode.runners.releases import SUPPORTED_FROM, NameUse, common_releases

AUTO = "auto"  # what `--python`, graphmode.toml and manifests say for it
MANIFEST = "graphmode-env.json"
_CONSTRAINTS = "constraints.txt"
_INSTALL_TIMEOUT_S = 1800


class EnvironmentMakeError(RuntimeError):
    """The environment cannot be made; the message names the command that failed and what it said."""


def transformers_requirement(uses: list[NameUse]) -> str | None:
    """The transformers requirement an environment for code using `uses` installs: the newest span of releases that
    has every name, as a pip range; None when no release has them all."""
    spans = common_releases(uses)
    if not spans:
        return None
    first, last = spans[-1]
    low = ".".join(map(str, first)) if first else SUPPORTED_FROM
    if last is None:
        return f"transformers>={low}"
    return f"transformers>={low},<{last[0]}.{last[1] + 1}"


def environment_for(requirement: str, packages: list[str], say: Callable[[str], None]) -> str:
    """The Python of an environment with `requirement` and `packages` (import names the code imports that this
    interpreter lacks; each installed where a wheel can be had), made once and reused: its path."""
    torch = _torch_release()
    folder = environment_folder(requirement, packages)
    python, root = folder / "bin" / "python", folder.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run making the same environment finishes first
        if (folder / MANIFEST).is_file() and python.exists():
            say(f"python auto: reusing {folder} ({requirement})")
            return str(python)
        if folder.exists():
            shutil.rmtree(folder)  # a make that did not finish
        tool = "uv" if shutil.which("uv") else "pip"
        say(f"python auto: making an environment with {requirement} and torch {torch} ({tool}, once; kept in "
            f"{folder})")
        try:
            _make(folder, tool, requirement, torch)
            extras = _installable(folder, tool, packages)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        manifest = {"requirement": requirement, "torch": torch, "packages": extras, "tool": tool,
                    "python": sys.executable}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return str(python)


def environment_folder(requirement: str, packages: list[str]) -> Path:
    """Where the environment for `requirement` and `packages` is kept: named by what it holds (this Python, this
    torch release, the requirement, the packages), so every target that needs the same shares it."""
    key = hashlib.sha256(json.dumps([sys.version, _torch_release(), requirement, sorted(packages)]).encode())
    return graphmode_home() / "envs" / f"transformers-{_slug(requirement)}-{key.hexdigest()[:12]}"


def _torch_release() -> str | None:
    own = package_version("torch")
    return ".".join(map(str, release(own))) if own else None  # 2.13.0+cpu -> 2.13.0: the index's name for it


def _make(folder: Path, tool: str, requirement: str, torch: str | None) -> None:
    if tool == "uv":
        _run(["uv", "venv", "--python", sys.executable, str(folder)])
    else:
        _run([sys.executable, "-m", "venv", str(folder)])
    (folder / _CONSTRAINTS).write_text(f"torch=={torch}\n" if torch else "")
    _run(_install(folder, tool) + ([f"torch=={torch}"] if torch else []) + [requirement])


def _install(folder: Path, tool: str) -> list[str]:
    """The install command into `folder`'s venv, with torch held at this interpreter's version by the constraints
    `_make` wrote (a package that would change it fails instead of pulling another build)."""
    constraints = folder / _CONSTRAINTS
    python = str(folder / "bin" / "python")
    if tool == "uv":
        return ["uv", "pip", "install", "--python", python, "-c", str(constraints)]
    return [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q", "-c", str(constraints)]


def _installable(folder: Path, tool: str, packages: list[str]) -> list[str]:
    """Installs each package that a wheel can be had for (a package that needs building, such as flash-attn, is
    left to graphmode's placeholder); the ones installed."""
    installed = []
    for package in packages:
        done = subprocess.run(_install(folder, tool) + ["--only-binary=:all:", package.replace("_", "-")],
                              capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if done.returncode == 0:
            installed.append(package)
    return installed


def _run(command: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise EnvironmentMakeError(f"`{' '.join(command)}` did not run: {error}") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "it printed nothing").splitlines()[-3:]
        raise EnvironmentMakeError(f"`{' '.join(command)}` failed (exit {done.returncode}): {' '.join(said)}")


def _slug(requirement: str) -> str:
    return "".join(c if c.isalnum() or c == "." else "-" for c in requirement.removeprefix("transformers")).strip("-")


