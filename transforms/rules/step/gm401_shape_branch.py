"""GM401: a Python branch on the sequence length or on a prefill flag."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_names_in
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
    STEP_ONLY = True
    VALID = (
        # A shape check that only raises: Dynamo settles it while tracing.
        """
        import torch


        class Decode(torch.nn.Module):
            def forward(self, x):
                q_len = x.shape[1]
                if q_len != 1:
                    raise ValueError("decode takes one token")
                return self.proj(x)
        """,
        # Branches on other values (an optional input) are not a Prefill/Decode split.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, scores, attention_mask=None):
                if attention_mask is not None:
                    scores = scores + attention_mask
                return scores.softmax(-1)
        """,
        # Eager-only code under the guard.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, x, seq_len):
                if not torch.compiler.is_compiling():
                    if seq_len > 1:
                        self.prompts_seen += 1
                return x
        """,
    )
    INVALID = (
        # A Python-int length is still a length: Prefill takes one side, Decode the other.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, scores):
                seqlen = scores.shape[-1]
                if seqlen > 1:
                    scores = scores + self.causal_mask[:seqlen, :seqlen]
                return scores.softmax(-1)
        """,
        """
        import torch


        class Model(torch.nn.Module):
            def forward(self, x, is_prefill=False):
                if is_prefill:
                    return self.prefill_path(x)
                return self.decode_path(x)
        """,
    )

    def visit_If(self, node: ast.If) -> None:
        if not self.in_step_code(node) or _only_raises(node):
            return
        hits = ast_names_in(node.test) & (SEQUENCE_LENGTH_NAMES | PREFILL_FLAGS)
        if hits:
            self.report(node, self.MESSAGE.format(name=sorted(hits)[0]))
