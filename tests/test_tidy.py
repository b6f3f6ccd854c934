"""The tidy pass: what graphmode's own functions no longer read goes; the model's own code stays byte for byte."""
from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from graphmode.transforms.cstutil import code_of
from graphmode.transforms.output.tidy import _each_read_after, _unread, tidy

ROOT = Path(__file__).parents[1]

TWIN = '"""`forward` on the static path (added by graphmode): what `prefill` and `decode` run."""'


def tidied(source: str) -> str:
    return tidy(cst.parse_module(textwrap.dedent(source))).code


TIDIED = [
    # A local the rewrite no longer reads, with the comment that described it.
    (f"""
     def forward_static(self, x):
         {TWIN}
         # graphmode: attention reads every slot of the static cache.
         kv_seq_len = self.kv_cache.max_seq_len
         return x
     """, f"""
     def forward_static(self, x):
         {TWIN}
         return x
     """),
    # One name of a pair of values; the other is still read.
    (f"""
     def forward_static(self, q, k):
         {TWIN}
         q_len, k_len = q.size(-2), k.size(-2)
         return k[:k_len]
     """, f"""
     def forward_static(self, q, k):
         {TWIN}
         k_len = k.size(-2)
         return k[:k_len]
     """),
    # A list that is only appended to, and a local freed by that.
    (f"""
     def decode(self, h):
         {TWIN}
         presents = []
         for layer in self.layers:
             h, present = layer(h)
             presents.append(present)
         return h
     """, f"""
     def decode(self, h):
         {TWIN}
         for layer in self.layers:
             h, present = layer(h)
         return h
     """),
    # Two arms made the same by a rewrite, in an elif (which cannot become several statements) and at the top.
    (f"""
     def forward_static(self, x, flag, other):
         {TWIN}
         if flag:
             y = x + 1
         elif other:
             y = x * 2
         else:
             y = x * 2
         if other:
             z = y
         else:
             z = y
         return z
     """, f"""
     def forward_static(self, x, flag, other):
         {TWIN}
         if flag:
             y = x + 1
         elif other:
             y = x * 2
         else:
             y = x * 2
         z = y
         return z
     """),
]


@pytest.mark.parametrize(("before", "after"), TIDIED)
def test_graphmodes_functions_lose_what_nothing_reads(before, after):
    assert tidied(before) == textwrap.dedent(after)


KEPT = [
    # The model's own function: never touched, however dead its locals.
    """
    def forward(self, x):
        n = x.shape[0]
        return x
    """,
    # A value with an effect stays, read or not; so does unpacking, which checks a shape.
    f"""
    def forward_static(self, x):
        {TWIN}
        written = self.cache.update(x)
        bsz, seqlen = x.shape
        return x
    """,
    # Read in a nested function or a comprehension: read.
    f"""
    def forward_static(self, xs):
        {TWIN}
        scale = xs[0].shape[-1]
        return [x / scale for x in xs]
    """,
]


@pytest.mark.parametrize("kept", KEPT)
def test_what_is_read_has_an_effect_or_is_the_models_own_stays(kept):
    assert tidied(kept) == textwrap.dedent(kept)


def _functions_tidy_sees() -> list[cst.FunctionDef]:
    """graphmode's functions as the tidy pass gets them (before it), for every fixture and bundled example, and the
    functions of this file's cases."""
    from test_codemods import CASES, options_for

    import graphmode.transforms.pipeline as pipeline
    from graphmode.transforms.cstutil import nodes_of_type
    from graphmode.transforms.output.tidy import added_by_graphmode

    examples = sorted(p for p in (ROOT / "examples").glob("*/*.py") if p.name != "harness.py")
    cases = [*(before for before, _ in TIDIED), *KEPT]
    seen: list[cst.Module] = [cst.parse_module(textwrap.dedent(source)) for source in cases]
    real_tidy = pipeline.tidy
    pipeline.tidy = lambda module: seen.append(module) or real_tidy(module)
    try:
        for path in [*CASES, *examples]:
            pipeline.adapt_source(path.read_text(), path.name, None, options_for(path))
    finally:
        pipeline.tidy = real_tidy
    return [f for module in seen for f in nodes_of_type(module, cst.FunctionDef) if added_by_graphmode(f)]


def test_the_shortcut_past_the_scope_analysis_agrees_with_it():
    # `_each_read_after` lets tidy skip libcst's scope analysis; wherever it does, the analysis finds nothing to take.
    shortcut = analysed = 0
    for function in _functions_tidy_sees():
        found = _unread(function, shortcut=False)
        if _each_read_after(function):
            shortcut += 1
            assert found == (set(), set()), code_of(function)
        analysed += found != (set(), set())
    assert shortcut > 100 and analysed > 5, (shortcut, analysed)  # both ways are taken
