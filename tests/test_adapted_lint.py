"""Adapted code reads as a person would write it: a linter finds nothing in it that the original did not have.

ruff (pyflakes' checks) runs over the original and the adapted text of every codemod fixture pair and of the
bundled examples adapted by the whole chain. A finding of the adapted text that the original does not have (an
unused local, import or constant left by a rewrite; a syntax error) fails. Fixture pairs run one codemod alone, so
a name a later codemod of the chain defines (`input_pos`) is not a finding there; the examples run the whole chain
and are held to every check.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "codemods"
EXAMPLES = ROOT / "examples"
PAIRS = sorted(p for p in FIXTURES.glob("*/*.in.py") if p.with_name(p.name.replace(".in.py", ".out.py")).exists())


def _ruff() -> list[str]:
    try:
        import ruff  # noqa: F401  (only whether the module is there)
        return [sys.executable, "-m", "ruff"]
    except ImportError:
        found = shutil.which("ruff")
        if found is None:
            pytest.skip("ruff is not installed (pip install -e '.[dev]')")
        return [found]


def findings(text: str, name: str, ignore: tuple[str, ...] = ()) -> Counter:
    """ruff's pyflakes findings in `text`, as (code, message) with their counts: lines move when code is added."""
    command = [*_ruff(), "check", "--isolated", "--no-cache", "--select", "F,E9", "--output-format", "json",
               "--stdin-filename", name, "-"]
    if ignore:
        command += ["--ignore", ",".join(ignore)]
    done = subprocess.run(command, input=text, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return Counter((f["code"], f["message"]) for f in json.loads(done.stdout))


@pytest.mark.parametrize("case", PAIRS, ids=lambda p: f"{p.parent.name}/{p.name.removesuffix('.in.py')}")
def test_a_fixture_output_has_no_lint_finding_its_input_lacks(case):
    out = case.with_name(case.name.replace(".in.py", ".out.py"))
    new = findings(out.read_text(), out.name, ignore=("F821",)) - findings(case.read_text(), case.name)
    assert not new, f"{out.name}: {dict(new)}"


@pytest.mark.parametrize(("example", "entry_class"), [
    ("legacy_llm", "Transformer"), ("meta_llama", "Transformer"), ("hf_cache_api", "ForCausalLM"),
])
def test_an_example_adapted_by_the_whole_chain_has_no_new_lint_finding(example, entry_class):
    for source in sorted((EXAMPLES / example).glob("*.py")):
        if source.name == "harness.py":
            continue
        text = source.read_text()
        adapted = adapt_source(text, source.name, None, Options(entry_class=entry_class)).adapted
        new = findings(adapted, source.name) - findings(text, source.name)
        assert not new, f"{example}/{source.name}: {dict(new)}"


def test_the_check_sees_an_unused_local():
    # The check itself is live: the finding it exists to catch is found.
    assert findings("def f(x):\n    y = x.shape[0]\n    return x\n", "probe.py")[
        ("F841", "Local variable `y` is assigned to but never used")] == 1
