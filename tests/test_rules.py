"""Each rule against its fixture: a source file and the findings expected in it (TorchFix style)."""
from pathlib import Path

import pytest

from graphmode.transforms.rules import RULES, scan_source
from graphmode.transforms.scan import may_fix

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


def test_the_fixers_read_from_the_codemods_source_are_the_imported_chain():
    """The scan reads NAME and FIXES from the codemods' source (it must not import libcst); that reading must
    match the codemods as Python sees them, and every code a codemod fixes must be a rule's."""
    from graphmode.transforms.codemods import CHAIN

    for rule in RULES:
        assert may_fix(rule.CODE) == tuple(c.NAME for c in CHAIN if rule.CODE in c.FIXES), rule.CODE
    assert {code for codemod in CHAIN for code in codemod.FIXES} <= {rule.CODE for rule in RULES}


def test_what_the_trace_can_say_of_a_rule_is_stated_on_the_rule_and_names_only_rules():
    from graphmode.runners.evidence.findings import TRACED_CODES

    codes = {rule.CODE for rule in RULES}
    assert TRACED_CODES == {rule.CODE for rule in RULES if rule.TRACED}
    for rule in RULES:
        assert rule.EXPLAINED_BY <= codes, rule.CODE
        if rule.TRACED:  # a finding the trace makes is explained at least by a static finding of its own code
            assert rule.CODE in rule.EXPLAINED_BY, rule.CODE


def test_each_rule_module_holds_one_rule_named_by_its_file_and_listed_in_the_docs():
    import inspect

    import re

    docs = (Path(__file__).parents[1] / "docs" / "rules.md").read_text()
    listed = {int(n) for n in re.findall(r"GM(\d{3})", docs)}
    listed |= {n for low, high in re.findall(r"GM(\d{3})–GM(\d{3})", docs) for n in range(int(low), int(high) + 1)}
    modules = sorted(p.stem for p in (Path(__file__).parents[1] / "transforms" / "rules").rglob("gm[0-9]*.py"))
    assert [Path(inspect.getfile(rule)).stem for rule in RULES] == modules
    for rule in RULES:
        assert Path(inspect.getfile(rule)).stem.startswith(rule.CODE.lower() + "_"), rule.CODE
        assert int(rule.CODE[2:]) in listed, f"{rule.CODE} is missing from the Rules table in docs/rules.md"
