"""Fusions in the workflow: implement writes the adaptation without them, and the report and the batch summary show
Decode with and without them. The end-to-end run (verify's third side) is in tests/test_runners.py; here the
codemod chain runs for real on the example, and the report is drawn from a hand-built verification."""
from __future__ import annotations

import json
from pathlib import Path

from graphmode.agent.batch.job import JobOutcome
from graphmode.agent.batch.manifest import load_manifest
from graphmode.agent.batch.summary import make_row, write_summary
from graphmode.agent.workflow import nodes
from graphmode.agent.workflow.report.write import write_report
from graphmode.agent.workflow.state import Baseline, RunOptions, RunState, Verification
from graphmode.runners.measure.traffic import estimates
from graphmode.transforms.codemods import CODEMODS, Options
from graphmode.transforms.pipeline import adapt_source

EXAMPLE = Path(__file__).parents[1] / "examples" / "legacy_llm"
UNKNOWN = "fused_elsewhere"  # a fusion name this graphmode has no codemod for (a session saved by another release)


def _designed(tmp_path: Path) -> RunState:
    state = RunState(session_id="fusion", options=RunOptions(target=str(EXAMPLE), run_dir=str(tmp_path / "run")),
                     sources=["model.py"],
                     baseline=Baseline(entry_class="Transformer", max_seq_len=64,
                                       headline="not probed: this test is about the fusions", steps=8))
    state = RunState.model_validate({**state.model_dump(), **nodes.design(state)})
    return state.model_copy(update={"approved": [c.id for c in state.plan]})


def test_implement_writes_the_adaptation_without_its_fusions_only_when_one_was_applied(tmp_path):
    state = _designed(tmp_path)
    unfused = tmp_path / "run" / nodes.UNFUSED_DIR
    fused = nodes.implement(state)
    fusions = nodes.fusions_of(fused["applied"])
    assert "fused_rms_norm" in fusions and "merged_projections" in fusions and "hoist_item" not in fusions
    assert Path(fused["unfused_dir"]) == unfused
    selected = {c.codemod for c in state.plan}
    without = adapt_source((EXAMPLE / "model.py").read_text(), "model.py", selected - set(fusions),
                           Options(entry_class="Transformer", max_seq_len=64))
    assert not set(fusions) & set(without.applied)
    assert (unfused / "model.py").read_text() == without.adapted != Path(fused["adapted_dir"], "model.py").read_text()
    assert (unfused / "harness.py").read_text() == (EXAMPLE / "harness.py").read_text()

    # The person declined every fusion: no folder, and none left from the earlier run.
    declined = state.model_copy(update={"approved": [c.id for c in state.plan if not CODEMODS[c.codemod].FUSION]})
    plain = nodes.implement(declined)
    assert not nodes.fusions_of(plain["applied"]) and plain["unfused_dir"] == "" and not unfused.exists()


def _fusion(**changes) -> dict:
    """Verification.fusion's layout (runners.verify.verify.fusion_figures), with counts as a counting worker gives
    them."""
    fusion = {
        "applied": ["fused_rms_norm", UNKNOWN],
        "ops_per_step": {"original": 310, "before": 250, "after": 190},
        "ops_per_layer": {"original": 70.0, "before": 60.0, "after": 45.0},
        "layers": {"original": 4, "before": 4, "after": 4},
        "bytes_per_layer": {"original": None, "before": 40960, "after": 30720},
        "inductor_kernels": {"before": None, "after": None},
        "decode_ms": {"with": 0.5, "without": 0.75, "with_range": [0.45, 0.55], "without_range": [0.7, 0.8]},
        "speedup": {"median": 1.5, "min": 0.7 / 0.55, "max": 0.8 / 0.45},
        "unstable": False, "runs": 3,
        "tokens": {"unfused_equal_eager": True, "fused_equal_unfused": True, "first_divergent_step": None},
        "logits_max_abs_diff": {"fused_vs_unfused": 2e-6, "unfused_vs_eager": 1e-6},
        "unfused": {"graph_breaks": 0, "recompiles": 0, "graphs_after_warmup": 0, "warmup_s": 1.0},
        "problems": [],
        "missing": {"bytes_per_layer": "not counted (original): its worker recorded no Decode graph",
                    "inductor_kernels": "not counted: `aot_eager` exposes no kernel count"},
        "error": None,
    }
    return {**fusion, **changes}


def _state(tmp_path: Path, fusion: dict, **verification) -> RunState:
    """A finished session whose verification is written by hand (one run per side, figures as the workers give)."""
    env = {"device": "cpu", "torch": "2.x", "python": "3.x", "threads": 2}
    side = {"prefill_ms": 2.0, "decode_ms_per_token": 0.5, "decode_ms_min": 0.4, "decode_ms_max": 0.6,
            "warmup_s": 1.0, "load_s": 0.1}
    variables = {"model": {"eager": "model.Transformer", "graph": "model.Transformer"}, "dtype": "float32",
                 "device": "cpu", "torch": "2.x", "torch_npu": None, "transformers": None, "interpreters": {},
                 "cann": None, "python": "3.x", "threads": 2, "cpu_count": 2, "batch": 1, "prompt_len": 8,
                 "decode_steps": 32, "new_tokens": 33, "max_seq_len": 64, "backend": "aot_eager",
                 "backend_options": {"backend": "aot_eager"}, "runs": 3}
    v = Verification.model_validate({
        "passed": True, "backend": "aot_eager", "backend_reason": "asked for", "steps": 32, "tokens_equal": True,
        "logits_max_abs_diff": 1e-6, "logits_max_abs_diff_per_step": [1e-6], "logits_atol": 1e-2,
        "graph_breaks": 0, "break_reasons": [], "recompiles": 0, "recompile_reasons": [], "decode_speedup": 2.0,
        "eager": {**side, "decode_ms_per_token": 1.0}, "graph": side, "original": {"env": env, "tokens": [[1, 2]]},
        "adapted": {"env": env, "tokens": [[1, 2]], "prompt_len": 8}, "runs": 3, "variables": variables,
        "decode_speedup_range": {"median": 2.0, "min": 1.9, "max": 2.1}, "fusion": fusion, **verification})
    return RunState(session_id="fusion", options=RunOptions(target=str(EXAMPLE), run_dir=str(tmp_path / "run")),
                    applied=["fused_rms_norm"], adapted_dir=str(EXAMPLE),
                    baseline=Baseline(entry_class="Transformer", headline="not probed: this test is about the report",
                                      steps=8),
                    verification=v)


def _section(path: Path) -> str:
    return path.read_text().split("## Kernels and memory traffic\n")[1].split("\n## ")[0]


def test_the_report_tables_the_counts_and_the_decode_times_with_and_without_the_fusions(tmp_path):
    fusion = _fusion()
    section = _section(write_report(_state(tmp_path, fusion)))
    table = {line.split(" | ")[0].strip("| "): line for line in section.splitlines() if line.startswith("| ")}
    ops = fusion["ops_per_step"]
    assert table["Ops per Decode step"].endswith(f"| {ops['original']} | {ops['before']} | {ops['after']} |")
    kib = {side: fusion["bytes_per_layer"][side] / 1024 for side in ("before", "after")}
    layers = fusion["layers"]["after"]
    assert f"| n/a | {kib['before']:.1f} (× {layers} = {kib['before'] * layers:.1f}) |" in table[
        "Bytes per layer (KiB; × layers: the whole step's)"]
    ms = fusion["decode_ms"]
    assert table["Decode ms/step (TPOT), median [min, max] of the runs"].endswith(
        f"| {ms['without']:.3f} [{ms['without_range'][0]:.3f}, {ms['without_range'][1]:.3f}] "
        f"| {ms['with']:.3f} [{ms['with_range'][0]:.3f}, {ms['with_range'][1]:.3f}] |")
    assert f"**{fusion['speedup']['median']:.2f}x**" in section and "unstable" not in section
    # Every missing figure says why; each applied fusion is listed with its codemod's words (or that it has none).
    assert all(why in section for why in fusion["missing"].values())
    assert f"- `fused_rms_norm`: {CODEMODS['fused_rms_norm'].DESCRIPTION}" in section
    assert f"- `{UNKNOWN}`: no description" in section
    report = json.loads((tmp_path / "run" / "report.json").read_text())["fusion"]
    assert report["decode_ms"]["with"] == ms["with"] and report["decode_ms"]["without"] == ms["without"]
    assert report["ops_per_step"]["before"] == ops["before"] and report["bytes_per_layer"]["after"] == 30720
    assert report["applied"] == fusion["applied"] and set(report["notes"]) == set(fusion["applied"])


def test_the_report_marks_a_spread_fusion_gain_and_lays_changed_tokens_at_the_fusions_door(tmp_path):
    problem = "the fusions change the tokens: without them the tokens equal eager's, with them they differ from " \
              "Decode step 3"
    fusion = _fusion(unstable=True, speedup={"median": 1.5, "min": 0.6, "max": 2.4}, problems=[problem],
                     tokens={"unfused_equal_eager": True, "fused_equal_unfused": False, "first_divergent_step": 3})
    section = _section(write_report(_state(tmp_path, fusion, passed=False, tokens_equal=False,
                                           first_divergent_step=3, problems=["tokens differ from eager"])))
    assert "1.50x, **unstable** [0.60, 2.40]" in section and "**1.50x**" not in section
    assert "cannot be quoted" in section and f"**{problem}.**" in section
    assert "they differ from Decode step 3" in section


def test_no_fusions_no_section(tmp_path):
    path = write_report(_state(tmp_path, {}))
    assert "## Kernels and memory traffic" not in path.read_text() and "without the fusions" not in path.read_text()
    assert json.loads((tmp_path / "run" / "report.json").read_text())["fusion"] == {}


def test_the_batch_summary_notes_the_fusions_gain(tmp_path):
    for name in ("fused", "plain"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "harness.py").write_text("")
    (tmp_path / "batch.toml").write_text("[[target]]\npath = 'fused'\n[[target]]\npath = 'plain'\n")
    manifest = load_manifest(tmp_path / "batch.toml", out=tmp_path / "out")
    reports = {"fused": {"decode_speedup": 2.0, "fusion": _fusion(unstable=True)}, "plain": {"decode_speedup": 1.5}}
    rows = [make_row(target, JobOutcome(target.name, 0, report=reports[target.name]), "verified", manifest.out,
                     "local") for target in manifest.targets]
    assert [(row["fusion_speedup"], row["fusion_speedup_unstable"]) for row in rows] == [(1.5, True), (None, None)]
    write_summary(manifest, rows, [], chart=False)
    text = (manifest.out / "summary.md").read_text()
    assert ("Fusions: Decode without them over Decode with them, timed in the same runs: "
            "fused 1.50x (unstable, not to be quoted).") in text


def test_fusions_of_names_the_fusion_codemods_and_passes_over_names_not_in_the_chain():
    assert nodes.fusions_of(["hoist_item", "merged_projections", UNKNOWN, "fused_rms_norm"]) == [
        "merged_projections", "fused_rms_norm"]


def test_the_report_gives_the_estimate_at_the_sizes_run_and_at_the_full_configs(tmp_path):
    as_run = {"sizes": {"hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 172, "layers": 2,
                        "max_seq_len": 64, "dtype_bytes": 4}, "batch": 1, "kv_len": 64, "dtype_bytes": 4}
    full = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
            "max_position_embeddings": 4096, "torch_dtype": "float16"}
    estimate = estimates(as_run, full, ["fused_rms_norm", "merged_projections"])
    section = _section(write_report(_state(tmp_path, _fusion(estimate=estimate))))
    rows = [line for line in section.splitlines() if line.startswith(("| as run", "| full config"))]
    assert len(rows) == 2 and "hidden 64, 4 heads (2 KV)" in rows[0] and "hidden 4096, 32 heads (32 KV)" in rows[1]
    assert "| 1, 4096 |" in rows[1] and "2-byte values" in rows[1]
    # The fusions take intermediates away and nothing else: the total falls by exactly what they save.
    pair = estimate["full"]
    saved = pair["before"]["intermediates"] - pair["after"]["intermediates"]
    assert saved > 0 and pair["before"]["total"] - pair["after"]["total"] == saved
    assert pair["before"]["weights"] == pair["after"]["weights"]
    assert "No full-size config is known" not in section
    only_run = _section(write_report(_state(tmp_path, _fusion(estimate=estimates(as_run, None, ["fused_rms_norm"])))))
    assert "| as run" in only_run and "| full config" not in only_run and "No full-size config is known" in only_run
