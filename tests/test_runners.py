"""Tests for runners/: real torch, the real tiny example model, real subprocess workers.

Expected values are never hard-coded numbers: each check is a property (equal tokens,
finite logits, counts above or at zero, lines that exist in the files named).
"""
from __future__ import annotations

import importlib.metadata
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adapted_files import write_adapted

from graphmode.agent.workflow.report.write import write_report
from graphmode.agent.workflow.state import Baseline, RunOptions, RunState
from graphmode.runners import backends
from graphmode.runners.backends import BACKEND_NAMES, BackendUnavailable, resolve
from graphmode.runners.harness import HarnessError, load_harness, next_token_logits
from graphmode.runners.measure.dynamo_watch import parse_recompile_message
from graphmode.runners.probe.probe import probe
from graphmode.runners.subprocess_run import WorkerError, run_worker
from graphmode.runners.verify.verify import (VerificationError, _check_own_harness, _own_harness_problems, _run_side,
                                            verify)
from graphmode.runners.workers.common import ERROR_PREFIX
from graphmode.transforms.codemods import CODEMODS, Options
from graphmode.transforms.pipeline import adapt_source

PROJECT_ROOT = Path(__file__).resolve().parents[1]

EXAMPLE = PROJECT_ROOT / "examples" / "legacy_llm"
HAND_ADAPTED_MODEL = Path(__file__).parent / "fixtures" / "adapted_tiny" / "model.py"


@pytest.fixture(scope="session")
def adapted(tmp_path_factory) -> Path:
    """The hand-adapted model beside the example's own harness, laid out as graphmode lays out adapted/."""
    folder = tmp_path_factory.mktemp("adapted_tiny")
    shutil.copy(HAND_ADAPTED_MODEL, folder / "model.py")
    shutil.copy(EXAMPLE / "harness.py", folder / "harness.py")
    return folder


def _line_of(path: Path, text: str) -> int:
    """1-based line of the first line containing `text` (so tests never hard-code lines)."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


# --- backends ---------------------------------------------------------------------------

def test_auto_picks_cudagraphs_with_cuda_else_inductor():
    backend, reason = resolve("auto")
    expected = "cudagraphs" if torch.cuda.is_available() else "inductor"
    assert backend.name == expected
    assert expected in reason and "\n" not in reason


@pytest.mark.parametrize("name", ["npugraph_ex", "ge"])
def test_npu_backends_refuse_with_a_reason(name):
    reason = backends.get(name).available()
    assert reason is not None and name in reason and "torch_npu" in reason
    with pytest.raises(BackendUnavailable) as info:
        resolve(name)
    message = str(info.value)
    assert "\n" not in message and all(valid in message for valid in BACKEND_NAMES)


def test_unknown_backend_is_a_value_error_listing_valid_names():
    with pytest.raises(ValueError) as info:
        resolve("tensorrt")
    assert isinstance(info.value, BackendUnavailable)
    assert "tensorrt" in str(info.value) and "aot_eager" in str(info.value)


def test_cudagraphs_availability_follows_torch_cuda():
    reason = backends.get("cudagraphs").available()
    assert (reason is None) == torch.cuda.is_available()
    if reason is not None:
        assert "CUDA" in reason


def test_cpu_backend_compiles_static_and_matches_eager():
    torch._dynamo.reset()
    backend, _ = resolve("aot_eager")
    x = torch.randn(4, 8)
    compiled = backend.compile(lambda t: torch.softmax(t * 2, dim=-1), fullgraph=True)
    torch.testing.assert_close(compiled(x), torch.softmax(x * 2, dim=-1))
    backend.synchronize()  # a no-op on CPU, but it must exist and not raise


# --- harness ----------------------------------------------------------------------------

def test_load_harness_on_the_example():
    harness = load_harness(EXAMPLE)
    model = harness.build_model()
    assert not model.training
    prompt = harness.make_prompt()
    assert prompt.dtype == torch.long and prompt.dim() == 2


def test_missing_harness_file(tmp_path):
    with pytest.raises(HarnessError, match="no harness.py"):
        load_harness(tmp_path)


def test_harness_that_raises_names_file_line_and_exception(tmp_path):
    (tmp_path / "harness.py").write_text("import torch\n\nraise KeyError('no weights here')\n")
    with pytest.raises(HarnessError) as info:
        load_harness(tmp_path)
    message = str(info.value)
    assert f"{(tmp_path / 'harness.py').resolve()}:3" in message
    assert "KeyError" in message and "no weights here" in message and "\n" not in message


def test_harness_missing_functions_are_named(tmp_path):
    (tmp_path / "harness.py").write_text("def build_model():\n    pass\n")
    with pytest.raises(HarnessError) as info:
        load_harness(tmp_path)
    assert all(name in str(info.value) for name in ("make_prompt", "prefill", "decode"))


def test_next_token_logits_rule():
    logits = torch.randn(2, 5, 11)
    assert torch.equal(next_token_logits(logits), logits[:, -1, :])
    assert torch.equal(next_token_logits((logits, "cache")), logits[:, -1, :])
    with pytest.raises(HarnessError):
        next_token_logits(torch.randn(2, 11))


def test_adapted_fixture_has_original_weights_and_idempotent_first_decode(adapted):
    """The reasoning worker.run_adapted relies on: the same seed gives the same weights, and
    running Decode twice at the first position (explain, then the real step) changes nothing."""
    original = load_harness(EXAMPLE).build_model()
    harness = load_harness(adapted)
    model = harness.build_model()
    for (name, a), (_, b) in zip(original.named_parameters(), model.named_parameters()):
        assert torch.equal(a, b), name
    prompt = harness.make_prompt()
    length = prompt.shape[1]
    with torch.inference_mode():
        token = next_token_logits(model.prefill(prompt, torch.arange(length))).argmax(-1, keepdim=True)
        once = next_token_logits(model.decode(token, torch.tensor([length])))
        twice = next_token_logits(model.decode(token, torch.tensor([length])))
        following = model.decode(once.argmax(-1, keepdim=True), torch.tensor([length + 1]))
        # Reference: a fresh model that decoded the first position only once.
        fresh = harness.build_model()
        fresh.prefill(prompt, torch.arange(length))
        fresh.decode(token, torch.tensor([length]))
        reference = fresh.decode(once.argmax(-1, keepdim=True), torch.tensor([length + 1]))
    assert torch.equal(once, twice)
    assert torch.equal(following, reference)


# --- Dynamo bookkeeping -----------------------------------------------------------------

def test_parse_recompile_message_takes_newest_guard_and_user_line():
    message = (
        "Recompiling function decode in /x/harness.py:36\n"
        "    triggered by the following guard failure(s):\n"
        "    - 1/1: state['pos'] == 9                     # logits = model(...)  # x/harness.py:38 in decode\n"
        "    - User stack trace:\n"
        '    -   File "/x/harness.py", line 38, in decode\n'
        "    -     logits = model(...)\n"
        "    - 1/0: state['pos'] == 8                     # logits = model(...)  # x/harness.py:38 in decode\n"
        '    -   File "/x/other.py", line 99, in decode\n')
    reason = parse_recompile_message(message, root=Path("/x"))
    assert ((reason.reason, reason.file, reason.line, reason.function)
            == ("state['pos'] == 9", "harness.py", 38, "decode"))


# --- workers (subprocesses) --------------------------------------------------------------

@pytest.mark.slow
def test_worker_original_side(tmp_path):
    steps = 6
    out, logits_file = tmp_path / "o.json", tmp_path / "o.pt"
    run_worker("graphmode.runners.workers.verify_worker",
               ["--side", "original", "--folder", str(EXAMPLE), "--steps", str(steps),
                "--backend", "aot_eager", "--out", str(out), "--logits", str(logits_file)],
               name="original", timeout_s=120, log_dir=tmp_path / "logs")
    result = json.loads(out.read_text())
    logits = torch.load(logits_file)
    vocab = load_harness(EXAMPLE).build_model().output.out_features
    assert result["side"] == "original" and result["backend"] == "eager"
    assert len(result["tokens"]) == 1 and len(result["tokens"][0]) == steps
    assert len(result["decode_ms"]) == steps and all(ms > 0 for ms in result["decode_ms"])
    assert result["prefill_ms"] > 0 and result["load_s"] > 0 and result["warmup_s"] > 0
    assert logits.shape == (steps + 1, 1, vocab) and torch.isfinite(logits).all()
    # Each fed token is the greedy choice from the previous call's logits.
    assert result["tokens"][0] == logits[:steps, 0].argmax(-1).tolist()
    assert set(result["env"]) >= {"torch", "python", "platform", "device", "threads", "torch_npu", "cann",
                                  "transformers"}
    assert result["env"]["transformers"] == importlib.metadata.version("transformers")  # the release the worker ran
    # The timed second generation repeats the first pass's tokens and adds the last step's choice.
    assert result["new_tokens"] == steps + 1 and result["generation_s"] > 0
    assert result["batch"] == 1 and result["dtype"] == "float32" and result["model"] == "model.Transformer"
    assert result["peak_rss_mb"] > 0 and result["peak_device_mb"] is None
    assert result["worker_s"] > result["load_s"] and result["process_s"] >= result["worker_s"] - 0.05
    assert (tmp_path / "logs" / "original.stderr.log").exists()


@pytest.mark.slow
def test_worker_error_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "graphmode.runners.workers.verify_worker", "--side", "original",
         "--folder", str(tmp_path), "--steps", "2", "--backend", "eager", "--out", str(tmp_path / "o.json")],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX) and "no harness.py" in lines[0]


@pytest.mark.slow
def test_worker_counts_recompiles_and_detects_the_limit(tmp_path, adapted):
    """An adapted copy whose decode bumps a Python int attribute: Dynamo guards module ints
    as constants, so every step recompiles until recompile_limit (lesson 4)."""
    folder = tmp_path / "recompiling"
    shutil.copytree(adapted, folder)
    model_py = folder / "model.py"
    source = model_py.read_text()
    old = "    def decode(self, tokens, input_pos):\n        return self(tokens, input_pos)\n"
    assert old in source
    model_py.write_text(source.replace(old, (
        "    def decode(self, tokens, input_pos):\n"
        "        self.calls = getattr(self, 'calls', 0) + 1\n"
        "        return self(tokens, input_pos) * (1 + 0 * self.calls)\n")))
    steps = torch._dynamo.config.recompile_limit + 3
    out = tmp_path / "a.json"
    compile_log = tmp_path / "adapted.compile.log"
    run_worker("graphmode.runners.workers.verify_worker",
               ["--side", "adapted", "--folder", str(folder), "--steps", str(steps),
                "--backend", "eager", "--out", str(out), "--compile-log", str(compile_log)],
               name="adapted", timeout_s=180, env={"TORCH_LOGS": "graph_breaks,recompiles"})
    result = json.loads(out.read_text())
    # The compile log keeps Dynamo's own recompile records (the watch's counting is unaffected).
    assert compile_log.read_text().count("Recompiling function") >= result["recompiles"]
    assert result["graph_breaks"] == 0 and result["fullgraph"] is True
    assert result["recompiles"] >= 1 and result["graphs_after_warmup"] >= 1
    assert len(result["stance_failures"]) == 1  # the stance caught the first one, then stood down
    assert result["recompile_limit_hit"] is True
    calls_line = _line_of(model_py, "self.calls = getattr")
    assert all(d["file"] == "model.py" and d["line"] == calls_line for d in result["recompile_details"])
    assert all("self.calls" in text for text in result["recompile_reasons"])
    assert len(result["tokens"][0]) == steps  # the run finished eagerly after the limit


@pytest.mark.slow
def test_probe_failure_is_a_one_line_error(tmp_path):
    with pytest.raises(WorkerError, match="no harness.py"):
        probe(tmp_path, steps=2, timeout_s=120)


# A fusion codemod: the report lists it with its own words.
FUSION_NAME = "fused_rms_norm"


@pytest.fixture(scope="module")
def verified(tmp_path_factory, adapted):
    """The hand-adapted copy verified, with graphmode's own adaptation of the example without its fusions as the
    side "without the fusions": two adaptations of one model, so the third side's plumbing is tested for one more
    compile only."""
    logs = tmp_path_factory.mktemp("verify-logs")
    unfused = tmp_path_factory.mktemp("adapted_unfused")
    shutil.copy(EXAMPLE / "harness.py", unfused / "harness.py")
    source = (EXAMPLE / "model.py").read_text()
    adaptation = adapt_source(source, "model.py", {name for name, codemod in CODEMODS.items() if not codemod.FUSION},
                              Options(entry_class="Transformer", max_seq_len=64))
    assert adaptation.changed and "split_decode" in adaptation.applied
    write_adapted(unfused, {"model.py": adaptation.adapted})
    return verify(EXAMPLE, adapted, "aot_eager", steps=32, timeout_s=300, log_dir=logs, runs=1,
                  unfused_dir=unfused, fusions=[FUSION_NAME]), logs


@pytest.mark.slow
def test_verify_hand_adapted_copy_passes_the_harness_and_the_battery_names_what_it_dropped(verified):
    result, logs = verified
    # The hand-written copy replaces the original's code instead of adding to it (gpt-fast style): the harness's
    # sequence verifies, and the battery says which of the original's uses it no longer supports.
    # Its own harness (the original's loop, which passes ints) no longer runs on it either, and the verdict says so.
    battery_problems = [p for p in result.problems if p.startswith("equivalence battery: ")]
    own = [p for p in result.problems if p.startswith("the model's own harness fails on the adapted sources: ")]
    assert result.problems == own + battery_problems and len(own) == 1 and not result.passed
    failed = {row["name"] for row in result.battery if row["status"] == "failed"}
    assert "the model's own loop, batch 3, 8 steps" in failed
    assert {row["name"] for row in result.battery if row["status"] == "held"} >= {
        "prompt 8 + 55 steps: the last slot of 64"}
    assert result.tokens_equal and result.first_divergent_step is None
    assert result.graph_breaks == 0 and result.recompiles == 0 and not result.recompile_limit_hit
    assert result.adapted["graphs_at_warmup"] >= 1 and result.adapted["graphs_after_warmup"] == 0
    assert len(result.logits_max_abs_diff_per_step) == 33
    assert result.logits_max_abs_diff == max(result.logits_max_abs_diff_per_step) <= result.logits_atol
    assert len(result.original["tokens"][0]) == 32 == len(result.adapted["tokens"][0])


@pytest.mark.slow
def test_verify_result_is_json_and_timings_are_consistent(verified):
    result, logs = verified
    data = json.loads(result.model_dump_json())
    assert data["tokens_equal"] is True and data["backend"] == "aot_eager"
    assert result.passed is False and all(row["status"] in ("held", "failed", "n/a") for row in data["battery"])
    for side in ("eager", "graph"):
        t = data[side]
        assert t["decode_ms_min"] <= t["decode_ms_per_token"] <= t["decode_ms_max"]
        assert t["prefill_ms"] > 0 and t["warmup_s"] > 0
    assert data["decode_speedup"] == pytest.approx(
        data["eager"]["decode_ms_per_token"] / data["graph"]["decode_ms_per_token"])
    assert {p.name for p in logs.iterdir()} >= {"original.stderr.log", "adapted.stdout.log", "adapted.json"}


@pytest.mark.slow
def test_verify_times_decode_without_the_fusions_in_the_same_runs_and_the_report_shows_it(verified, tmp_path):
    result, logs = verified
    fusion = result.fusion
    assert fusion["applied"] == [FUSION_NAME] and fusion["runs"] == 1 and fusion["error"] is None
    ms = fusion["decode_ms"]
    # "with" is the verified (adapted) side's median TPOT; "without" the third side's, from its own run.
    assert ms["with"] == result.figures["graph"]["tpot_ms"]["median"] == result.graph.decode_ms_per_token
    unfused_run = json.loads((logs / "unfused.json").read_text())
    assert ms["without"] == statistics.median(unfused_run["decode_ms"][1:]) > 0
    assert ms["with_range"] == [ms["with"], ms["with"]] and ms["without_range"] == [ms["without"], ms["without"]]
    assert fusion["speedup"]["median"] == pytest.approx(ms["without"] / ms["with"])
    assert fusion["unstable"] is False  # one run per side measures no spread
    # Both adaptations choose eager's tokens; the verdict stays the adapted side's (the battery's problems only).
    assert fusion["tokens"] == {"unfused_equal_eager": True, "fused_equal_unfused": True,
                                "first_divergent_step": None}
    assert fusion["logits_max_abs_diff"]["fused_vs_unfused"] <= result.logits_atol and fusion["problems"] == []
    assert fusion["unfused"]["graph_breaks"] == 0 and fusion["unfused"]["recompiles"] == 0
    assert all(p.startswith(("equivalence battery: ", "the model's own harness fails")) for p in result.problems)
    # Its own run name and compile log, beside the adapted side's.
    assert {"unfused.json", "unfused.compile.log", "unfused.stderr.log"} <= {p.name for p in logs.iterdir()}
    assert result.compile_logs == ["adapted.compile.log", "unfused.compile.log"]
    # Every count is keyed original / before / after; whatever the workers did not count is said to be missing.
    for key in ("ops_per_step", "ops_per_layer", "layers", "bytes_per_layer"):
        assert set(fusion[key]) == {"original", "before", "after"}
    assert set(fusion["inductor_kernels"]) == {"before", "after"}
    for key in ("ops_per_step", "ops_per_layer", "layers", "bytes_per_layer", "inductor_kernels"):
        if None in fusion[key].values():
            assert key in fusion["missing"] or "decode_graph" in fusion["missing"], key

    state = RunState(session_id="fusion", options=RunOptions(target=str(EXAMPLE), run_dir=str(tmp_path / "run")),
                     applied=[], adapted_dir=str(result.adapted_dir),
                     baseline=Baseline(entry_class="Transformer",
                                       headline="not probed: this test is about the fusion figures", steps=8),
                     verification=result)
    report = json.loads((write_report(state).parent / "report.json").read_text())
    assert {"ops_per_step", "bytes_per_layer", "decode_ms", "applied", "notes"} <= set(report["fusion"])
    assert report["fusion"]["decode_ms"]["with"] == ms["with"] and report["fusion"]["decode_ms"]["without"] == \
        ms["without"]
    assert set(report["fusion"]["ops_per_step"]) >= {"before", "after"}
    assert set(report["fusion"]["bytes_per_layer"]) >= {"before", "after"}
    text = (tmp_path / "run" / "report.md").read_text()
    section = text.split("## Kernels and memory traffic")[1].split("\n## ")[0]
    assert f"| {ms['without']:.3f} [{ms['without']:.3f}, {ms['without']:.3f}] |" in section
    assert f"**{fusion['speedup']['median']:.2f}x**" in section
    assert f"- `{FUSION_NAME}`: {CODEMODS[FUSION_NAME].DESCRIPTION}" in section
    assert all(why in section for why in fusion["missing"].values())
    assert "graph without the fusions" in text.split("## Cases")[1]


def test_verify_refuses_short_runs_and_unavailable_backends_before_running(adapted):
    with pytest.raises(ValueError, match="at least 32"):
        verify(EXAMPLE, adapted, "aot_eager", steps=8)
    with pytest.raises(BackendUnavailable):
        verify(EXAMPLE, adapted, "npugraph_ex")


@pytest.mark.slow
def test_the_models_own_harness_on_the_adapted_sources_is_part_of_the_verdict(tmp_path):
    # The adapted sources' own eager code chooses other tokens (its logits reversed): the entries never run that code
    # as the original does, but the model's own harness does, and the verdict says so. A model whose forward raises
    # fails the verdict with the error.
    steps = 6
    reference = _run_side("original", 0, EXAMPLE, "aot_eager", steps, tmp_path, 120, None, None)[0].tokens
    source = (EXAMPLE / "model.py").read_text()
    last = "logits = self.output(h).float()"
    assert source.count(last) == 1
    for name, edit in (("reversed", last + ".flip(-1)"), ("raises", "raise RuntimeError('edited by hand')")):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(EXAMPLE / "harness.py", folder / "harness.py")
        (folder / "model.py").write_text(source.replace(last, edit))
        own = _check_own_harness(folder, "aot_eager", steps, tmp_path, 120, None, reference)
        problems = _own_harness_problems(own)
        assert len(problems) == 1
        if name == "reversed":
            assert own["ran"] and not own["tokens_equal"]
            assert f"chose other tokens than on the original from Decode step {own['first_divergent_step']}" \
                in problems[0]
        else:
            assert not own["ran"] and "edited by hand" in own["error"]
            assert problems[0].startswith("the model's own harness fails on the adapted sources: ")
    same = _check_own_harness(EXAMPLE, "aot_eager", steps, tmp_path, 120, None, reference)
    assert same["tokens_equal"] and _own_harness_problems(same) == []


def test_verify_reports_a_failed_worker(tmp_path):
    with pytest.raises(VerificationError, match="adapted worker failed: .*no harness.py"):
        verify(EXAMPLE, tmp_path, "aot_eager", timeout_s=120)


@pytest.mark.slow
def test_verify_kills_a_hung_worker(tmp_path):
    (tmp_path / "harness.py").write_text("import time\ntime.sleep(120)\n")
    with pytest.raises(VerificationError, match=r"adapted worker \(.*\) timed out after 3 s; it printed nothing"):
        verify(EXAMPLE, tmp_path, "aot_eager", timeout_s=3)


def test_logits_are_held_to_the_rounding_of_a_half_precision_model_and_to_the_fixed_tolerance_otherwise():
    from graphmode.runners.verify.verify import DEFAULT_LOGITS_ATOL, logits_tolerance

    logits = torch.tensor([[-320.0, 12.0], [3.0, 1.0]])
    assert logits_tolerance(DEFAULT_LOGITS_ATOL, "float32", logits) == DEFAULT_LOGITS_ATOL
    assert logits_tolerance(DEFAULT_LOGITS_ATOL, "bfloat16", logits) == 320.0 * 2.0 ** -5
    assert logits_tolerance(DEFAULT_LOGITS_ATOL, "float16", logits) == 320.0 * 2.0 ** -8
    # Small logits: the fixed tolerance still holds a floor.
    assert logits_tolerance(DEFAULT_LOGITS_ATOL, "bfloat16", torch.tensor([[0.1]])) == DEFAULT_LOGITS_ATOL
