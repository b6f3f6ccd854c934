"""Tests for the runtime evidence (runners/evidence*.py): real torch, real tiny models, real workers.

Each target runs once, in its own worker, through `collect_evidence` (module-scoped cache). The bundled
examples are read where they are; the models of tests/fixtures/evidence are copied to a temporary folder
first. Lines are found by their text or by a `# EVIDENCE: name` marker, and every expected shape or value
is derived from the harness (prompt length, batch, layers, heads) and the number of Decode steps traced:
Decode step s (1-based) holds prompt_len + s positions and runs at position prompt_len + s - 1.
"""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from graphmode.runners.evidence.collect import EvidenceError, collect_evidence
from graphmode.runners.evidence.findings import (NOT_RUN, PREFILL_ONLY, SEEN, evidence_findings, reconcile,
                                                 reconcile_details)
from graphmode.runners.evidence.model import DECODE, PREFILL, Evidence, SourceLine
from graphmode.runners.harness import load_harness
from graphmode.transforms.findings import Finding
from graphmode.transforms.rules import scan_source

PROJECT_ROOT = Path(__file__).resolve().parents[1]

EXAMPLES = PROJECT_ROOT / "examples"
FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "evidence"
STEPS = 4
DECODE_STEPS = range(1, STEPS + 1)


# -- helpers ---------------------------------------------------------------------------------------------

def line_of(path: Path, text: str) -> int:
    """The 1-based number of the only line of path that contains text."""
    hits = [n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, f"{text!r} is on lines {hits} of {path}"
    return hits[0]


def marked(folder: Path, name: str) -> int:
    return line_of(folder / "model.py", f"# EVIDENCE: {name}")


def constant(folder: Path, name: str) -> object:
    """A module-level constant of folder/harness.py, read without running it."""
    tree = ast.parse((folder / "harness.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(name)


def growth(evidence: Evidence, line: int, op: str = "cat", via_prefix: str | None = None):
    entry = evidence.lines[SourceLine("model.py", line)]
    found = [g for g in entry.growing if g.op == op and (via_prefix is None or (g.via or "").startswith(via_prefix))]
    assert found, f"no growing {op} at model.py:{line}: {entry}"
    return found


def scalar(evidence: Evidence, line: int, arg: str):
    found = [s for s in evidence.lines[SourceLine("model.py", line)].scalars if s.arg == arg]
    assert len(found) == 1, evidence.lines[SourceLine("model.py", line)].scalars
    return found[0]


def function(evidence: Evidence, name: str):
    (found,) = [f for f in evidence.functions.values() if f.name == name]
    return found


def sync_kinds(evidence: Evidence, line: int) -> dict[str, int]:
    return {s.kind: s.decode for s in evidence.lines[SourceLine("model.py", line)].syncs}


_TRACED: dict[str, tuple[Path, Evidence]] = {}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """name -> (folder, evidence), each target traced once for the whole module."""

    def get(name: str) -> tuple[Path, Evidence]:
        if name not in _TRACED:
            if (EXAMPLES / name).is_dir():
                folder = EXAMPLES / name
            else:
                folder = tmp_path_factory.mktemp("evidence") / name
                shutil.copytree(FIXTURES / name, folder)
            _TRACED[name] = folder, collect_evidence(folder, steps=STEPS, timeout_s=300)
        return _TRACED[name]

    return get


# -- the bundled examples ----------------------------------------------------------------------------------

def test_legacy_llm_cat_cache_int_positions_and_item(traced):
    folder, ev = traced("legacy_llm")
    harness = load_harness(folder)
    prompt_len = harness.make_prompt().shape[1]
    model = harness.build_model()
    attention = model.layers[0].attention
    layers, kv_heads, head_dim = len(model.layers), attention.n_kv_heads, attention.head_dim
    source = folder / "model.py"
    assert ev.logits_equal and ev.max_abs_diff == 0.0
    assert ev.steps == STEPS and ev.new_tokens == 1 and ev.prompt_shape == [1, prompt_len]

    for text, dim in (("k = torch.cat([past_key_value[0], k], dim=2)", 2),
                      ("v = torch.cat([past_key_value[1], v], dim=2)", 2)):
        line = line_of(source, text)
        (g,) = growth(ev, line)
        assert (g.kind, g.dims, g.by, g.carried, g.piece) == ("cache", [dim], 1, True, 1)
        assert g.layout == "[b, h, s, d]" and g.kv_dim is None
        assert g.shapes == [[1, kv_heads, prompt_len + s, head_dim] for s in DECODE_STEPS]
        assert g.calls == layers  # one cat per layer per step
        assert ev.lines[SourceLine("model.py", line)].phases == [DECODE]  # Prefill has no past to append to

    # Python-int positions: the arange of positions and the parameter that carries them.
    arange = line_of(source, "positions = torch.arange(start_pos, start_pos + seqlen")
    start, stop = scalar(ev, arange, "arg0"), scalar(ev, arange, "arg1")
    assert start.values == [prompt_len + s - 1 for s in DECODE_STEPS] and start.delta == 1
    assert stop.values == [prompt_len + s for s in DECODE_STEPS] and stop.delta == 1
    for name in ("Transformer.forward", "TransformerBlock.forward", "Attention.forward"):
        param = function(ev, name).params["start_pos"]
        assert param.values == start.values and param.delta == 1

    # The rotary table is rebuilt every step as long as the furthest position, read with .item().
    (table,) = growth(ev, line_of(source, "t = torch.arange(seq_len, dtype=torch.float32"), op="arange")
    assert (table.kind, table.dims, table.shapes) == ("created", [0], [[prompt_len + s] for s in DECODE_STEPS])
    assert sync_kinds(ev, line_of(source, "seq_len = positions.max().item() + 1")) == {"item": STEPS * layers}
    assert sync_kinds(ev, line_of(source, "assert tokens.max().item()")) == {"item": STEPS}

    # The causal mask is built only for several tokens: Prefill runs it, Decode never does.
    mask = line_of(source, 'mask = torch.full((seqlen, seqlen), float("-inf")')
    assert ev.ran("model.py", mask) == {PREFILL}
    assert ev.recomputes_sequence is None


def test_meta_llama_caches_sliced_at_start_pos(traced):
    folder, ev = traced("meta_llama")
    harness = load_harness(folder)
    prompt_len = harness.make_prompt().shape[1]
    attention = harness.build_model().layers[0].attention
    source = folder / "model.py"
    assert ev.logits_equal

    # Written in place at moving Python-int bounds ...
    write = line_of(source, "self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk")
    assert scalar(ev, write, "index[1].start").values == [prompt_len + s - 1 for s in DECODE_STEPS]
    assert scalar(ev, write, "index[1].stop").values == [prompt_len + s for s in DECODE_STEPS]
    # ... and read as a slice that grows: no cat, nothing carried, so kind "slice".
    read = line_of(source, "keys = self.cache_k[:bsz, : start_pos + seqlen]")
    (g,) = growth(ev, read, op="getitem")
    assert (g.kind, g.dims, g.by, g.carried) == ("slice", [1], 1, False)
    assert g.shapes == [[1, prompt_len + s, attention.n_kv_heads, attention.head_dim] for s in DECODE_STEPS]
    assert not [g for _, _, g in ev.origins() if g.kind == "cache"]
    freqs = line_of(source, "freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]")
    assert scalar(ev, freqs, "index.start").delta == 1


def test_hf_cache_api_cache_object_and_library_code(traced):
    folder, ev = traced("hf_cache_api")
    harness = load_harness(folder)
    prompt_len = harness.make_prompt().shape[1]
    config = harness.CONFIG
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    source = folder / "model.py"
    assert ev.logits_equal

    # The cats run in cache.py (not a SOURCE): attributed to the model line that called update().
    update = _sdpa_update_line(source)
    caches = growth(ev, update, via_prefix="cache.py:")
    assert len(caches) == 2  # keys and values, at two lines of cache.py
    for g in caches:
        assert (g.kind, g.dims, g.carried, g.layout) == ("cache", [2], True, "[b, h, s, d]")
        assert g.shapes == [[1, config["num_key_value_heads"], prompt_len + s, head_dim] for s in DECODE_STEPS]
        # One call per layer at this line: each layer's cache after the last step, as the static buffers take it.
        assert g.call_shapes == [[1, config["num_key_value_heads"], prompt_len + STEPS, head_dim]] * \
            config["num_hidden_layers"]
    # The rotary table is sliced to the length: a growing slice, and its length a moving parameter.
    cos = line_of(source, "self.cos_cached[:seq_len].to(dtype=x.dtype),")
    (g,) = growth(ev, cos, op="getitem")
    assert (g.kind, g.dims, g.shapes) == ("slice", [0], [[prompt_len + s, head_dim] for s in DECODE_STEPS])
    rotary_def = line_of(source, "def forward(self, x, seq_len=None):")
    rotary = ev.functions[SourceLine("model.py", rotary_def)]
    assert rotary.params["seq_len"].values == [prompt_len + s for s in DECODE_STEPS]

    # No static rule reports the rotary slice: it is added. The changing `seq_len` parameter is not added on its
    # own: the static finding on its use (the growth branch) carries it. The update line's GM303 gets the evidence.
    merged = reconcile_details(scan_source(source.read_text(), "model.py"), ev)
    added = {(f.code, f.line) for f in merged.added}
    assert ("GM302", cos) in added and ("GM501", rotary_def) not in added
    branch_line = line_of(source, "if seq_len > self.max_seq_len_cached:")
    (branch,) = [f for f in merged.findings if f.line == branch_line]
    assert "`seq_len` is a Python int parameter" in branch.evidence
    (gm303,) = [f for f in merged.findings if f.code == "GM303" and f.line == update]
    assert gm303.trace == SEEN and "cache.py:" in gm303.evidence
    # `_set_cos_sin_cache` runs only in __init__ (the table is long enough): never in the trace.
    table = line_of(source, "positions = torch.arange(seq_len, device=device, dtype=self.inv_freq.dtype)")
    (gm201,) = [f for f in merged.findings if f.line == table]
    assert gm201.trace == NOT_RUN


def _sdpa_update_line(source: Path) -> int:
    """The SDPA attention's update() call: the harness's default attention implementation is SDPA."""
    lines = source.read_text().splitlines()
    sdpa = next(n for n, line in enumerate(lines, 1) if line.startswith("class SdpaAttention"))
    return next(n for n, line in enumerate(lines, 1)
                if n > sdpa and "past_key_value.update(key_states, value_states" in line)


# -- cache layouts ------------------------------------------------------------------------------------------

def test_cat_on_dim_1_is_a_bshd_cache(traced):
    folder, ev = traced("bshd_cat")
    model = load_harness(folder).build_model()
    prompt_len = constant(folder, "PROMPT_LEN")
    for name in ("cache_k", "cache_v"):
        (g,) = growth(ev, marked(folder, name))
        assert (g.kind, g.dims, g.carried, g.piece, g.layout) == ("cache", [1], True, 1, "[b, s, h, d]")
        assert g.shapes == [[1, prompt_len + s, model.heads, model.head_dim] for s in DECODE_STEPS]


def test_sequence_first_cache_on_dim_0_is_found_where_static_rules_miss_it(traced):
    folder, ev = traced("seq_first")
    prompt_len, batch = constant(folder, "PROMPT_LEN"), constant(folder, "BATCH")
    groups, head_dim, layers = constant(folder, "GROUPS"), constant(folder, "HEAD_DIM"), constant(folder, "LAYERS")
    lines = [marked(folder, "cache_k"), marked(folder, "cache_v")]
    for line in lines:
        (g,) = growth(ev, line)
        assert (g.kind, g.dims, g.carried, g.layout, g.calls) == ("cache", [0], True, "[s, b, h, d]", layers)
        assert g.shapes == [[prompt_len + s, batch, groups, head_dim] for s in DECODE_STEPS]
    # `cache_k` is no `past...` name: GM301 does not fire, so the trace adds the finding.
    static = scan_source((folder / "model.py").read_text(), "model.py")
    assert not [f for f in static if f.code == "GM301"]
    added = reconcile_details(static, ev).added
    assert sorted(f.line for f in added if f.code == "GM301") == lines
    assert all(f.source == "trace" and "dim 0" in f.message and "[s, b, h, d]" in f.message
               for f in added if f.code == "GM301")


def test_k_and_v_stacked_in_one_tensor(traced):
    folder, ev = traced("stacked_kv")
    prompt_len, heads, head_dim = (constant(folder, "PROMPT_LEN"), constant(folder, "HEADS"),
                                   constant(folder, "HEAD_DIM"))
    # torch.stack([k, v]) -> [2, b, h, s, d], grown on dim 3: the stacked piece says where k/v sit.
    (stacked,) = growth(ev, marked(folder, "stacked"))
    assert (stacked.kind, stacked.dims, stacked.kv_dim, stacked.layout) == ("cache", [3], 0, "[2, b, h, s, d]")
    assert stacked.shapes == [[2, 1, heads, prompt_len + s, head_dim] for s in DECODE_STEPS]
    # One packed projection viewed as [b, s, 2, h, d], grown on dim 1: `unbind(2)` says where k/v sit.
    (packed,) = growth(ev, marked(folder, "packed"))
    assert (packed.kind, packed.dims, packed.kv_dim, packed.layout) == ("cache", [1], 2, "[b, s, 2, h, d]")
    assert packed.shapes == [[1, prompt_len + s, 2, heads, head_dim] for s in DECODE_STEPS]
    messages = {f.line: f.message for f in evidence_findings(ev) if f.code == "GM301"}
    assert "k and v stacked along dim 0" in messages[marked(folder, "stacked")]


def test_no_kv_cache_the_token_sequence_grows(traced):
    folder, ev = traced("no_cache")
    prompt_len = constant(folder, "PROMPT_LEN")
    dim = load_harness(folder).build_model().emb.embedding_dim
    tokens, positions_line, mask = marked(folder, "tokens"), marked(folder, "positions"), marked(folder, "mask")
    assert ev.recomputes_sequence == SourceLine("model.py", tokens)
    (g,) = growth(ev, tokens, op="embedding")
    assert (g.kind, g.dims, g.carried) == ("input", [1], False)
    assert g.shapes == [[1, prompt_len + s, dim] for s in DECODE_STEPS]
    (arange,) = growth(ev, positions_line, op="arange")
    assert (arange.kind, arange.dims, arange.shapes) == ("created", [0], [[prompt_len + s] for s in DECODE_STEPS])
    assert scalar(ev, positions_line, "arg0").values == [prompt_len + s for s in DECODE_STEPS]
    (full,) = growth(ev, mask, op="full")
    assert (full.kind, full.dims) == ("created", [0, 1])
    (triu,) = growth(ev, mask, op="triu")
    assert triu.kind == "derived"  # it grows because its input does
    (gm301,) = [f for f in evidence_findings(ev) if f.code == "GM301"]
    assert gm301.line == tokens and gm301.message.startswith("no KV cache")


def test_alibi_bias_built_from_the_length(traced):
    folder, ev = traced("alibi")
    prompt_len = constant(folder, "PROMPT_LEN")
    alibi = marked(folder, "alibi")
    (g,) = growth(ev, alibi, op="arange")
    assert (g.kind, g.dims, g.by) == ("created", [0], 1)
    assert g.shapes == [[prompt_len + s] for s in DECODE_STEPS]
    length = scalar(ev, alibi, "arg0")
    assert length.values == [prompt_len + s for s in DECODE_STEPS] and length.delta == 1
    (cache,) = growth(ev, marked(folder, "cache_k"))
    assert (cache.kind, cache.dims, cache.layout) == ("cache", [2], "[b, h, s, d]")
    # The causal part of the bias is built only for several tokens: a static GM201 kept, as Prefill-only.
    full = line_of(folder / "model.py", 'bias = bias + torch.full((t, kv_len), float("-inf"))')
    merged = reconcile(scan_source((folder / "model.py").read_text(), "model.py"), ev)
    (kept,) = [f for f in merged if f.line == full and f.code == "GM201"]
    assert kept.trace == PREFILL_ONLY
    (confirmed,) = [f for f in merged if f.line == alibi and f.code == "GM201"]
    assert confirmed.trace == SEEN and "grows by 1 along dim 0" in confirmed.evidence


def test_the_ops_reading_the_cache_along_its_growing_dim(traced):
    """Where a static cache's unwritten slots must be hidden: the SDPA that takes the growing keys in and gives a
    fixed output back, and the product whose scores grow with the keys (weights times values read them too)."""
    from graphmode.agent.workflow.adaptation import cache_reads

    folder, ev = traced("seq_first")
    sdpa = line_of(folder / "model.py", "F.scaled_dot_product_attention(q, k, v")
    assert ev.lines[SourceLine("model.py", sdpa)].reads_growing == ["scaled_dot_product_attention"]
    assert ("model.py", sdpa, "scaled_dot_product_attention", "reads") in cache_reads(ev)
    folder, ev = traced("alibi")
    scores, values = (line_of(folder / "model.py", text) for text in ("scores = q @ k.transpose", "softmax(scores"))
    assert "matmul" in [g.op for g in growth(ev, scores, op="matmul") if g.kind == "derived"]
    assert ev.lines[SourceLine("model.py", values)].reads_growing == ["matmul"]
    assert {("model.py", scores, "matmul", "scores"), ("model.py", values, "matmul", "reads")} <= set(
        cache_reads(Evidence.from_dict(ev.to_dict())))


def test_graph_ready_model_shows_nothing_growing(traced):
    folder, ev = traced("graph_ready")
    assert ev.logits_equal
    assert not [g for entry in ev.lines.values() for g in entry.growing]  # not even a derived one
    assert not [s for entry in ev.lines.values() for s in entry.scalars]
    assert not [p for f in ev.functions.values() for p in f.params]
    assert not [s for entry in ev.lines.values() for s in entry.syncs]
    assert ev.recomputes_sequence is None
    assert evidence_findings(ev) == []
    assert DECODE in ev.ran("model.py", marked(folder, "write_k"))  # it did run: it just did not grow
    assert "nothing grows" in ev.summary()


# -- host syncs and reconciliation ---------------------------------------------------------------------------

def test_host_syncs_and_branches_per_line(traced):
    folder, ev = traced("syncs")
    assert sync_kinds(ev, marked(folder, "branch")) == {"branch": STEPS}
    assert sync_kinds(ev, marked(folder, "int")) == {"int": STEPS}
    assert sync_kinds(ev, marked(folder, "tolist")) == {"tolist": STEPS}
    assert sync_kinds(ev, marked(folder, "cpu")) == {"cpu": STEPS}
    assert sync_kinds(ev, marked(folder, "bool_mask")) == {"data-dependent": STEPS}  # seen at dispatch level
    codes = {(f.code, f.line) for f in evidence_findings(ev)}
    assert {("GM402", marked(folder, "branch")), ("GM102", marked(folder, "int")),
            ("GM101", marked(folder, "tolist")), ("GM103", marked(folder, "cpu")),
            ("GM101", marked(folder, "bool_mask"))} <= codes


def test_reconcile_drops_what_decode_ran_without_the_hazard(traced):
    folder, ev = traced("syncs")
    static = scan_source((folder / "model.py").read_text(), "model.py")
    short_circuit, not_growing = marked(folder, "short_circuit"), marked(folder, "cat_not_growing")
    constant_position = marked(folder, "constant_position")
    # The static rules report all three; the trace ran each line in Decode without the hazard.
    assert {("GM402", short_circuit), ("GM301", not_growing), ("GM501", constant_position)} <= \
        {(f.code, f.line) for f in static}
    result = reconcile_details(static, ev)
    assert {(f.code, f.line) for f in result.dropped} == {
        ("GM402", short_circuit), ("GM301", not_growing), ("GM501", constant_position)}
    kept = {(f.code, f.line): f for f in result.findings}
    assert kept[("GM402", marked(folder, "branch"))].trace == SEEN
    # A condition over several lines: whichever line Python gives the jump, it maps to the `if`'s statement.
    multiline = marked(folder, "multiline_branch")
    (entry,) = [e for _, e in ev.at("model.py", multiline)]
    assert [(s.kind, s.decode) for s in entry.syncs] == [("branch", STEPS)]
    assert kept[("GM402", multiline)].trace == SEEN
    # `int(tokens[0, -1])` and the boolean mask: no static rule saw them, the trace adds them.
    assert {(f.code, f.line) for f in result.added} == {("GM102", marked(folder, "int")),
                                                        ("GM101", marked(folder, "bool_mask"))}
    assert all(f.source == "trace" and not f.autofix for f in result.added)


def test_reconcile_keeps_what_decode_never_ran_and_confirms_the_rest(traced):
    folder, ev = traced("legacy_llm")
    static = scan_source((folder / "model.py").read_text(), "model.py")
    result = reconcile_details(static, ev)
    assert result.dropped == []  # every traced hazard of this model is real
    traced_codes = [f for f in result.findings
                    if f.source == "static" and f.code in ("GM101", "GM201", "GM301", "GM501")]
    for f in traced_codes:
        assert f.trace in (SEEN, PREFILL_ONLY), f
        assert f.evidence.startswith("trace: ")
    # The mask lines run only in Prefill: kept, and said so.
    mask = line_of(folder / "model.py", 'mask = torch.full((seqlen, seqlen), float("-inf")')
    assert [f.trace for f in result.findings if f.line == mask] == [PREFILL_ONLY]
    # A GM501 on a function whose int parameter does not change in Decode is dropped (repeat_kv's n_rep).
    repeat = line_of(folder / "model.py", "def repeat_kv(x, n_rep: int):")
    invented = Finding("GM501", "model.py", repeat, 15, "`n_rep` is a Python int that changes every Decode step",
                       "positions-as-tensors", function="repeat_kv")
    assert reconcile_details([invented], ev).dropped == [invented]
    # Codes the trace cannot judge (GM401 here) pass through untouched.
    assert [f for f in result.findings if f.code == "GM401"] == [f for f in static if f.code == "GM401"]


# -- robustness and the record itself ---------------------------------------------------------------------

def test_a_harness_that_raises_names_the_users_line(tmp_path):
    shutil.copytree(FIXTURES / "bshd_cat", tmp_path / "broken")
    model = tmp_path / "broken" / "model.py"
    text = model.read_text().replace(
        "        scores = torch.einsum(",
        "        if cache is not None:\n"
        "            raise ValueError(\"decode is not supported\")  # EVIDENCE: raises\n"
        "        scores = torch.einsum(", 1)
    model.write_text(text)
    with pytest.raises(EvidenceError) as raised:
        collect_evidence(tmp_path / "broken", steps=2, timeout_s=300)
    message = str(raised.value)
    assert "harness.decode raised ValueError: decode is not supported" in message
    assert f"model.py:{marked(tmp_path / 'broken', 'raises')}" in message


def test_a_source_line_reads_back_the_text_it_is_written_as():
    """The evidence keys lines by SourceLine and writes them "file:line" in the JSON: the agent reads them back."""
    where = SourceLine.parse("layers/attention.py:97")
    assert where == SourceLine("layers/attention.py", 97) and str(where) == "layers/attention.py:97"
    assert f"{where}" == "layers/attention.py:97"
    assert SourceLine.parse("C:/target/model.py:3") == ("C:/target/model.py", 3)  # the last colon splits
    assert sorted([SourceLine("b.py", 1), SourceLine("a.py", 10), SourceLine("a.py", 9)]) == \
        [("a.py", 9), ("a.py", 10), ("b.py", 1)]  # by file, then by line as a number


def test_evidence_round_trips_and_summarises(traced):
    folder, ev = traced("legacy_llm")
    again = Evidence.from_dict(json.loads(ev.to_json()))
    assert again == ev
    summary = ev.summary().splitlines()
    assert len(summary) <= 8
    cat = line_of(folder / "model.py", "k = torch.cat([past_key_value[0], k], dim=2)")
    assert any(f"model.py:{cat} cat dim 2" in line for line in summary)
    assert ev.unattributed_ops > 0  # the harness's own `logits[:, -1, :]` is not the model's
    assert ev.trace_errors == []
    # Each key of `lines` is a line of model.py, written "model.py:<line>" in the JSON, and every entry names the
    # function it is in.
    assert all(where.file == "model.py" and entry.function for where, entry in ev.lines.items())
    assert all(key == f"model.py:{where.line}" for key, where in zip(ev.to_dict()["lines"], ev.lines))
