"""Tests for the probe's triage (runners/probe.py): real torch, real subprocess workers.

The example is the bundled legacy model; the clean and the mismatching targets are tiny
harness folders written here, following the contract in examples/legacy_llm/harness.py.
No expected value is a hard-coded number: every check is a property of the files or of
the probe's own figures.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from runners import backends
from runners.backends import BackendUnavailable
from runners.probe import probe
from runners.subprocess_run import PROJECT_ROOT

EXAMPLE = PROJECT_ROOT / "examples" / "legacy_llm"
STAGE_NAMES = ["aot_eager", "force_eager", "backend"]

TINY_MODEL = '''\
import torch
from torch import nn


class Tiny(nn.Module):
    """Static shapes, positions as a tensor, no host syncs: nothing for Dynamo to trip on."""

    def __init__(self, vocab: int = 48, dim: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, vocab)

    def forward(self, tokens, positions):
        h = self.emb(tokens) + 0.01 * positions.float().unsqueeze(-1)
        h = torch.tanh(h)
        {branch}
        return self.proj(h)
'''

CLEAN_BRANCH = "pass"
# Lesson 5: library code that branches on is_compiling() takes another path when compiled.
COMPILING_BRANCH = ("if torch.compiler.is_compiling():\n"
                    "            h = h * 2  # compiled keeps a scale that eager drops")

TINY_HARNESS = '''\
import torch

from model import Tiny

SOURCES = ["model.py"]
MAX_SEQ_LEN = 32


def build_model():
    torch.manual_seed(0)
    return Tiny().eval()


def make_prompt():
    return torch.randint(0, 48, (1, 5), generator=torch.Generator().manual_seed(1))


def prefill(model, tokens):
    logits = model(tokens, torch.arange(tokens.shape[1]))
    return logits[:, -1, :], {"pos": torch.tensor([tokens.shape[1]])}


def decode(model, token, state):
    logits = model(token, state["pos"])
    return logits[:, -1, :], {"pos": state["pos"] + 1}
'''


def _target(folder: Path, branch: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(TINY_MODEL.replace("{branch}", branch))
    (folder / "harness.py").write_text(TINY_HARNESS)
    return folder


def _stages(report: dict) -> dict[str, dict]:
    stages = report["triage"]["stages"]
    assert [s["name"] for s in stages] == STAGE_NAMES
    for stage in stages:
        assert stage["status"] in ("failed", "passed", "skipped")
        assert isinstance(stage["reason"], str) and stage["reason"] and "\n" not in stage["reason"]
        assert {"backend", "graph_breaks", "recompiles", "error"} <= set(stage)
    return {s["name"]: s for s in stages}


@pytest.fixture(scope="module")
def example_report() -> dict:
    return probe(EXAMPLE, steps=3, timeout_s=240)


@pytest.mark.slow
def test_example_triage_stops_at_aot_eager_with_recompiles(example_report):
    report = example_report
    triage = report["triage"]
    stages = _stages(report)
    assert triage["failed_stage"] == "aot_eager" and triage["classification"] == "recompile"
    first = stages["aot_eager"]
    assert first["status"] == "failed" and first["error"] is None
    # Stage 1 of the triage is the same run as the top-level figures.
    assert first["recompiles"] == report["recompiles"] > 0
    assert first["graph_breaks"] == report["graph_breaks"]
    assert stages["force_eager"]["status"] == stages["backend"]["status"] == "skipped"
    assert all("aot_eager" in stages[name]["reason"] for name in ("force_eager", "backend"))


@pytest.mark.slow
def test_example_every_break_and_recompile_points_into_the_example(example_report):
    report = example_report

    def check(file: str, line: int) -> None:
        path = EXAMPLE / file
        assert path.is_file(), file
        assert 1 <= line <= len(path.read_text().splitlines()), (file, line)

    assert report["break_reasons"]
    for item in report["break_reasons"]:
        check(item["file"], item["line"])
    sites = report["recompile_sites"]
    for site in sites:
        check(site["file"], site["line"])
        assert site["count"] >= 1 and site["first_reason"] and site["last_reason"]
        assert not site["function"].startswith("torch_dynamo_resume")
    # Complete: one site per distinct source line, and together they hold every recompile.
    keys = [(s["file"], s["line"]) for s in sites]
    assert len(keys) == len(set(keys))
    assert sum(s["count"] for s in sites) == report["recompiles"] == len(report["recompile_reasons"])
    for text in report["recompile_reasons"]:
        assert any(text.endswith(f"({file}:{line})") for file, line in keys), text


@pytest.mark.slow
def test_npugraph_ex_force_eager_is_skipped_naming_torch_npu(tmp_path):
    report = probe(_target(tmp_path / "clean", CLEAN_BRANCH), steps=3, backend="npugraph_ex", timeout_s=180)
    stages = _stages(report)
    assert stages["aot_eager"]["status"] == "passed"
    assert report["graph_breaks"] == 0 and report["recompiles"] == 0
    assert stages["force_eager"]["status"] == "skipped" and "torch_npu" in stages["force_eager"]["reason"]
    assert stages["force_eager"]["graph_breaks"] is None  # nothing was run, so nothing is counted
    assert stages["backend"]["status"] == "skipped"
    assert report["triage"]["failed_stage"] is None and report["triage"]["classification"] == "ok"


@pytest.mark.slow
def test_clean_model_classifies_ok_under_inductor(tmp_path):
    reason = backends.get("inductor").available()
    if reason is not None:
        pytest.skip(reason)
    report = probe(_target(tmp_path / "clean", CLEAN_BRANCH), steps=3, backend="inductor", timeout_s=180)
    stages = _stages(report)
    assert [stages[name]["status"] for name in STAGE_NAMES] == ["passed"] * 3
    assert stages["backend"]["reason"] == "same as force_eager"
    for name in ("aot_eager", "force_eager"):
        stage = stages[name]
        assert stage["graph_breaks"] == 0 and stage["recompiles"] == 0 and stage["error"] is None
        assert stage["logits_max_abs_diff"] <= report["triage"]["logits_atol"]
    assert report["triage"]["failed_stage"] is None and report["triage"]["classification"] == "ok"


@pytest.mark.slow
def test_is_compiling_branch_is_a_mismatch_at_aot_eager(tmp_path):
    folder = _target(tmp_path / "branching", COMPILING_BRANCH)
    report = probe(folder, steps=3, backend="aot_eager", timeout_s=180)
    stages = _stages(report)
    first = stages["aot_eager"]
    assert first["status"] == "failed" and first["graph_breaks"] == 0 and first["recompiles"] == 0
    assert first["logits_max_abs_diff"] > report["triage"]["logits_atol"]
    assert report["triage"]["failed_stage"] == "aot_eager" and report["triage"]["classification"] == "mismatch"
    assert stages["backend"]["status"] == "skipped"


@pytest.mark.slow
def test_custom_op_without_fake_impl_is_a_compile_error(tmp_path):
    """A custom op runs eagerly but cannot be traced without a fake (meta) implementation."""
    folder = _target(tmp_path / "custom_op", "h = twice(h)")
    model_py = folder / "model.py"
    model_py.write_text(model_py.read_text().replace("from torch import nn\n", (
        "from torch import nn\n\n\n"
        "@torch.library.custom_op('graphmode_test::twice', mutates_args=())\n"
        "def twice(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x * 2\n"), 1))
    report = probe(folder, steps=2, timeout_s=180)
    stages = _stages(report)
    first = stages["aot_eager"]
    assert first["status"] == "failed" and first["error"] and "\n" not in first["error"]
    call_line = next(n for n, line in enumerate(model_py.read_text().splitlines(), 1) if "h = twice(h)" in line)
    assert f"(at model.py:{call_line})" in first["error"]
    assert report["triage"]["failed_stage"] == "aot_eager"
    assert report["triage"]["classification"] == "compile_error"
    assert stages["force_eager"]["status"] == stages["backend"]["status"] == "skipped"


def test_unknown_backend_is_refused_before_running(tmp_path):
    with pytest.raises(BackendUnavailable, match="tensorrt"):
        probe(tmp_path, steps=2, backend="tensorrt")
