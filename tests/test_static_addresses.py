"""The capture/replay check that runs on a CPU (runners/verify/static_addresses.py): a Decode step that puts a new
tensor in a buffer's place fails verification, naming the buffer; one that writes in place passes.

Real tiny models in real worker processes: the hand-adapted example, and the same model with its cache written out of
place (tests/fixtures/moving_cache). The bundled example adapted by graphmode is held to it in
tests/test_workflow.py (report.json's `capture`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from graphmode.runners.subprocess_run import WorkerError, run_worker
from graphmode.runners.verify.results import WorkerResult
from graphmode.runners.verify.verify import _capture_problems, capture_figures

FIXTURES = Path(__file__).parent / "fixtures"
HARNESS = Path(__file__).parents[1] / "examples" / "legacy_llm" / "harness.py"
STEPS = 4  # the moved buffer shows at the first step after warm-up


def _adapted_side(tmp_path: Path, model: Path) -> WorkerResult:
    folder = tmp_path / model.parent.name
    folder.mkdir()
    shutil.copy(model, folder / "model.py")
    shutil.copy(HARNESS, folder / "harness.py")
    out = tmp_path / "adapted.json"
    # aot_eager: Dynamo and functionalisation, no code generation; what moves is the same under every backend.
    run_worker("graphmode.runners.workers.verify_worker",
               ["--side", "adapted", "--folder", str(folder), "--steps", str(STEPS),
                "--backend", "aot_eager", "--out", str(out)],
               name="adapted", timeout_s=300, log_dir=None, error=WorkerError)
    return WorkerResult.from_dict(json.loads(out.read_text()))


@pytest.mark.slow
def test_a_cache_reallocated_every_step_fails_verification_by_name(tmp_path):
    result = _adapted_side(tmp_path, FIXTURES / "moving_cache" / "model.py")
    # It compiles as well as the in-place model does: nothing else would have said anything.
    assert result.graph_breaks == 0 and result.recompiles == 0
    moved = {m["name"]: m for m in result.static_addresses["moved"]}
    caches = {f"layers.{i}.attention.kv_cache.{kv}" for i in range(2) for kv in "kv"}
    assert set(moved) == caches, moved
    assert all(m["when"] == "Decode step 1" and m["after"] not in (None, m["before"]) for m in moved.values())
    problems = _capture_problems(capture_figures([result], [], None))
    assert len(problems) == 1 and "layers.0.attention.kv_cache.k (reallocated by Decode step 1)" in problems[0]
    assert problems[0].startswith("graph run 1: 4 static tensor(s) of the model changed address after warm-up")


@pytest.mark.slow
def test_a_cache_written_in_place_keeps_every_address(tmp_path):
    result = _adapted_side(tmp_path, FIXTURES / "adapted_tiny" / "model.py")
    record = result.static_addresses
    # Every parameter and buffer watched, after each Decode step past warm-up and after the timed generation.
    assert record["moved"] == [] and record["checks"] == STEPS
    assert record["tensors"] >= len(dict(_held(tmp_path)))
    assert _capture_problems(capture_figures([result], [], None)) == []
    assert result.cuda_graphs == {}  # counted on CUDA only


def _held(tmp_path: Path):
    from graphmode.runners.harness import load_harness
    from graphmode.runners.verify.static_addresses import held_tensors

    model = load_harness(tmp_path / "adapted_tiny").build_model()
    return held_tensors(model).items()
