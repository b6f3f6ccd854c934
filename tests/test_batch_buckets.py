"""Batch buckets (`--batch-buckets`): real torch, the bundled example, real worker processes.

No expected number is hard-coded: the checks are properties (real rows unchanged, one capture per
bucket, a leak between rows caught, bad input refused with one line).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphmode.agent import cli
from graphmode.agent.errors import UserError
from graphmode.agent.workflow import nodes
from graphmode.agent.workflow.state import Baseline
from graphmode.runners.backends import resolve
from graphmode.runners.harness import load_harness, next_token_logits
from graphmode.runners.run_settings import parse_buckets
from graphmode.runners.subprocess_run import run_worker
from graphmode.runners.verify.batch_buckets import pad_batch, run_sweep
from graphmode.runners.verify.verify import DEFAULT_LOGITS_ATOL, _bucket_problems
from graphmode.runners.workers.common import WorkerFailure

PROJECT_ROOT = Path(__file__).resolve().parents[1]

EXAMPLE = PROJECT_ROOT / "examples" / "legacy_llm"


# --- the flag -----------------------------------------------------------------------------------

def test_parse_buckets_sorts_and_keeps_every_size():
    assert parse_buckets("8,1,4,2") == [1, 2, 4, 8]
    assert parse_buckets(" 3 ") == [3]


@pytest.mark.parametrize("text, says", [
    ("1,x", "'x' is not a positive integer"),
    ("0,2", "'0' is not a positive integer"),
    ("-2", "'-2' is not a positive integer"),
    ("1.5", "'1.5' is not a positive integer"),
    ("1,,2", "'' is not a positive integer"),
    ("2,4,2", "batch size 2 given more than once"),
    ("", "no batch sizes given"),
])
def test_bad_batch_buckets_exit_2_with_one_line(text, says, capsys):
    # An unknown backend after it: were the flag not checked first, the message would name the backend.
    code = cli.main(["adapt", str(EXAMPLE), "--yes", "--batch-buckets", text, "--backend", "no-such-backend"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "--batch-buckets" in err and says in err


def test_a_batch_larger_than_the_largest_bucket_is_refused():
    # Early, in analyze, from the probe's prompt shape...
    with pytest.raises(UserError, match="batch of 3, larger than the largest bucket"):
        nodes.check_batch_fits([1, 2], Baseline(prompt_shape=[3, 8]))
    nodes.check_batch_fits([1, 2], Baseline(prompt_shape=[2, 8]))
    nodes.check_batch_fits([], Baseline(prompt_shape=[3, 8]))
    # ...and by the sweep itself, before it runs anything.
    prompt = load_harness(EXAMPLE).make_prompt().expand(3, -1)
    with pytest.raises(WorkerFailure, match="batch of 3, larger than the largest bucket"):
        run_sweep(torch.nn.Identity(), prompt, [1, 2], 4, resolve("eager")[0], EXAMPLE, torch.zeros(0))


def test_padding_rows_are_other_tokens_and_the_same_every_time():
    prompt = load_harness(EXAMPLE).make_prompt()
    padded = pad_batch(prompt, 4)
    assert padded.shape == (4, prompt.shape[1]) and torch.equal(padded[:1], prompt)
    assert all(not torch.equal(padded[i], prompt[0]) for i in range(1, 4))
    assert 0 <= int(padded.min()) and int(padded.max()) <= int(prompt.max())
    assert torch.equal(padded, pad_batch(prompt, 4))


# --- end to end: `graphmode adapt --batch-buckets 1,2` -------------------------------------------

@pytest.fixture(scope="module")
def bucketed_run(tmp_path_factory) -> Path:
    """One whole adapt of the example with buckets 1,2 (the real batch is 1), as a user runs it."""
    tmp = tmp_path_factory.mktemp("buckets")
    env = {**os.environ, "GRAPHMODE_HOME": str(tmp / "home")}
    done = subprocess.run([sys.executable, "-m", "graphmode.agent.cli", "adapt", str(EXAMPLE), "--yes", "--backend",
                           "eager", "--runs", "1", "--batch-buckets", "2,1", "--out", str(tmp / "out")],
                          capture_output=True, text=True, env=env, cwd=tmp, stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "out" / EXAMPLE.name


@pytest.mark.slow
def test_buckets_leave_real_rows_unchanged_and_are_reported(bucketed_run):
    # The static buffers hold the largest bucket: the adapted model's setup_caches sizes them (report.md says so).
    assert "def setup_caches(self, max_batch_size" in (bucketed_run / "adapted" / "model.py").read_text()
    report = json.loads((bucketed_run / "report.json").read_text())
    assert report["passed"], report["problems"]
    assert report["recompiles"] == 0  # the buckets' own captures are not the main run's recompiles
    buckets = report["batch_buckets"]
    assert [b["bucket"] for b in buckets] == [1, 2] and report["batch_buckets_skipped"] == []
    for b in buckets:
        assert b["real_rows"] == 1 and b["padded_rows"] == b["bucket"] - 1
        assert b["tokens_equal"] and b["first_divergent_step"] is None
        assert b["logits_max_abs_diff"] <= DEFAULT_LOGITS_ATOL
        assert b["captures"] >= 1 and b["graphs_after_warmup"] == 0
        assert b["warmup_s"] > 0 and b["decode_ms_median"] > 0 and b["peak_rss_mb"] > 0
    assert "logs/adapted.buckets.compile.log" in report["compile_logs"]
    markdown = (bucketed_run / "report.md").read_text()
    table = markdown[markdown.index("## Batch buckets"):markdown.index("## Before")]
    assert "setup_caches(max_batch_size=2)" in table
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()] == ["1", "2"]


# --- the padding check is not vacuous: a leak between rows is caught ------------------------------

LEAKY_HARNESS = """
_build_model = build_model


def build_model():
    model = _build_model()
    base = type(model)

    class Leaky(base):
        def decode(self, tokens, input_pos):
            # A bug that mixes rows: each row gets its mirror row's logits added. Unpadded (batch 1) this
            # only doubles them, so the unpadded reference has the bug too; padded, row 0 gets a padding row's.
            out = base.decode(self, tokens, input_pos)
            return out + out.flip(0)

    model.__class__ = Leaky
    return model
"""


def _reference_logits(folder: Path, steps: int) -> torch.Tensor:
    """The unpadded run's (steps + 1, B, V) logits, eagerly, in this process."""
    harness = load_harness(folder)
    model, prompt = harness.build_model(), harness.make_prompt()
    length = prompt.shape[1]
    with torch.inference_mode():
        logits = [next_token_logits(model.prefill(prompt, torch.arange(length)))]
        for step in range(steps):
            token = logits[-1].argmax(-1, keepdim=True)
            logits.append(next_token_logits(model.decode(token, torch.tensor([length + step]))))
    return torch.stack(logits)


@pytest.mark.slow
def test_sweep_catches_padding_rows_leaking_into_real_rows(tmp_path, bucketed_run):
    folder = tmp_path / "leaky"
    shutil.copytree(bucketed_run / "adapted", folder)
    (folder / "harness.py").write_text((folder / "harness.py").read_text() + LEAKY_HARNESS)
    steps = 4
    torch.save(_reference_logits(folder, steps), tmp_path / "reference.pt")
    out = tmp_path / "sweep.json"
    run_worker("graphmode.runners.workers.verify_worker",
               ["--side", "adapted", "--folder", str(folder), "--steps", str(steps),
                "--backend", "eager", "--out", str(out), "--batch-buckets", "1,2",
                "--reference", str(tmp_path / "reference.pt")],
               name="buckets", timeout_s=180, log_dir=tmp_path / "logs")
    one, two = json.loads(out.read_text())["buckets"]
    assert one["bucket"] == 1 and one["tokens_equal"] and one["logits_max_abs_diff"] <= DEFAULT_LOGITS_ATOL
    assert two["bucket"] == 2 and two["padded_rows"] == 1
    assert two["logits_max_abs_diff"] > DEFAULT_LOGITS_ATOL
    # And verify turns it into a problem: the run is "not verified".
    problems = _bucket_problems([one, two], DEFAULT_LOGITS_ATOL)
    assert problems and all(p.startswith("batch bucket 2") for p in problems)
