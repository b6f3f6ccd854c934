"""The names real inference code uses, shared by the rules (stdlib ast) and the codemods (libcst).

Plain data and pure functions: importing this loads neither parser.
"""
from __future__ import annotations

import re

# Parameter names that, in real inference code, carry the position of the first new token as a Python int.
POSITION_PARAM_NAMES = frozenset(
    {"start_pos", "cur_pos", "past_length", "past_len", "past_key_values_length", "position_offset",
     "seq_len_offset", "start_position", "offset"}
)
_POSITION_LIKE = re.compile(r"(^|_)(pos|position|offset|past_len|past_length)$")
TENSOR_FACTORIES = frozenset(
    {"zeros", "ones", "full", "empty", "arange", "triu", "tril", "tensor", "zeros_like", "ones_like",
     "full_like", "empty_like", "linspace", "eye"}
)
# The name the position tensor takes once Python-int positions are rewritten.
POSITION_TENSOR = "input_pos"


def is_position_name(name: str, annotation: str | None) -> bool:
    """Whether a parameter carries a Python-int position: `name` is its name, `annotation` the bare name
    it is annotated with, "" for any other annotation, None when there is none."""
    if annotation == "int":
        return name in POSITION_PARAM_NAMES or bool(_POSITION_LIKE.search(name))
    return name in POSITION_PARAM_NAMES and annotation is None
