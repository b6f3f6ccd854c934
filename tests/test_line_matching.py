"""line_matching pairs the lines difflib pairs.

The edits' line numbers in designs and reports are carried through difflib's matching of each text the chain
writes with the one before, and of the original with the output; which of two equal lines is paired decides them.
line_matching finds difflib's longest runs by sampling lines instead of reading every equal pair, so it is held
here to `difflib.SequenceMatcher(None, a, b, autojunk=False)` on the texts the chain writes on the bundled
example models, on every codemod fixture's input and output, and on edited sequences full of repeated items, where the
order among equally long runs decides.
"""
from __future__ import annotations

import difflib
import random
from pathlib import Path

import pytest

from graphmode.transforms.line_matching import carried_numbers, matching_blocks
from graphmode.transforms.pipeline import adapt_source
from test_codemods import CASES, options_for

ROOT = Path(__file__).parents[1]
MODELS = sorted((ROOT / "examples").glob("*/model.py"))


def _difflib_pairs(a: list, b: list) -> set[tuple[int, int]]:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return {(i + offset, j + offset) for i, j, size in matcher.get_matching_blocks() for offset in range(size)}


def _pairs(a: list, b: list) -> set[tuple[int, int]]:
    return {(i + offset, j + offset) for i, j, size in matching_blocks(a, b) for offset in range(size)}


def _chain_texts(path: Path) -> list[str]:
    """The original, the text the chain has written after each codemod that changed it (the chain cut after that
    one: the static view is the last text the codemods wrote), and the output."""
    source, options = path.read_text(), options_for(path)
    whole = adapt_source(source, path.name, None, options)
    texts = [source]
    for end in range(1, len(whole.applied) + 1):
        cut = adapt_source(source, path.name, set(whole.applied[:end]), options)
        texts.append(cut.static_view or cut.adapted)
    return [*texts, whole.adapted]


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.parent.name)
def test_chain_texts_are_paired_as_difflib_pairs_them(path):
    texts = _chain_texts(path)
    assert len(set(texts)) > 3, "the chain rewrites each bundled model in several steps"
    for old, new in [*zip(texts, texts[1:]), (texts[0], texts[-1])]:
        a, b = old.splitlines(), new.splitlines()
        assert _pairs(a, b) == _difflib_pairs(a, b)


def test_fixture_inputs_and_outputs_are_paired_as_difflib_pairs_them():
    changed = 0
    for case in CASES:
        a = case.read_text().splitlines()
        b = case.with_name(case.name.replace(".in.py", ".out.py")).read_text().splitlines()
        changed += a != b
        assert _pairs(a, b) == _difflib_pairs(a, b), case.name
    assert changed > len(CASES) / 2  # the others: cases a codemod leaves as they were


def test_edited_sequences_are_paired_as_difflib_pairs_them():
    """Runs of a few kinds of item, some edited and some copied elsewhere: many equally long runs to choose from."""
    rng = random.Random(20261205)
    for _ in range(600):
        kinds = rng.choice([2, 3, 6, 50])
        a = [rng.randrange(kinds) if rng.random() < 0.5 else rng.randrange(3) for _ in range(rng.randint(0, 300))]
        b = list(a)
        for _ in range(rng.randint(0, 10)):
            at, length = rng.randint(0, len(b)), rng.randint(1, 30)
            edit = rng.random()
            if edit < 0.3:
                b[at:at] = [rng.randrange(kinds + 2) for _ in range(length)]
            elif edit < 0.5:
                del b[at:at + length]
            elif edit < 0.8 and a:
                start = rng.randrange(len(a))
                b[at:at] = a[start:start + length * 2]
            else:
                b[at:at + 5] = [item + 1 for item in b[at:at + 5]]
        assert _pairs(a, b) == _difflib_pairs(a, b), (a, b)


def test_carried_numbers_follow_the_pairs():
    old = ["def f(x):", "", "    return x", "", "", "def g(y):", "    return y", ""]
    new = ["import torch", "def f(x):", "", "    y = x", "    return y", "", "", "def g(y):", "    return y", ""]
    numbers = [10 * (index + 1) for index in range(len(old))]
    expected = [None] * len(new)
    for i, j in _difflib_pairs(old, new):
        expected[j] = numbers[i]
    assert carried_numbers(old, new, numbers) == expected
    assert expected.count(None) == 3
