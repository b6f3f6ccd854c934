"""Each rule against its fixture: a source file and the findings expected in it (TorchFix style)."""
from pathlib import Path

import pytest

from graphmode.transforms.rules import RULES, scan_source

FIXTURES = Path(__file__).parent / "fixtures" / "rules"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.CODE)
def test_rule_matches_its_fixture(rule):
    source = FIXTURES / f"{rule.CODE}.py"
    expected = (FIXTURES / f"{rule.CODE}.txt").read_text().split()
    found = [f for f in scan_source(source.read_text(), source.name) if f.code == rule.CODE]
    assert [x for f in found for x in (f"{f.line}:{f.column}", f.code)] == expected
    assert all(f.skill == rule.SKILL and f.message for f in found)


def test_every_rule_has_a_fixture_and_a_skill():
    skills = {p.stem for p in (Path(__file__).parents[1] / "skills").glob("*.md")}
    for rule in RULES:
        assert (FIXTURES / f"{rule.CODE}.py").is_file(), rule.CODE
        assert rule.SKILL in skills, rule.SKILL


def test_scan_of_the_bundled_example_finds_its_hazard_kinds_and_only_those():
    source = Path(__file__).parents[1] / "examples" / "legacy_llm" / "model.py"
    codes = {f.code for f in scan_source(source.read_text(), "model.py")}
    assert codes == {"GM101", "GM201", "GM301", "GM401", "GM501"}


def test_rules_and_codemods_agree_on_what_fixes_what():
    from graphmode.transforms.codemods import CODEMODS

    for rule in RULES:
        for name in rule.FIXED_BY:
            assert rule.CODE in CODEMODS[name].FIXES, (rule.CODE, name)
    for name, codemod in CODEMODS.items():
        for code in codemod.FIXES:
            assert name in next(r for r in RULES if r.CODE == code).FIXED_BY, (name, code)
