"""Adapted code reads as a person would write it: a linter finds nothing in it that the original did not have.

ruff (pyflakes' checks) runs over the original and the adapted text of every codemod fixture pair and of the
bundled examples adapted by the whole chain. A finding of the adapted text that the original does not have (an
unused local, import or constant left by a rewrite; a syntax error) fails, and so does a line longer than the
original's longest (at least 79: E501 at that limit; a model's own line that a rewrite only indented further
keeps its text). Fixture pairs run one codemod alone, so a name a later codemod of the chain defines (`input_pos`)
is not a finding there; the examples run the whole chain and are held to every check. The test bed's cases are held
to the same (tests/test_corpus.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from lint_findings import findings, own_limit, too_long

from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "codemods"
EXAMPLES = ROOT / "examples"
PAIRS = sorted(p for p in FIXTURES.glob("*/*.in.py") if p.with_name(p.name.replace(".in.py", ".out.py")).exists())


@pytest.mark.parametrize("case", PAIRS, ids=lambda p: f"{p.parent.name}/{p.name.removesuffix('.in.py')}")
def test_a_fixture_output_has_no_lint_finding_its_input_lacks(case):
    out = case.with_name(case.name.replace(".in.py", ".out.py"))
    new = findings(out.read_text(), out.name, ignore=("F821",)) - findings(case.read_text(), case.name)
    assert not new, f"{out.name}: {dict(new)}"
    assert too_long(out.read_text(), own_limit(case.read_text()), case.read_text()) == [], out.name


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
        assert too_long(adapted, own_limit(text), text) == [], f"{example}/{source.name}"


def test_the_length_check_sees_a_line_past_the_files_own_limit():
    original = "x = 1\n" + "y = " + "1 + " * 22 + "1\n"  # 93 columns: the limit
    assert own_limit(original) == 93 and too_long(original, 93) == []
    assert too_long(original + "z = " + "2 + " * 23 + "2\n", own_limit(original)) == [3]
    # The model's own long line, moved into a guard by a rewrite, is its own text: not counted.
    guarded = original + "if not torch.compiler.is_compiling():\n    " + original.splitlines()[1] + "\n"
    assert too_long(guarded, 93, original) == [] and too_long(guarded, 93) == [4]


def test_the_check_sees_an_unused_local():
    # The check itself is live: the finding it exists to catch is found.
    assert findings("def f(x):\n    y = x.shape[0]\n    return x\n", "probe.py")[
        ("F841", "Local variable `y` is assigned to but never used")] == 1
