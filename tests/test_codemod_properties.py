"""Properties every rewrite keeps, on generated variants of the fixtures and the bundled example:
the output parses, a second run changes nothing, and comments outside the edited lines survive."""
from __future__ import annotations

import io
import tokenize
from dataclasses import replace
from pathlib import Path

import libcst as cst
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source
from graphmode.transforms.vocabulary import POSITION_PARAM_NAMES

ROOT = Path(__file__).parents[1]
SOURCES = sorted((ROOT / "tests" / "fixtures" / "codemods").glob("*/*.in.py")) + [
    ROOT / "examples" / "legacy_llm" / "model.py"
]
OPTIONS = Options(entry_class="Model", max_seq_len=48)
# Names the idioms use, and what a variant may call them instead.
RENAMES = {
    "start_pos": sorted(POSITION_PARAM_NAMES - {"offset"}),
    "mask": ["mask", "attn_mask", "causal"],
    "k": ["k", "keys", "key_states"],
    "v": ["v", "values", "value_states"],
    "seqlen": ["seqlen", "seq_len", "q_len"],
}


class _Rename(cst.CSTTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=self.mapping.get(updated_node.value, updated_node.value))


def _comments(source: str) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def _options(source: str, path: Path) -> Options:
    """Options for a variant: the fixture's traced evidence (test_codemods.options_for), one line further down for
    the variant's first line."""
    from test_codemods import options_for

    found = options_for(path)
    options = Options(entry_class="Transformer" if "class Transformer" in source else "Model", max_seq_len=48)
    if not found.traced:
        return options
    return replace(options, traced=True,
                   evidence_caches=tuple(("model.py", line + 1, dim) for _, line, dim in found.evidence_caches),
                   evidence_cache_writes=tuple(("model.py", line + 1, *rest) for _, line, *rest in
                                               found.evidence_cache_writes),
                   position_lines=tuple(("model.py", line + 1) for _, line in found.position_lines),
                   host_sync_lines=tuple(("model.py", line + 1) for _, line in found.host_sync_lines))


@st.composite
def variants(draw) -> tuple[str, Path]:
    path = draw(st.sampled_from(SOURCES))
    mapping = {name: draw(st.sampled_from(choices)) for name, choices in RENAMES.items()}
    if len(set(mapping.values())) < len(mapping):  # two idioms must not end up with one name
        mapping = {name: name for name in mapping}
    source = cst.parse_module(path.read_text()).visit(_Rename(mapping)).code
    note = draw(st.text(alphabet="abcdefgh ", min_size=1, max_size=12)).strip() or "note"
    return f"# variant: {note}\n" + source, path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=variants())
def test_rewrites_parse_are_idempotent_and_keep_comments(variant):
    source, path = variant
    options = _options(source, path)
    once = adapt_source(source, "model.py", None, options)
    cst.parse_module(once.adapted)
    compile(once.adapted, "model.py", "exec")
    twice = adapt_source(once.adapted, "model.py", None, options)
    assert twice.adapted == once.adapted and not twice.edits

    edited = {line for e in once.edits for line in range(e.start_line, e.end_line + 1)}
    kept = {text for _, text in _comments(once.adapted)}
    for line, text in _comments(source):
        if line not in edited:
            assert text in kept, f"comment on line {line} lost: {text}"
