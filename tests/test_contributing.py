"""CONTRIBUTING.md against the code as it stands: what it says a rule, a codemod and a backend set is what their
base classes declare, and the files it names exist. That each rule and each backend is one module the package finds
by itself is checked in test_rules.py and test_npu_backends.py; a codemod's one line is its place in CHAIN."""
from __future__ import annotations

import inspect
import pkgutil
import re
from pathlib import Path

import pytest

from graphmode.runners.backends import Backend, registered
from graphmode.transforms import codemods
from graphmode.transforms.codemods import CHAIN, GraphCodemod
from graphmode.transforms.rules.base import Rule

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "CONTRIBUTING.md").read_text()


def section(title: str) -> str:
    start = TEXT.index(f"## {title}")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start:end if end > 0 else None]


def named(text: str) -> set[str]:
    """Every identifier the text quotes in backticks (`NAME`, `available()`, `IDIOM_IN_ONE_FUNCTION = True`)."""
    return {word for quoted in re.findall(r"`([^`]+)`", text) for word in re.findall(r"[A-Za-z_]\w*", quoted)}


def declared(cls: type) -> set[str]:
    """The class attributes a base class declares for its subclasses to set (its annotations)."""
    return set(inspect.get_annotations(cls))


@pytest.mark.parametrize(("title", "base"), [("Add a rule", Rule), ("Add a codemod", GraphCodemod),
                                              ("Add a backend", Backend)])
def test_each_attribute_a_base_class_declares_is_named_in_its_section(title, base):
    missing = declared(base) - named(section(title))
    assert not missing, f"CONTRIBUTING's '{title}' does not name {sorted(missing)} of {base.__name__}"


def test_each_method_a_backend_overrides_is_named_in_the_backend_section():
    overridden = {name for backend in registered() for name, value in vars(type(backend)).items()
                  if callable(value) and not name.startswith("__") and hasattr(Backend, name)}
    assert overridden, "no backend overrides anything: the check would say nothing"
    assert overridden <= named(section("Add a backend")), overridden - named(section("Add a backend"))


def test_every_file_the_page_names_exists():
    paths = {quoted for quoted in re.findall(r"`([\w./-]+\.(?:py|md|toml))`", TEXT)
             if "/" in quoted and not re.search(r"NNN|<|name\.py", quoted)}
    assert paths, "the page names no files: the check would say nothing"
    assert [path for path in sorted(paths) if not (ROOT / path).exists()] == []


def test_every_codemod_module_is_one_codemod_with_its_place_in_the_chain():
    """Grouped by the idiom they rewrite (codemods/<idiom>/<name>.py); lib/ is what they share, never a codemod."""
    modules = [m.name for m in pkgutil.walk_packages(codemods.__path__, codemods.__name__ + ".")
               if not m.ispkg and m.name.count(".") == 4 and ".lib." not in m.name]
    assert modules, "no codemod module found: the check would say nothing"
    by_module = {}
    for codemod in CHAIN:
        by_module.setdefault(codemod.__module__, []).append(codemod.NAME)
    assert sorted(by_module) == sorted(modules), set(modules) ^ set(by_module)
    assert all(len(names) == 1 for names in by_module.values()), by_module



def test_readme_starts_with_the_set_up_and_run_then_the_test_command_and_says_what_the_first_run_costs():
    """README's first two commands are what a new user pastes (and .ci/run runs the second): the set-up with a run,
    then the tests; the text under them says how long the run takes, and how to make a quicker first one."""
    readme = (ROOT / "README.md").read_text()
    start = readme.split("## Start here", 1)[1].split("\n## ", 1)[0]
    first, second = re.findall(r"```bash\n(.*?)\n```", start, re.S)[:2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert first.endswith("&& graphmode adapt examples/legacy_llm --yes --backend inductor")
    install, tests = second.split(" && ")
    assert first.startswith(install + " && ") and tests in ci
    said = " ".join(start.split("```")[-1].split())  # the prose after the commands, its lines joined
    assert re.search(r"about \d+ to \d+ minutes on a 2-core machine", said) and "`--runs 1`" in said


def test_the_architecture_page_names_every_package_and_only_files_that_exist():
    """docs/architecture.md: every sub-package of the layout's folders has its line in the tree, and every file it
    names in backticks exists; CONTRIBUTING points to it."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    packages = {str(init.parent.relative_to(ROOT)) for folder in ("agent", "transforms", "runners")
                for init in (ROOT / folder).rglob("__init__.py") if init.parent != ROOT / folder}
    tree = page.split("## The tree")[1].split("\n## ")[0]
    listed, parents = set(), {}
    for line in tree.splitlines():  # a folder per line, two spaces deeper than the folder it is in
        folder = re.match(r"^( *)([\w-]+)/", line)
        if folder:
            depth = len(folder.group(1)) // 2
            parents[depth] = folder.group(2)
            listed.add("/".join(parents[level] for level in range(depth + 1)))
    assert packages <= listed, sorted(packages - listed)
    paths = {quoted for quoted in re.findall(r"`([\w./-]+\.py)`", page) if "/" in quoted and "NNN" not in quoted}
    assert paths and [path for path in sorted(paths) if not (ROOT / path).exists()] == []
    assert "docs/architecture.md" in TEXT
