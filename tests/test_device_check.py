"""bench/device_check.py's dry run: the GPU check's own steps on the CPU at tiny sizes, so the script that runs once on
a lent GPU cannot rot between those runs. One model, the real-shape harness the script writes, and its control, one
run at the fewest Decode steps graphmode verifies, under aot_eager: the script's own work is the same under every
backend, and inductor's code generation would take this one test from about one minute to several on CI's two cores
(the dry run itself defaults to inductor). The figures it prints are not checked (timings live in bench/)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "bench" / "device_check.py"


@pytest.mark.slow
def test_the_dry_run_adapts_the_real_shape_harness_and_writes_every_field(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--dry-backend", "aot_eager",
                           "--only", "llama-3.2-1b-shape", "--out", str(out),
                           "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "device_check.json").read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # One flat folder, small files: what comes back from a device machine.
    assert sorted(p.name for p in out.iterdir()) == ["device_check.json", "device_check.log", "device_check.md"]
    env = summary["environment"]
    assert env["torch"] and env["transformers"] and env["python"] and "driver" in env and "cuda_runtime" in env
    target, control = summary["targets"]
    assert target["id"] == "llama-3.2-1b-shape/aot_eager" and target["status"] == "verified"
    assert target["passed"] and target["tokens_equal"] and target["graph_breaks"] == 0 and target["recompiles"] == 0
    assert target["variables"]["prompt_len"] == 16 and target["variables"]["decode_steps"] == 32
    assert target["variables"]["dtype"] == "float32"
    # Every figure the GPU run reports is there, as median [min, max] where it is timed.
    for side in ("eager", "graph"):
        median, low, high = target["tpot_ms"][side]
        assert low <= median <= high
    assert set(target["peak_device_mb"]) == {"eager", "graph"} and target["decode_speedup"][0] > 0
    assert target["addresses_moved"] and all(moved == [] for runs in target["addresses_moved"].values()
                                             for moved in runs)
    assert target["addresses_watched"] > 0 and target["cuda_graphs"] == {}  # CUDA graphs are counted on CUDA only
    assert target["fusion"]["applied"] and target["fusion"]["decode_ms"]["without"] > 0
    assert [b["bucket"] for b in target["batch_buckets"]] == [1, 2] and all(b["tokens_equal"]
                                                                           for b in target["batch_buckets"])
    # The control: the graph side again, on the sources the adapt wrote, against its eager tokens and times.
    assert control["id"] == "llama-3.2-1b-shape/control-aot_eager" and control["status"] == "verified"
    assert control["tokens_equal"] and control["graph_breaks"] == 0 and control["recompiles"] == 0
    assert control["runs_done"] == 1 and control["tpot_ms"]["eager"] == target["tpot_ms"]["eager"]
    assert control["addresses_moved"] == {"graph": [[]]} and control["tpot_ms"]["graph"][0] > 0
    [row] = summary["comparisons"]
    assert row["model"] == "llama-3.2-1b-shape" and row["total_speedup"] == pytest.approx(
        row["inductor_kernels_speedup"] * row["capture_replay_speedup"])
    text = (out / "device_check.md").read_text()
    assert "| llama-3.2-1b-shape/aot_eager | verified | True | 0 | 0 |" in text and env["torch"] in text
    assert "| llama-3.2-1b-shape/control-aot_eager | verified | True | 0 | 0 |" in text
