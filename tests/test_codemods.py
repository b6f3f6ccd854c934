"""Each codemod against its fixture pairs: `case.in.py` -> `case.out.py`, plus `case.manual.txt`
where the idiom is recognised only in part (then the expected output is the input, untouched), and
`case.evidence.json` where the codemod acts on what a traced run saw: {"caches": [[line, dim], ...],
"positions": [line, ...], "host_syncs": [line, ...], "cache_reads": [[line, op, "scores" | "reads"], ...],
"recomputes_sequence": true, "cache_writes": [[line, [dim, ...], [[shape per layer, ...], ...]], ...],
"position_tests": [[line, "gt" | "ge"], ...], "int_params": [[function, parameter], ...]} (lines of the
.in.py; "recomputes_sequence": the token input grows every step, no KV cache; "cache_writes": a cache object's
`update` grew each tensor it was given along dim, with these shapes; "int_params": int parameters that changed every
Decode step)."""
import json
from dataclasses import replace
from pathlib import Path

import libcst as cst
import pytest

from graphmode.transforms.codemods import CHAIN, CODEMODS, Options
from graphmode.transforms.pipeline import adapt_source

FIXTURES = Path(__file__).parent / "fixtures" / "codemods"
CASES = sorted(FIXTURES.glob("*/*.in.py"))
OPTIONS = Options(entry_class="Model", max_seq_len=32)


def options_for(case: Path) -> Options:
    """The fixtures' options, with the traced run's evidence where the case has it. A case named `npu_*` is
    adapted for an NPU backend (the fusions write torch_npu's fused operators), `cpu_*` for a CPU one; every other
    case for CUDA (every portable fusion)."""
    prefix = case.name.split("_", 1)[0]
    options = replace(OPTIONS, fused_ops=prefix) if prefix in ("npu", "cpu") else OPTIONS
    listing = case.with_name(case.name.removesuffix(".in.py") + ".evidence.json")
    if not case.name.endswith(".in.py") or not listing.exists():
        return options
    seen = json.loads(listing.read_text())
    return replace(options, traced=True,
                   evidence_caches=tuple((case.name, line, dim) for line, dim in seen.get("caches", [])),
                   position_lines=tuple((case.name, line) for line in seen.get("positions", [])),
                   host_sync_lines=tuple((case.name, line) for line in seen.get("host_syncs", [])),
                   cache_reads=tuple((case.name, line, op, kind) for line, op, kind in seen.get("cache_reads", [])),
                   recomputes_sequence=bool(seen.get("recomputes_sequence")),
                   position_tests=tuple((case.name, line, op) for line, op in seen.get("position_tests", [])),
                   changing_int_params=tuple((case.name, function, param)
                                             for function, param in seen.get("int_params", [])),
                   evidence_cache_writes=tuple((case.name, line, tuple(dims), tuple(tuple(map(tuple, per_layer))
                                                                                for per_layer in shapes))
                                               for line, dims, shapes in seen.get("cache_writes", [])))


def _expected_manual(case: Path) -> list[str]:
    listing = case.with_name(case.name.replace(".in.py", ".manual.txt"))
    return listing.read_text().split() if listing.exists() else []


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name[:-6]}")
def test_codemod_fixture(case):
    codemod = case.parent.name
    expected = case.with_name(case.name.replace(".in.py", ".out.py")).read_text()
    result = adapt_source(case.read_text(), case.name, {codemod}, options_for(case))
    assert result.adapted == expected
    assert [x for m in result.manual for x in (str(m.line), m.codemod)] == _expected_manual(case)
    # A partial match leaves its file untouched: such cases have an .out.py equal to the .in.py. An advisory
    # item (a path deliberately left as it was, such as a FlashAttention class) comes with a changed file.
    if _expected_manual(case) and not case.name.startswith("advisory_"):
        assert not result.changed, "a partial match must leave the file untouched"


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name[:-6]}")
def test_second_run_changes_nothing(case):
    once = adapt_source(case.read_text(), case.name, None, options_for(case)).adapted
    # A model that keeps no KV cache still recomputes the sequence through `forward`: a second trace says so too;
    # and the backend it is adapted for is the same one.
    again = replace(OPTIONS, recomputes_sequence=options_for(case).recomputes_sequence,
                    fused_ops=options_for(case).fused_ops)
    twice = adapt_source(once, case.name, None, again)
    cst.parse_module(once)
    assert twice.adapted == once and not twice.edits


def test_every_codemod_has_a_fixture_pair():
    for name in CODEMODS:
        assert any(p.parent.name == name for p in CASES), name


def test_example_is_fully_adapted_and_every_finding_is_attributed():
    from graphmode.transforms.pipeline import fixed_by
    from graphmode.transforms.rules import scan_source

    source = (Path(__file__).parents[1] / "examples" / "legacy_llm" / "model.py").read_text()
    result = adapt_source(source, "model.py", None, Options(entry_class="Transformer"))
    # Every codemod but the Meta-style slice rewrites (examples/meta_llama), the Cache-API and tuple-cache ones
    # and the tensor-branch, buffer, host-scalar, scalar-argument, MoE and MLA ones (idioms the example does not have;
    # its cache is static_kv_cache's), and the fusions only the NPU backends apply (Options default to CUDA's fusions).
    absent = ("sliced_tables", "sliced_kv_cache", "cache_object", "absorbed_mla", "carried_cache", "tensor_branches",
              "host_scalars", "scalar_arguments", "static_moe", "added_cache", "fused_add_rms_norm", "fused_rotary",
              "buffers_in_place")
    expected = [c.NAME for c in CHAIN if c.NAME not in absent]
    assert result.applied == expected and not result.manual
    unfixed = [f for f in scan_source(source, "model.py") if fixed_by(f, result.edits) is None]
    assert unfixed == []
    # Nothing the rules flag is left in the Decode entry; `forward`'s static path (Prefill's) keeps its length branch.
    # The original statements beside the static ones are the model's own code, which no step of the entries runs.
    remaining = [(f.function, f.code, result.adapted.splitlines()[f.line - 1].strip())
                 for f in scan_source(result.adapted, "model.py")]
    assert remaining == [("Transformer.forward", "GM401", "if seqlen > 1:")]


def test_declining_a_prerequisite_never_leaves_a_half_rewrite():
    source = (Path(__file__).parents[1] / "examples" / "legacy_llm" / "model.py").read_text()
    # The cache rewrite writes `input_pos`, which only the positions rewrite defines; without the mask
    # rewrite the positions rewrite cannot apply (the mask uses `start_pos`), so the cache rewrite is dropped.
    result = adapt_source(source, "model.py", {"static_kv_cache", "static_positions"},
                          Options(entry_class="Transformer"))
    assert result.applied == []
    assert {m.codemod for m in result.manual} == {"static_kv_cache", "static_positions"}
    assert result.adapted == source
