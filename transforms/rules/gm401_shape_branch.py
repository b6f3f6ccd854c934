"""GM401: a Python branch on the sequence length or on a prefill flag."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.astutil import names_in
from graphmode.transforms.rules.base import Rule

# Names that, in inference code, mean "how many new tokens" or "is this the prompt".
SEQUENCE_LENGTH_NAMES = frozenset({"seqlen", "seq_len", "q_len", "query_length", "num_tokens", "tgt_len"})
PREFILL_FLAGS = frozenset({"is_prefill", "prefill", "is_first_step", "use_cache_prefill"})


def _only_raises(node: ast.If) -> bool:
    """`if q_len != n: raise ...`: a shape check, not a path. Shapes are constants to a static graph, so
    Dynamo settles the check while tracing and nothing of it reaches the graph."""
    return not node.orelse and all(stmt.__class__ is ast.Raise for stmt in node.body)


class ShapeBranch(Rule):
    CODE = "GM401"
    MESSAGE = (
        "a Python `if` on `{name}` takes one path in Prefill and another in Decode; "
        "the Decode entry should hold only the Decode path"
    )
    SKILL = "prefill-decode-split"
    FIXED_BY = ("static_rotary", "static_mask", "split_decode")
    STEP_ONLY = True

    def visit_If(self, node: ast.If) -> None:
        if not self.in_step_code(node) or _only_raises(node):
            return
        hits = names_in(node.test) & (SEQUENCE_LENGTH_NAMES | PREFILL_FLAGS)
        if hits:
            self.report(node, self.MESSAGE.format(name=sorted(hits)[0]))
