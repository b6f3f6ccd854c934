"""The tidy pass: what graphmode's own functions no longer read goes; the model's own code stays byte for byte."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from graphmode.transforms.tidy import tidy

TWIN = '"""`forward` on the static path (added by graphmode): what `prefill` and `decode` run."""'


def tidied(source: str) -> str:
    return tidy(cst.parse_module(textwrap.dedent(source))).code


@pytest.mark.parametrize(("before", "after"), [
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
])
def test_graphmodes_functions_lose_what_nothing_reads(before, after):
    assert tidied(before) == textwrap.dedent(after)


@pytest.mark.parametrize("kept", [
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
])
def test_what_is_read_has_an_effect_or_is_the_models_own_stays(kept):
    assert tidied(kept) == textwrap.dedent(kept)


def test_size_constants_go_when_nothing_reads_them_and_stay_when_something_does():
    constants = ("# graphmode: sizes of the static Decode buffers.\n"
                 "GRAPHMODE_MAX_SEQ_LEN = 64\nGRAPHMODE_MAX_BATCH_SIZE = 1\n")
    uses_length = "\n\nclass M:\n    n = GRAPHMODE_MAX_SEQ_LEN\n"
    assert tidied(constants + uses_length) == ("# graphmode: sizes of the static Decode buffers.\n"
                                               "GRAPHMODE_MAX_SEQ_LEN = 64\n" + uses_length)
    uses_batch = "\n\nclass M:\n    n = GRAPHMODE_MAX_BATCH_SIZE\n"
    assert tidied(constants + uses_batch) == ("# graphmode: sizes of the static Decode buffers.\n"
                                              "GRAPHMODE_MAX_BATCH_SIZE = 1\n" + uses_batch)
