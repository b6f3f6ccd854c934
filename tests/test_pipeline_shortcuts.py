"""The codemod chain's shortcuts change nothing but its speed.

The chain skips a codemod whose `may_apply` says the text cannot hold its idiom, generates no text for a codemod
that recorded no edit, walks past function bodies a codemod has no handler for, computes positions one
top-level statement at a time, and parents from the nodes' fields. Each is checked here against the slow way, on every fixture of every codemod and on
the bundled examples: a codemod run in full on a text it would be skipped for does nothing there, one that
recorded no edit returns the text unchanged, and the positions and parents equal libcst's own.
"""
from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from graphmode.transforms.codemods import CHAIN
from graphmode.transforms.cstutil import UNWALKED, walk
from graphmode.transforms.parsed import ParsedSource
from test_codemods import CASES, options_for

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*/*.py") if p.name != "harness.py")
SOURCES = [*CASES, *EXAMPLES]


def _ids(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


@pytest.mark.parametrize("path", SOURCES, ids=_ids)
def test_skipped_codemods_would_do_nothing_and_unedited_text_is_unchanged(path):
    source = path.read_text()
    options = options_for(path)
    for codemod_class in CHAIN:
        parsed = ParsedSource(source)
        own = path.parent.name == codemod_class.NAME or path in EXAMPLES
        if not own and codemod_class.may_apply(parsed, options):
            continue  # the chain runs it in full anyway: test_codemod_properties covers that
        codemod = codemod_class(CodemodContext(filename=path.name), options)
        code = codemod.transform_source(parsed).code
        if not codemod_class.may_apply(parsed, options):
            assert (code, codemod.edits, codemod.manual) == (source, [], []), \
                f"{codemod_class.NAME} is skipped on {path.name} but changes or reports something there"
        if not codemod.edits:
            assert code == source, f"{codemod_class.NAME} changed {path.name} without recording an edit"


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::8]], ids=_ids)
def test_positions_and_parents_equal_libcsts(path):
    parsed = ParsedSource(path.read_text())
    wrapper = MetadataWrapper(parsed.module, unsafe_skip_copy=True)
    parents = wrapper.resolve(ParentNodeProvider)
    assert len(parsed.parents) == len(parents) and all(parsed.parents[n] is p for n, p in parents.items())
    whole = wrapper.resolve(PositionProvider)
    checked = 0
    for node, expected in whole.items():
        if node is parsed.module:
            continue
        found = parsed.positions[node]
        assert (found.start, found.end) == (expected.start, expected.end), type(node).__name__
        checked += 1
    assert checked > 100


class _Visited(cst.CSTVisitor):
    def __init__(self) -> None:
        self.order: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if not isinstance(node, UNWALKED):  # whitespace and punctuation
            self.order.append(node)
        return True


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::8]], ids=_ids)
def test_walk_visits_what_a_visitor_visits_in_its_order(path):
    module = cst.parse_module(path.read_text())
    visited = _Visited()
    module.visit(visited)
    walked = list(walk(module))
    assert len(walked) == len(visited.order) > 50
    assert all(a is b for a, b in zip(walked, visited.order))
