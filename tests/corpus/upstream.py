"""A transformers release's own model tests, run on its original modeling file and on graphmode's adaptation.

A harness that drives one sequence greedily proves little about the model's other callers (beam search,
padding masks, `use_cache=False`, attention weights, two conversations at once). The release's own
`tests/models/<m>/test_modeling_<m>.py`, taken at the release's git tag, exercises them. This module runs
that file twice, the way upstream CI does (CPU, one worker, slow/GPU/pipeline tests skipped), once with
the release's untouched modeling file and once with graphmode's adapted file written over it, and
compares the outcomes test by test. The original's own results are the baseline: a test that already
fails there (old torch.fx tracer tests on a new torch, say) says nothing about graphmode.

What it needs, all kept under one cache folder (GRAPHMODE_CORPUS_CACHE), never in the repository:

    venv-<version>/      a venv of its own per release: torch==2.13.0, transformers==<version> and that
                         era's test dependencies, pinned (PINS); built once, its `pip freeze` kept
    tests-<version>/     the tag's tests/ folder and the repo-root files it imports (conftest.py,
                         setup.cfg, pyproject.toml, utils/), from `git archive v<version>`
    runs/<case>/<side>/  one run: a copy of tests-<version>, `src/transformers` (a copy of the venv's
                         package, for the adapted side with the modeling file swapped), junit.xml, log

The tests come from a git directory holding transformers' release tags (GRAPHMODE_UPSTREAM_GIT; the
PyPI sdist carries only the top-level tests/*.py, not tests/models/). Where only a history of `main` is at
hand (a fork that kept main but not the tags), GRAPHMODE_UPSTREAM_REFS names, per release, the commit on main
the release was branched from (`4.36.2=815ea8e8a2`: the parent of the commit that moved main to the next
dev version). That commit must be the release's own dev line (its __version__ is X.Y.0.dev0); its tests are
the release's minus the patch releases' fixes, and every record and failure says which commit it was.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

GIT_ENV_VAR = "GRAPHMODE_UPSTREAM_GIT"
REFS_ENV_VAR = "GRAPHMODE_UPSTREAM_REFS"
TORCH = "torch==2.13.0"  # never unpinned: an unpinned torch pulls a multi-GB CUDA build
SUITE_TIMEOUT_S = 3600

# Test dependencies common to every release here: pytest < 8 (the releases' setup.py pin it from 4.44 on and
# their conftest uses pytest 7's internals), numpy < 2 (these releases predate it), the decorators the test
# files import, pytest-timeout (upstream CI's PYTEST_TIMEOUT), and what datasets and the tokenizer tests need.
COMMON_PINS = (
    "pytest==7.4.4", "pytest-timeout==2.2.0", "numpy==1.26.4", "parameterized==0.9.0", "timeout-decorator==0.5.0",
    "psutil==5.9.8", "pandas==2.2.2", "pyarrow==16.1.0", "sentencepiece==0.2.0", "protobuf==4.25.3",
)
# Per release: accelerate and datasets of the release's time (a later datasets wants a huggingface-hub that
# the release's tokenizers pin refuses).
PINS = {
    # 4.26.1: later hubs lack set_access_token. Does not run yet: its testing_utils imports pkg_resources (gone
    # from setuptools 81), and a setuptools that has it conflicts with torch 2.13's own requirement.
    "4.26.1": ("accelerate==0.16.0", "datasets==2.9.0", "huggingface-hub==0.12.1"),
    "4.34.1": ("accelerate==0.24.1", "datasets==2.14.6"),
    "4.36.2": ("accelerate==0.25.0", "datasets==2.16.1"),
    "4.44.2": ("accelerate==0.33.0", "datasets==2.21.0"),
    "4.46.3": ("accelerate==1.1.1", "datasets==3.1.0"),
    "4.48.3": ("accelerate==1.3.0", "datasets==3.2.0"),
    "4.51.3": ("accelerate==1.6.0", "datasets==3.5.0"),
}
# Repo-root files the tests import or read (conftest.py puts src/ on sys.path; setup.cfg/pyproject.toml carry
# the pytest options upstream runs with).
ROOT_FILES = ("tests", "conftest.py", "setup.cfg", "pyproject.toml", "utils")


class UpstreamError(RuntimeError):
    """The suite cannot be run (no git dir, no tag, a venv that does not build); the message says why."""


def _run(command: list[str], *, timeout_s: float = 1800, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                          **kwargs)


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# -- the venv --------------------------------------------------------------------------------------
def pins(version: str) -> list[str]:
    """What the venv for `version` gets: torch, the release itself, its era's test dependencies."""
    if version not in PINS:
        raise UpstreamError(f"no test dependencies are pinned for transformers=={version} (known: {', '.join(PINS)})")
    return [TORCH, f"transformers=={version}", *COMMON_PINS, *PINS[version]]


def prepare_venv(version: str, root: Path) -> Path:
    """root/venv-VERSION, built once (its manifest upstream-venv.json records the pins and `pip freeze`).
    A venv of its own, because a release's tests need its era's pytest/numpy/datasets, which the project's
    own environment (transformers 5, pytest 8+, numpy 2) cannot have."""
    venv = root / f"venv-{version}"
    manifest = venv / "upstream-venv.json"
    wanted = pins(version)
    if manifest.is_file() and json.loads(manifest.read_text()).get("pins") == wanted:
        return venv
    if venv.exists():
        shutil.rmtree(venv)  # half built, or built with other pins
    done = _run([sys.executable, "-m", "venv", str(venv)])
    if done.returncode != 0:
        raise UpstreamError(f"python -m venv {venv} failed: {_tail(done.stderr)}")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q"]
    done = _run([*pip, *wanted])
    if done.returncode != 0:
        raise UpstreamError(f"pip install into {venv} failed: {_tail(done.stderr or done.stdout)}")
    freeze = _run([str(venv / "bin" / "python"), "-m", "pip", "freeze"]).stdout.split()
    manifest.write_text(json.dumps({"pins": wanted, "freeze": freeze}, indent=2))
    return venv


def venv_freeze(venv: Path) -> list[str]:
    return json.loads((venv / "upstream-venv.json").read_text())["freeze"]


def venv_package(venv: Path) -> Path:
    """The transformers package installed in the venv (the release itself)."""
    found = sorted(venv.glob("lib/python*/site-packages/transformers/__init__.py"))
    if not found:
        raise UpstreamError(f"{venv} has no transformers package")
    return found[0].parent


# -- the tag's tests -------------------------------------------------------------------------------
def git_dir() -> Path:
    """The git directory with transformers' release tags (GRAPHMODE_UPSTREAM_GIT)."""
    text = os.environ.get(GIT_ENV_VAR, "").strip()
    if not text:
        raise UpstreamError(f"set {GIT_ENV_VAR} to a git directory of transformers that has its release tags "
                            "(e.g. a `git clone --bare` of the repository): the PyPI sdist has no tests/models/")
    path = Path(text).expanduser().resolve()
    if not path.is_dir():
        raise UpstreamError(f"{GIT_ENV_VAR}={text}: no such directory")
    return path


def branch_points() -> dict[str, str]:
    """GRAPHMODE_UPSTREAM_REFS as {version: commit on main the release was branched from}."""
    refs = {}
    for item in os.environ.get(REFS_ENV_VAR, "").split():
        version, sep, commit = item.partition("=")
        if not sep or not commit:
            raise UpstreamError(f"{REFS_ENV_VAR}: {item!r} is not VERSION=COMMIT")
        refs[version] = commit
    return refs


def _version_at(git: Path, commit: str) -> str:
    init = _run(["git", f"--git-dir={git}", "show", f"{commit}:src/transformers/__init__.py"]).stdout
    found = re.search(r'^__version__ = "([^"]+)"', init, re.MULTILINE)
    return found.group(1) if found else ""


def tag_commit(git: Path, version: str) -> tuple[str, bool]:
    """The commit whose tests are run, and whether it is the release's tag. The tag vVERSION is checked to be
    that release (its __version__ says so); a branch point from GRAPHMODE_UPSTREAM_REFS, to be on the release's
    dev line (X.Y.0.dev0)."""
    done = _run(["git", f"--git-dir={git}", "rev-parse", "--verify", "-q", f"v{version}^{{commit}}"])
    if done.returncode == 0:
        commit = done.stdout.strip()
        if _version_at(git, commit) != version:
            raise UpstreamError(f"tag v{version} of {git} is not release {version} (its __version__ differs)")
        return commit, True
    ref = branch_points().get(version)
    if ref is None:
        raise UpstreamError(f"{git} has no tag v{version}, and {REFS_ENV_VAR} names no branch point for it")
    done = _run(["git", f"--git-dir={git}", "rev-parse", "--verify", "-q", f"{ref}^{{commit}}"])
    if done.returncode != 0:
        raise UpstreamError(f"{REFS_ENV_VAR}: {git} has no commit {ref}")
    commit = done.stdout.strip()
    dev = ".".join(version.split(".")[:2]) + ".0.dev0"
    if _version_at(git, commit) != dev:
        raise UpstreamError(f"{REFS_ENV_VAR}: {ref} is not on release {version}'s dev line (its __version__ is "
                            f"{_version_at(git, commit) or 'unknown'}, not {dev})")
    return commit, False


def extract_tests(version: str, root: Path, git: Path) -> Path:
    """root/tests-VERSION: the tag's tests/ and root files, extracted once per commit (pristine; runs copy it)."""
    dest = root / f"tests-{version}"
    manifest = dest / "upstream-tests.json"
    commit, tagged = tag_commit(git, version)
    if manifest.is_file() and json.loads(manifest.read_text()).get("commit") == commit:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    listed = _run(["git", f"--git-dir={git}", "ls-tree", "--name-only", commit]).stdout.split()
    paths = [p for p in ROOT_FILES if p in listed]
    archive = subprocess.run(["git", f"--git-dir={git}", "archive", commit, *paths], capture_output=True,
                             stdin=subprocess.DEVNULL)
    if archive.returncode != 0:
        raise UpstreamError(f"git archive v{version} failed: {archive.stderr.decode(errors='replace')[-500:]}")
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, capture_output=True)
    if untar.returncode != 0:
        raise UpstreamError(f"tar -x of v{version}'s tests failed: {untar.stderr.decode(errors='replace')[-500:]}")
    manifest.write_text(json.dumps({"version": version, "commit": commit, "tagged": tagged, "git": str(git),
                                    "paths": paths}))
    return dest


def tag_file(git: Path, commit: str, path: str) -> str:
    return _run(["git", f"--git-dir={git}", "show", f"{commit}:{path}"]).stdout


# -- the package under test ------------------------------------------------------------------------
HELPERS = "graphmode_static"  # the module of graphmode's helper code an adapted file imports, written beside it


def imports_graphmode(source: str) -> list[str]:
    """The import statements of `source` that name graphmode (an adapted file must stand alone)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [n for n in names if n == "graphmode" or n.startswith("graphmode.")]
    return found


def prepare_run(tests: Path, package: Path, run: Path, model: str, modeling: Path | None) -> Path:
    """run/: a fresh copy of the tag's tests tree whose `src/transformers` is a copy of the release's package,
    with `modeling` written over models/MODEL/modeling_MODEL.py when given (and graphmode_static.py, written beside
    `modeling`, where the modeling file imports it). The copy sits where conftest.py
    and tests/pipelines/test_pipelines_common.py look for the package (src/), and src/ goes first on
    PYTHONPATH, so every import of `transformers` in the run is the copy under test."""
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(tests, run, symlinks=True, ignore=shutil.ignore_patterns("upstream-tests.json"))
    copy = run / "src" / "transformers"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if modeling is not None:
        source = modeling.read_text(encoding="utf-8")
        if imports_graphmode(source):
            raise UpstreamError(f"{modeling} imports {imports_graphmode(source)}: an adapted file must stand alone")
        target = copy / "models" / model / f"modeling_{model}.py"
        if not target.is_file():
            raise UpstreamError(f"the package has no models/{model}/modeling_{model}.py to replace")
        target.write_text(source, encoding="utf-8")
        levels = [n.level for n in ast.parse(source).body if isinstance(n, ast.ImportFrom) and n.module == HELPERS]
        if levels:
            helpers = modeling.with_name(f"{HELPERS}.py")
            if not helpers.is_file():
                raise UpstreamError(f"{modeling} imports {HELPERS}, which graphmode did not write beside it")
            # Beside the modeling file for a relative import; a plain one finds it in src/, first on PYTHONPATH.
            shutil.copyfile(helpers, (target.parent if levels[0] else copy.parent) / helpers.name)
    return run


def ci_env(venv: Path, run: Path, root: Path) -> dict[str, str]:
    """Upstream CI's environment for a CPU job (.circleci/create_circleci_config.py: OMP_NUM_THREADS=1,
    TRANSFORMERS_IS_CI, PYTEST_TIMEOUT=120, RUN_PIPELINE_TESTS=False), offline, no GPU, RUN_SLOW unset. Built
    from scratch, so nothing of the project's environment (PYTHONPATH, its transformers) leaks in."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(run / "src"),
        "VIRTUAL_ENV": str(venv),
        "HF_HOME": str(root / "hf-home"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "RUN_PIPELINE_TESTS": "False",
        "TRANSFORMERS_IS_CI": "True",
        "PYTEST_TIMEOUT": "120",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }


# -- running and comparing -------------------------------------------------------------------------
@dataclass
class Outcome:
    status: str  # passed, failed, error, skipped
    message: str = ""


@dataclass
class SuiteRun:
    command: list[str]
    returncode: int
    seconds: float
    log: Path
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for outcome in self.outcomes.values():
            counts[outcome.status] += 1
        return counts


def first_error_lines(element: ET.Element, lines: int = 6) -> str:
    """The `E   ...` lines of a junit failure/error (pytest's own summary of the exception), else its message."""
    text = element.text or ""
    kept = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    if not kept:
        kept = [line.strip() for line in (element.get("message") or text).splitlines() if line.strip()]
    return "\n".join(kept[:lines])


def parse_junit(path: Path) -> dict[str, Outcome]:
    """test id (module.Class::name) -> outcome, from pytest's --junitxml report."""
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome = Outcome("passed")
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                status = {"failure": "failed"}.get(kind, kind)
                outcome = Outcome(status,
                                  first_error_lines(element) if kind != "skipped" else element.get("message", ""))
                break
        # A test that passed and then errored in teardown is reported twice: keep the worse.
        if test_id not in outcomes or outcomes[test_id].status in ("passed", "skipped"):
            outcomes[test_id] = outcome
    return outcomes


def run_suite(venv: Path, run: Path, model: str, root: Path, timeout_s: float = SUITE_TIMEOUT_S) -> SuiteRun:
    """pytest on tests/models/MODEL/test_modeling_MODEL.py in `run`, one worker, as upstream CI runs it."""
    test_file = f"tests/models/{model}/test_modeling_{model}.py"
    if not (run / test_file).is_file():
        raise UpstreamError(f"the tag has no {test_file}")
    junit = run / "junit.xml"
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
               f"--junitxml={junit}", test_file]
    log = run / "pytest.log"
    started = time.monotonic()
    try:
        done = _run(command, cwd=run, env=ci_env(venv, run, root), timeout_s=timeout_s)
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        returncode = 124
        output = ((expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes)
                  else str(expired.stdout or ""))
    seconds = round(time.monotonic() - started, 1)
    log.write_text(output, encoding="utf-8")
    result = SuiteRun(command, returncode, seconds, log)
    if junit.is_file():
        result.outcomes = parse_junit(junit)
    if not result.outcomes:
        raise UpstreamError(f"pytest ran no test (exit {returncode}, log {log}):\n{_tail(output, 15)}")
    return result


@dataclass
class Comparison:
    regressions: dict[str, tuple[Outcome, Outcome]]  # passed on the original, not on the adapted file
    other: dict[str, tuple[Outcome | None, Outcome | None]]  # any other difference (adapted-only passes, ...)

    def summary(self, limit: int = 60) -> str:
        lines = []
        for test_id, (_, adapted) in list(self.regressions.items())[:limit]:
            first = adapted.message.splitlines()[:3] if adapted.message else []
            lines.append(f"{test_id}: passed -> {adapted.status}" + "".join(f"\n    {line}" for line in first))
        if len(self.regressions) > limit:
            lines.append(f"... and {len(self.regressions) - limit} more")
        return "\n".join(lines)


def compare(original: SuiteRun, adapted: SuiteRun) -> Comparison:
    """Test by test. The requirement is one-sided: every test the original passes passes on the adapted file
    (a test missing on the adapted side, e.g. its module no longer imports, counts as not passing)."""
    regressions, other = {}, {}
    for test_id in sorted(set(original.outcomes) | set(adapted.outcomes)):
        before, after = original.outcomes.get(test_id), adapted.outcomes.get(test_id)
        if before is not None and before.status == "passed" and (after is None or after.status != "passed"):
            regressions[test_id] = (before, after or Outcome("missing", "not in the adapted run's report"))
        elif (before.status if before else None) != (after.status if after else None):
            other[test_id] = (before, after)
    return Comparison(regressions, other)


# -- one case --------------------------------------------------------------------------------------
@dataclass
class CaseResult:
    case: str
    test_file: str
    commit: str
    tagged: bool  # False: the tests are main's at the release's branch point (GRAPHMODE_UPSTREAM_REFS)
    original: SuiteRun
    adapted: SuiteRun
    comparison: Comparison
    freeze: list[str]

    def record(self) -> dict:
        """One JSON-able line for the findings table."""
        return {
            "case": self.case, "test_file": self.test_file, "tests_commit": self.commit,
            "tests_at": "tag" if self.tagged else "branch point on main",
            "original": {**self.original.counts(), "seconds": self.original.seconds, "exit": self.original.returncode},
            "adapted": {**self.adapted.counts(), "seconds": self.adapted.seconds, "exit": self.adapted.returncode},
            "regressions": {k: {"adapted": a.status, "error": a.message}
                            for k, (_, a) in self.comparison.regressions.items()},
            "other_differences": {k: [b.status if b else None, a.status if a else None]
                                  for k, (b, a) in self.comparison.other.items()},
            "command": " ".join(self.original.command[1:]),
            "freeze": self.freeze,
        }


def run_case(version: str, model: str, adapted_modeling: Path, root: Path, case_slug: str) -> CaseResult:
    """Both sides of one case: the venv and the tag's tests (built once per release), then the suite on the
    untouched package and on the package with `adapted_modeling` swapped in."""
    git = git_dir()
    venv = prepare_venv(version, root)
    tests = extract_tests(version, root, git)
    extracted = json.loads((tests / "upstream-tests.json").read_text())
    commit, tagged = extracted["commit"], extracted.get("tagged", True)
    package = venv_package(venv)
    # The wheel is the tag: its modeling file is the tag's src/ file, byte for byte. A branch point's may
    # differ by the patch releases' fixes; the wheel's file is the one both sides run.
    relative = f"models/{model}/modeling_{model}.py"
    tagged_text = tag_file(git, commit, f"src/transformers/{relative}") if tagged else None
    if tagged and (package / relative).read_text(encoding="utf-8") != tagged_text:
        raise UpstreamError(f"transformers=={version}'s {relative} differs from tag v{version}'s")
    runs = root / "runs" / case_slug
    original = run_suite(venv, prepare_run(tests, package, runs / "original", model, None), model, root)
    if not original.counts()["passed"]:
        # Nothing to compare (a collection error, say): saying "no regressions" would prove nothing.
        raise UpstreamError(f"the original passes no test ({original.counts()}; log {original.log}):\n"
                            + "\n".join(o.message for o in original.outcomes.values() if o.message)[:1500])
    adapted = run_suite(venv, prepare_run(tests, package, runs / "adapted", model, adapted_modeling), model, root)
    return CaseResult(f"transformers=={version}:{model}", f"tests/models/{model}/test_modeling_{model}.py", commit,
                      tagged, original, adapted, compare(original, adapted), venv_freeze(venv))


def cache_root(default: Path) -> Path:
    """GRAPHMODE_CORPUS_CACHE (shared with the corpus tests: the wheels and sites are reused), else `default`."""
    text = os.environ.get("GRAPHMODE_CORPUS_CACHE")
    root = Path(text).expanduser().resolve() if text else default
    root.mkdir(parents=True, exist_ok=True)
    return root


def upstream_dir(root: Path) -> Path:
    path = root / "upstream"
    path.mkdir(parents=True, exist_ok=True)
    return path


def case_slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)
