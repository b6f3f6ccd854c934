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


# What each rule declared in its own FIXED_BY before the codemods' FIXES became the one statement of which codemod
# fixes which rule: a regression guard, so that deriving the mapping changed none of it. Only the order differs
# (the derived one is the order the codemods run in), so the codemods are compared as sets.
DECLARED_FIXERS: dict[str, tuple[str, ...]] = {
    "GM101": ("hoist_item", "static_rotary", "host_scalars", "scalar_arguments"),
    "GM104": ("hoist_item",),
    "GM201": ("static_rotary", "static_mask", "static_positions", "cache_object", "carried_cache"),
    "GM301": ("static_kv_cache", "cache_object", "carried_cache"),
    "GM302": ("sliced_tables", "sliced_kv_cache", "carried_cache"),
    "GM303": ("cache_object",),
    "GM401": ("static_rotary", "static_mask", "split_decode"),
    "GM402": ("tensor_branches", "hoist_item"),
    "GM501": ("static_positions",),
    "GM502": ("cache_object",),
    "GM602": ("hoist_item",),
}


def test_the_codemods_that_fix_each_rule_are_the_ones_the_rules_declared():
    from graphmode.transforms.codemods import CHAIN

    order = [codemod.NAME for codemod in CHAIN]
    for rule in RULES:
        fixers = may_fix(rule.CODE)
        assert set(fixers) == set(DECLARED_FIXERS.get(rule.CODE, ())), rule.CODE
        assert list(fixers) == sorted(fixers, key=order.index), rule.CODE


def test_the_fixers_read_from_the_codemods_source_are_the_imported_chain():
    """The scan reads NAME and FIXES from the codemods' source (it must not import libcst); that reading must
    match the codemods as Python sees them, and every code a codemod fixes must be a rule's."""
    from graphmode.transforms.codemods import CHAIN

    for rule in RULES:
        assert may_fix(rule.CODE) == tuple(c.NAME for c in CHAIN if rule.CODE in c.FIXES), rule.CODE
    assert {code for codemod in CHAIN for code in codemod.FIXES} <= {rule.CODE for rule in RULES}
