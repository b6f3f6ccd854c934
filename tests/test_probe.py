"""Tests for the probe's triage (runners/probe/probe.py): real torch, real subprocess workers.

The example is the bundled legacy model; the clean and the mismatching targets are tiny
harness folders written here, following the contract in examples/legacy_llm/harness.py.
No expected value is a hard-coded number: every check is a property of the files or of
the probe's own figures.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphmode.runners import backends
from graphmode.runners.backends import BackendUnavailable
from graphmode.runners.harness import load_harness
from graphmode.runners.probe.crash import describe_crash, exception_chain
from graphmode.runners.probe.probe import probe

PROJECT_ROOT = Path(__file__).resolve().parents[1]
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


# A table buffer read through a view at positions made inside the compiled Decode: under inference mode,
# AOTAutograd on torch 2.13 cannot compile that ("Cannot set version_counter for inference tensor").
TABLE_MODEL = '''\
import torch
from torch import nn


class Tiny(nn.Module):
    """Positions as a tensor, static shapes, and already the adapted contract's entry points."""

    def __init__(self, vocab: int = 48, dim: int = 16, max_len: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, vocab)
        self.register_buffer("table", torch.linspace(0, 1, max_len * dim).view(max_len, dim))

    def forward(self, tokens, positions):
        h = self.emb(tokens) + self.table[None, positions]
        return self.proj(torch.tanh(h))

    def prefill(self, tokens, input_pos):
        return self(tokens, input_pos)

    def decode(self, tokens, input_pos):
        return self(tokens, input_pos)
'''
TABLE_LINE = "h = self.emb(tokens) + self.table[None, positions]"

INFERENCE_HARNESS = '''\
import torch

from model import Tiny

SOURCES = ["model.py"]
MAX_SEQ_LEN = 64


def build_model():
    torch.manual_seed(0)
    return Tiny().eval()


def make_prompt():
    return torch.randint(0, 48, (1, 5), generator=torch.Generator().manual_seed(1))


def prefill(model, tokens):
    logits = model(tokens, torch.arange(tokens.shape[1]))
    return logits[:, -1, :], tokens.shape[1]


{decode}
'''
DECORATED_DECODE = '''\
@torch.inference_mode()
def decode(model, token, pos):
    logits = model(token, torch.tensor([pos]))
    return logits[:, -1, :], pos + 1
'''
WITH_BLOCK_DECODE = '''\
def decode(model, token, pos):
    with torch.inference_mode():
        logits = model(token, torch.tensor([pos]))
    return logits[:, -1, :], pos + 1
'''


def _inference_target(folder: Path, decode: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(TABLE_MODEL)
    (folder / "harness.py").write_text(INFERENCE_HARNESS.replace("{decode}", decode))
    return folder


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


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
def test_example_recompiles_where_the_harness_passes_an_int_and_breaks_at_item(example_report):
    report = example_report
    assert report["entry_class"] == "Transformer" and report["entry_file"] == "model.py"
    assert report["sources"] == ["model.py"] and report["max_seq_len"] == load_harness(EXAMPLE).MAX_SEQ_LEN
    assert report["recompiles"] > 0 and len(report["recompile_reasons"]) == report["recompiles"]
    sites = {(site["file"], site["line"]) for site in report["recompile_sites"]}
    # The Python-int position is guarded where the harness passes it to the model.
    assert ("harness.py", _line_of(EXAMPLE / "harness.py", 'model(token, state["pos"]')) in sites
    # The graph breaks come from .item() calls, pointed at in model.py.
    assert report["graph_breaks"] > 0
    item_lines = {n for n, line in enumerate((EXAMPLE / "model.py").read_text().splitlines(), 1) if ".item()" in line}
    assert {r["line"] for r in report["break_reasons"] if r["file"] == "model.py"} <= item_lines
    assert any(r["line"] in item_lines for r in report["break_reasons"])


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
    # Nothing was measured: no figures, and the headline says why instead of "0 graph breaks".
    crash = report["crash"]
    assert crash["where"] == f"model.py:{call_line}" and crash["text"] == first["error"]
    assert report["graph_breaks"] is None and report["recompiles"] is None and first["graph_breaks"] is None
    assert report["measured_with"] is None and report["retry_crash"] is None  # not inference mode: no retry
    assert report["headline"] == (f"the probe of the original crashed: {crash['cause']} at model.py:{call_line}; "
                                  "no graph-break or recompile figures")


def test_unknown_backend_is_refused_before_running(tmp_path):
    with pytest.raises(BackendUnavailable, match="tensorrt"):
        probe(tmp_path, steps=2, backend="tensorrt")


# -- a probe that crashes says so ------------------------------------------------------------------

def _assert_inference_crash_measured_under_no_grad(report: dict, folder: Path) -> None:
    crash = report["crash"]
    where = f"model.py:{_line_of(folder / 'model.py', TABLE_LINE)}"
    # The innermost error and the model's line, not Dynamo's wrapper ("backend='aot_eager' raised:").
    assert crash["type"] == "RuntimeError" and "inference tensor" in crash["message"]
    assert crash["where"] == where and "BackendCompilerFailed" in crash["wrapped_in"]
    assert report["headline"].startswith(f"the probe of the original crashed: {crash['cause']} at {where}")
    # Measured again with inference mode as no_grad, and the result says so next to the figures.
    assert "torch.no_grad" in report["measured_with"] and report["measured_with"] in report["headline"]
    assert isinstance(report["graph_breaks"], int) and isinstance(report["recompiles"], int)
    assert report["headline"].endswith(f"{report['graph_breaks']} graph breaks, {report['recompiles']} recompiles")
    assert _stages(report)["aot_eager"]["crash"] is None  # the measured run itself did not crash


@pytest.fixture(scope="module")
def decorated_target(tmp_path_factory) -> Path:
    return _inference_target(tmp_path_factory.mktemp("decorated"), DECORATED_DECODE)


@pytest.mark.slow
def test_inference_mode_decorator_crash_names_its_cause_and_is_measured_under_no_grad(decorated_target):
    _assert_inference_crash_measured_under_no_grad(probe(decorated_target, steps=3, timeout_s=240), decorated_target)


@pytest.mark.slow
def test_inference_mode_block_crash_names_its_cause_and_is_measured_under_no_grad(tmp_path):
    folder = _inference_target(tmp_path / "with_block", WITH_BLOCK_DECODE)
    _assert_inference_crash_measured_under_no_grad(probe(folder, steps=3, timeout_s=240), folder)


@pytest.mark.slow
def test_design_and_report_say_the_probe_crashed(decorated_target, tmp_path):
    """The whole workflow on the crashing target: no "0 graph breaks, 0 recompiles" that was never measured."""
    env = {**os.environ, "GRAPHMODE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    # aot_eager: the probe's crash is at that stage, and verify needs no inductor compile for this test.
    done = subprocess.run([sys.executable, "-m", "graphmode.agent.cli", "adapt", str(decorated_target), "--yes",
                           "--backend", "aot_eager", "--runs", "1", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=600)
    run = tmp_path / "out" / decorated_target.name
    assert (run / "report.json").is_file(), done.stdout + done.stderr
    baseline = json.loads((run / "report.json").read_text())["baseline"]
    where = f"model.py:{_line_of(decorated_target / 'model.py', TABLE_LINE)}"
    said = f"the probe of the original crashed: {baseline['crash']['cause']} at {where}"
    assert baseline["headline"].startswith(said) and baseline["crash"]["where"] == where
    for document in ("design.md", "report.md"):
        text = (run / document).read_text()
        assert said in text and baseline["measured_with"] in text, document
    assert said in done.stdout


def test_the_chain_is_followed_to_the_innermost_error_and_its_line_in_the_folder(tmp_path):
    """Plain Python errors from a module in the folder: causes are followed, a user's `from None` is not."""
    (tmp_path / "user_code.py").write_text(
        "def lookup(table, key):\n"
        "    return table[key]\n"
        "\n\n"
        "def explained(table, key):\n"
        "    try:\n"
        "        return lookup(table, key)\n"
        "    except KeyError as error:\n"
        "        raise ValueError(f'no {key}') from error\n"
        "\n\n"
        "def hidden(table, key):\n"
        "    try:\n"
        "        return lookup(table, key)\n"
        "    except KeyError:\n"
        "        raise ValueError(f'no {key}') from None\n")
    spec = importlib.util.spec_from_file_location("user_code", tmp_path / "user_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    with pytest.raises(ValueError) as explained:
        module.explained({}, "k")
    assert [type(e).__name__ for e in exception_chain(explained.value)] == ["ValueError", "KeyError"]
    crash = describe_crash(explained.value, tmp_path)
    assert (crash.type, crash.message, crash.where) == ("KeyError", "'k'", "user_code.py:2")
    assert crash.wrapped_in == ["ValueError"] and crash.text() == "KeyError: 'k' (at user_code.py:2)"

    with pytest.raises(ValueError) as hidden:
        module.hidden({}, "k")
    crash = describe_crash(hidden.value, tmp_path)
    assert (crash.type, crash.message, crash.where, crash.wrapped_in) == ("ValueError", "no k", "user_code.py:16", [])
    # Outside the folder, no line is claimed.
    assert describe_crash(hidden.value, tmp_path / "elsewhere").where is None


def test_a_data_dependent_branch_counts_as_a_graph_break():
    """torch 2.13 counts a `print` break under counters["graph_break"] but a branch on a tensor value only under
    counters["unimplemented"]; the probe's count must see both."""
    import torch

    from graphmode.runners.workers.probe_worker import _breaks_counted

    def branch(x):
        if x.sum() > 0:
            return x * 2
        return x - 1

    def prints(x):
        print("step")
        return x + 1

    torch._dynamo.reset()
    before = _breaks_counted()
    torch.compile(branch, backend="eager")(torch.ones(3))
    after_branch = _breaks_counted()
    torch.compile(prints, backend="eager")(torch.ones(3))
    assert (after_branch - before, _breaks_counted() - after_branch) == (1, 1)
    torch._dynamo.reset()
