"""The Python interpreter a target's model runs under, when it is not graphmode's own.

Remote code is written against one transformers release, and a zoo needs several at once: a target may name the
interpreter of a venv that has its release (graphmode.toml's `python`, a batch manifest's, `adapt --python`). Every
worker then runs there (runners.subprocess_run); graphmode itself, its agent and the batch keep this interpreter.

graphmode is not installed in that venv, and need not be: the workers import only `graphmode.runners` and torch.
A folder under GRAPHMODE_HOME holds a `graphmode/` namespace folder whose entries link to this installation's
subpackages, and that folder alone goes on the child's PYTHONPATH (never the checkout's top-level folders, whose
`agent` or `templates` would shadow a harness's own packages of those names).

Standard library only: the agent checks an interpreter before anything imports torch.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from graphmode.runners.measure.env_info import package_version

# What the workers need of the interpreter (pyproject.toml: requires-python, and torch's floor).
MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 6)
WORKER_MODULES = tuple(f"graphmode.runners.workers.{name}"
                       for name in ("verify_worker", "probe_worker", "evidence_worker", "battery_worker"))
_CHECK_TIMEOUT_S = 30.0

# Run in the named interpreter, so written for any Python 3 (an old one must still say which it is). It reads
# distributions' metadata and finds graphmode's worker modules; it imports neither torch nor transformers (each
# takes seconds), so the check stays well under a second.
_FACTS = r"""
import json, sys
facts = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable}
if sys.version_info >= (3, 8):
    from importlib import metadata, util
    for name in ("torch", "transformers"):
        try:
            facts[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            facts[name] = None
    missing = []
    for module in sys.argv[1:]:
        try:
            found = util.find_spec(module) is not None
        except Exception as error:
            found = False
        if not found:
            missing.append(module)
    facts["missing_modules"] = missing
print("graphmode-interpreter-facts: " + json.dumps(facts))
"""
_FACTS_PREFIX = "graphmode-interpreter-facts: "


class InterpreterError(ValueError):
    """The named interpreter cannot run graphmode's workers; the message says what is missing and how to fix it."""


@dataclass(frozen=True)
class Interpreter:
    """An interpreter that passed the check, with the releases the target's model will run on."""
    path: str  # absolute, as named: a venv's bin/python is a link to its base Python, and resolving it leaves the venv
    python: str
    torch: str
    transformers: str | None

    def to_dict(self) -> dict[str, str | None]:
        return {"executable": self.path, "python": self.python, "torch": self.torch,
                "transformers": self.transformers}


def release(version: str | None) -> tuple[int, ...]:
    """'4.41.2' -> (4, 41, 2); local and pre-release tails ('2.13.0+cpu', '5.0.0rc1') are cut; () for None."""
    numbers: list[int] = []
    for part in (version or "").split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:  # '0rc1': the pre-release counts as its release
            break
    return tuple(numbers)


def graphmode_home() -> Path:
    """graphmode's per-user folder (agent.home keeps the sessions there); GRAPHMODE_HOME moves it (tests, CI)."""
    return Path(os.environ.get("GRAPHMODE_HOME", Path.home() / ".graphmode"))


def _subpackage_folders() -> dict[str, Path]:
    """graphmode's top-level subpackages and the folders they are installed in (a checkout's, when editable); found,
    not imported. The workers need only `runners`; the others come along so that the folder mirrors the install."""
    from importlib.util import find_spec

    folders: dict[str, Path] = {}
    for name in ("runners", "transforms", "agent", "skills", "templates"):
        spec = find_spec(f"graphmode.{name}")
        if spec is not None and spec.submodule_search_locations:
            folders[name] = Path(next(iter(spec.submodule_search_locations))).resolve()
    return folders


def import_path() -> Path:
    """The folder to put on a foreign interpreter's PYTHONPATH: `graphmode/<subpackage>` links to this installation.

    One folder per installation (named by its paths), made once and atomically, so concurrent batch jobs share it."""
    folders = _subpackage_folders()
    digest = hashlib.sha256(json.dumps({k: str(v) for k, v in folders.items()}, sort_keys=True).encode())
    root = graphmode_home() / "import-path" / digest.hexdigest()[:16]
    if all((root / "graphmode" / name).exists() for name in folders):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root.parent))
    (staging / "graphmode").mkdir()
    for name, folder in folders.items():
        (staging / "graphmode" / name).symlink_to(folder, target_is_directory=True)
    try:
        staging.rename(root)
    except OSError:  # another process made it first: theirs is the same
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return root


# The interpreter the workers of this process run under: None is graphmode's own (sys.executable).
_current: str | None = None


def worker_python() -> str:
    return _current or sys.executable


@contextmanager
def running_under(path: str | None) -> Iterator[None]:
    """Workers started inside run under `path` (None: graphmode's own interpreter)."""
    global _current
    before, _current = _current, path
    try:
        yield
    finally:
        _current = before


def worker_environment(environment: dict[str, str]) -> dict[str, str]:
    """A worker's environment: under a foreign interpreter, graphmode's import folder first on PYTHONPATH."""
    if _current is None or _current == sys.executable:
        return environment
    paths = [str(import_path()), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    return {**environment, "PYTHONPATH": os.pathsep.join(paths)}


def _pip_hint(path: str, requirement: str) -> str:
    return f"`{path} -m pip install {requirement}`"


def _torch_requirement() -> str:
    own = package_version("torch")
    return f"torch=={'.'.join(map(str, release(own)))}" if own else "torch"


def check(named: str, said_by: str) -> Interpreter:
    """The interpreter `named` (by `said_by`, e.g. "--python"), checked in one short run of it: it exists, runs,
    is Python 3.10 or later, has torch, and finds graphmode's worker modules through the import folder. Anything
    missing is an InterpreterError naming it and the command that fixes it."""
    where = f"{said_by} {named}"
    path = _runnable_file(named, where)
    facts = _facts_of(path, where)
    _check_facts(facts, path, where)
    return Interpreter(path=str(path), python=facts["python"], torch=facts["torch"],
                       transformers=facts.get("transformers"))


def _runnable_file(named: str, where: str) -> Path:
    """The interpreter's path (a bare name looked up on PATH, symbolic links kept): an executable file."""
    path = Path(named).expanduser()
    if os.sep not in named and not path.exists():  # a bare name ("python3.10") is looked up on PATH
        import shutil

        found = shutil.which(named)
        path = Path(found) if found else path
    path = Path(os.path.abspath(path))  # symbolic links kept (Interpreter.path)
    if not path.exists():
        raise InterpreterError(f"{where}: no such file ({path}); name a Python interpreter, e.g. a venv's bin/python "
                               f"(`python -m venv DIR && DIR/bin/pip install {_torch_requirement()} transformers==X`)")
    if path.is_dir():
        raise InterpreterError(f"{where}: {path} is a folder; name its Python interpreter (e.g. {path}/bin/python)")
    if not os.access(path, os.X_OK):
        raise InterpreterError(f"{where}: {path} is not executable; name a Python interpreter")
    return path


def _facts_of(path: Path, where: str) -> dict:
    """What one short run of the interpreter says of itself (Python, torch, transformers, worker modules)."""
    try:
        done = subprocess.run([str(path), "-c", _FACTS, *WORKER_MODULES], capture_output=True, text=True,
                              env=worker_environment_for(str(path)), timeout=_CHECK_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InterpreterError(f"{where}: {path} did not run as a Python interpreter ({error})") from None
    line = next((printed for printed in done.stdout.splitlines() if printed.startswith(_FACTS_PREFIX)), None)
    if done.returncode != 0 or line is None:
        said = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["it printed nothing"])[-1]
        raise InterpreterError(f"{where}: {path} did not run as a Python interpreter ({said[:200]})")
    return json.loads(line[len(_FACTS_PREFIX):])


def _check_facts(facts: dict, path: Path, where: str) -> None:
    """Python and torch new enough, and graphmode's worker modules found."""
    if release(facts["python"]) < MIN_PYTHON:
        raise InterpreterError(f"{where}: {path} is Python {facts['python']}; graphmode's workers need Python "
                               f"{'.'.join(map(str, MIN_PYTHON))} or later: make the venv with a newer Python")
    if not facts.get("torch"):
        raise InterpreterError(f"{where}: {path} has no torch; install the one graphmode runs with: "
                               f"{_pip_hint(str(path), _torch_requirement())}")
    if release(facts["torch"]) < MIN_TORCH:
        raise InterpreterError(f"{where}: {path} has torch {facts['torch']}; graphmode's workers need torch "
                               f"{'.'.join(map(str, MIN_TORCH))} or later: "
                               f"{_pip_hint(str(path), _torch_requirement())}")
    if facts.get("missing_modules"):
        raise InterpreterError(f"{where}: {path} cannot find graphmode's worker modules "
                               f"({', '.join(facts['missing_modules'])}) through {import_path()}; graphmode's "
                               "installation is incomplete (reinstall graphmode where the graphmode command runs)")


def worker_environment_for(path: str) -> dict[str, str]:
    """The environment a worker under `path` gets (its import folder on PYTHONPATH)."""
    with running_under(path):
        return worker_environment(dict(os.environ))


def own_interpreter() -> Interpreter:
    """graphmode's own interpreter, described as a checked one is (read from this process: nothing is run)."""
    import platform

    return Interpreter(path=sys.executable, python=platform.python_version(), torch=package_version("torch") or "",
                       transformers=package_version("transformers"))
