"""Every rule against the examples it declares (Fixit style): each VALID snippet, scanned as a file of its own by
the real scan, has no finding of the rule's code, and each INVALID one has at least one."""
from __future__ import annotations

import textwrap

import pytest

from graphmode.transforms.rules import RULES, scan_source
from graphmode.transforms.rules.base import Rule


def _examples() -> list:
    return [
        pytest.param(rule, kind == "INVALID", snippet, id=f"{rule.CODE}-{kind.lower()}-{index}")
        for rule in RULES
        for kind in ("VALID", "INVALID")
        for index, snippet in enumerate(getattr(rule, kind, ()))
    ]


@pytest.mark.parametrize(("rule", "reported", "snippet"), _examples())
def test_rule_reports_exactly_its_invalid_examples(rule: type[Rule], reported: bool, snippet: str) -> None:
    source = textwrap.dedent(snippet)
    codes = [f.code for f in scan_source(source, "example.py")]
    assert (rule.CODE in codes) is reported, f"{rule.CODE} {'missed' if reported else 'reported'}:\n{source}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.CODE)
def test_every_rule_declares_examples_of_both_kinds(rule: type[Rule]) -> None:
    for kind in ("VALID", "INVALID"):
        examples = getattr(rule, kind, ())
        assert isinstance(examples, tuple) and examples, (rule.CODE, kind)
        assert all(isinstance(snippet, str) and snippet.strip() for snippet in examples), (rule.CODE, kind)
