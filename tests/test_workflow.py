"""The `graphmode` command end to end, as a user runs it: real processes, the real bundled example."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from graphmode.agent.workflow import nodes

EXAMPLE = Path(__file__).parents[1] / "examples" / "legacy_llm"


def graphmode(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=600)


def fingerprint(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.py"))}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.mark.slow
def test_adapt_yes_writes_a_verified_report_and_leaves_the_example_untouched(tmp_path, home):
    before = fingerprint(EXAMPLE)
    done = graphmode("adapt", str(EXAMPLE), "--yes", "--backend", "inductor", "--runs", "2",
                     "--out", str(tmp_path / "out"), home=home, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "out" / "legacy_llm"
    report = json.loads((run / "report.json").read_text())
    assert report["tokens_equal"] and report["graph_breaks"] == 0 and report["recompiles"] == 0
    assert report["backend"] == "inductor" and report["warmup_s"] > 0
    assert set(report["decode_ms_per_token"]) == {"eager", "graph"} and report["decode_speedup"] > 0
    assert report["baseline"]["recompiles"] > 0, "the unmodified code must show why it needed adapting"
    # Decode was traced, and nothing is left for a person on its path (nothing is left at all here).
    assert report["manual_items"] == 0 and report["manual_items_run_by_decode"] == 0
    # Repeated runs: every figure per side as median [min, max], the old scalars being the medians.
    assert report["runs"] == 2 and set(report["figures"]) == {"eager", "graph"}
    for side in ("eager", "graph"):
        figures = report["figures"][side]
        for name in ("prefill_ms", "tpot_ms", "forward_tokens_per_s", "generation_tokens_per_s", "load_s",
                     "warmup_s", "load_warmup_s", "process_s", "peak_rss_mb"):
            f = figures[name]
            assert f["min"] <= f["median"] <= f["max"] and len(f["runs"]) == 2, (side, name, f)
        assert figures["tpot_ms"]["median"] == report["decode_ms_per_token"][side]
        assert figures["prefill_ms"]["median"] == report["prefill_ms"][side]
    assert report["figures"]["graph"]["warmup_s"]["median"] == report["warmup_s"]
    assert report["decode_speedup_range"]["median"] == report["decode_speedup"]
    assert report["tokens_identical_across_runs"] == {"eager": True, "graph": True}
    assert report["tokens_differing"] == 0 and report["similarity"] == 1.0 and report["similarity_threshold"] == 0.95
    variables = report["variables"]
    assert variables["model"] == "Transformer" and variables["dtype"] == "float32" and variables["batch"] == 1
    assert variables["prompt_len"] == 8 and variables["new_tokens"] == 33 and variables["runs"] == 2
    assert variables["torch_npu"] is None and variables["torch"].startswith("2.")
    assert variables["backend_options"] == {"backend": "inductor", "fullgraph": True, "dynamic": False}
    assert report["decode_chart"] == "decode_ms_per_step.png"
    # What capture/replay needs, checked on the CPU: no tensor the adapted model holds moved after warm-up, in any
    # run of either graph side; CUDA graphs are counted on CUDA only.
    addresses = report["capture"]["static_addresses"]
    assert set(addresses) == {"graph", "unfused"} and len(addresses["graph"]) == 2
    assert all(r["moved"] == [] and r["tensors"] > 0 and r["checks"] > 0 for side in addresses.values() for r in side)
    assert report["capture"]["cuda_graphs"] == {}
    # Run 1 fills a fresh compile cache in the run folder; run 2 reads it, and the report says what that saved.
    cache = report["compile_cache"]
    assert Path(cache["dir"]) == run / "compile-cache" and any((run / "compile-cache").iterdir())
    assert cache["first_run_warmup_s"] > 0 and cache["saved_s"] is not None
    assert (run / "decode_ms_per_step.png").read_bytes()[:4] == b"\x89PNG"
    assert report["compile_logs"] == ["logs/adapted.compile.log", "logs/adapted.run2.compile.log",
                                      "logs/unfused.compile.log", "logs/unfused.run2.compile.log"]
    assert all((run / log).is_file() for log in report["compile_logs"])
    # The example's norm and projections are fused (not its attention, on CPU); the adaptation without them was
    # timed in the same runs, and the captured Decode step runs fewer ops with them, in every layer.
    fusion = report["fusion"]
    assert fusion["applied"] == ["fused_rms_norm", "merged_projections"] and fusion["runs"] == 2
    assert fusion["ops_per_step"]["after"] < fusion["ops_per_step"]["before"]
    assert fusion["ops_per_layer"]["after"] < fusion["ops_per_layer"]["before"] and fusion["layers"]["after"] == 2
    assert fusion["decode_ms"]["with"] > 0 and fusion["decode_ms"]["without"] > 0
    assert fusion["tokens"]["fused_equal_unfused"] and fusion["estimate"]["as_run"]["sizes"]["hidden"] == 128
    text = (run / "report.md").read_text()
    assert "Result: verified" in text and "not wired in yet" not in text
    for heading in ("## Fixed variables", "## Steady state", "## Start-up cost", "## Output validation",
                    "## Limits of this conclusion", "](decode_ms_per_step.png)", "](logs/adapted.compile.log)",
                    "## Kernels and memory traffic"):
        assert heading in text, heading
    assert "C1." in (run / "design.md").read_text()
    assert "+++ b/model.py" in (run / "changes.diff").read_text()
    assert "def decode(self, tokens, input_pos)" in (run / "adapted" / "model.py").read_text()
    # graphmode's helper code is the module beside the adapted model, on both sides verify ran, and a new file in
    # the diff.
    assert "\nfrom graphmode_static import " in (run / "adapted" / "model.py").read_text()
    assert all((run / side / "graphmode_static.py").is_file() for side in ("adapted", "adapted-unfused"))
    assert "--- /dev/null\n+++ b/graphmode_static.py\n" in (run / "changes.diff").read_text()
    assert fingerprint(EXAMPLE) == before
    # Not a terminal: one progress line per finished verify run, and the design's plan as one diff.
    assert "verify: graph (adapted) run 2 of 2: done in" in done.stdout
    assert "verify: eager (original) run 1 of 2: done in" in done.stdout
    assert (run / "planned.diff").read_text() == (run / "changes.diff").read_text()
    _unstable_headline_is_not_quoted(run, home)


def _unstable_headline_is_not_quoted(run: Path, home: Path) -> None:
    """The same session's report, drawn again as if its runs had spread widely: the headline says the figure is
    unstable and cannot be quoted, instead of printing it in bold."""
    from graphmode.agent.workflow import nodes
    from graphmode.agent.workflow import graph as workflow

    os.environ["GRAPHMODE_HOME"] = str(home)
    try:
        with workflow.open_checkpointer() as checkpointer:
            graph = workflow.build_graph(checkpointer)
            sessions = {c.config["configurable"]["thread_id"] for c in checkpointer.list(None)}
            session = sessions.pop()
            state = workflow.saved_state(session, graph.get_state({"configurable": {"thread_id": session}}).values)
    finally:
        os.environ.pop("GRAPHMODE_HOME")
    spread = {**state.verification.decode_speedup_range, "min": 0.24, "max": 50.9}
    state = state.model_copy(update={
        "options": state.options.model_copy(update={"run_dir": str(run.parent / "redrawn")}),
        "verification": state.verification.model_copy(update={"decode_speedup_range": spread})})
    nodes.report(state)
    text = (run.parent / "redrawn" / "report.md").read_text()
    assert "**unstable**: the runs put the speed-up anywhere in [0.24, 50.90]" in text
    beside = state.model_copy(update={"verification": state.verification.model_copy(update={
        "decode_speedup_range": {**spread, "min": 1.0, "max": 1.1}, "timed_beside_other_targets": 2})})
    nodes.report(beside)
    text = (run.parent / "redrawn" / "report.md").read_text()
    assert "**unstable**: 2 timing run(s) ran while another target of the batch worked" in text
    assert json.loads((run.parent / "redrawn" / "report.json").read_text())["decode_speedup_unstable"] is True
    assert "rerun on a quiet machine" in text


def a_choice_is_refused_with_what_it_needs_and_declining_all_is_reported_honestly(
        stopped: str, out: Path, home: Path, cwd: Path) -> None:
    """Checks on a session of the example stopped at its confirmation (`stopped`: what the command printed), that
    finish it: tests/test_terminal.py's Ctrl-D at the prompt leaves one, so no analysis runs for these alone."""
    session = re.search(r"graphmode resume (\w+)\s", stopped).group(1)
    hint = re.search(r"--approve (\S+)", stopped).group(1)
    # Only the table rewrite: positions would stay Python ints and there would be no entry points. Refused, with
    # what to add; nothing the person chose is dropped silently, and the session stays at confirmation.
    partial = graphmode("resume", session, "--approve", "C2", home=home, cwd=cwd)
    assert partial.returncode == 2 and "Traceback" not in partial.stderr
    wanted = ",".join(sorted({"C2", *hint.split(",")}))
    assert "cannot run in graph mode" in partial.stderr and f"approve {wanted}" in partial.stderr.replace("\n", "")
    needs = graphmode("resume", session, "--approve", "C1,C3", home=home, cwd=cwd)
    # Each chosen change is said with all it needs, as the design and the confirmation table list them.
    assert needs.returncode == 2 and re.search(r"C3 needs [^;]*C5", needs.stderr), needs.stderr
    design = (out / EXAMPLE.name / "design.md").read_text()
    c3_needs = re.search(r"\*\*Needs:\*\* (C\d(?:, C\d)*)", design.split("### C3.")[1].split("### C4.")[0]).group(1)
    assert f"C3 needs {c3_needs};" in needs.stderr
    # Declining everything is a choice: the workflow goes from confirmation straight to the report, which says that
    # nothing was adapted or verified (exit 1); no empty implement or verify runs.
    resumed = graphmode("resume", session, "--reject-all", home=home, cwd=cwd)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "Not verified" in resumed.stdout and "Traceback" not in resumed.stderr + resumed.stdout
    assert not re.search(r"^\W*(implement|verify) \(", resumed.stdout, re.M), resumed.stdout
    assert not (out / EXAMPLE.name / "adapted").exists()
    report = json.loads((out / EXAMPLE.name / "report.json").read_text())
    assert report["passed"] is False and report["ran"] is False
    assert report["problems"] == [nodes.DECLINED_ALL]
    assert "static_positions" in report["changes_declined"]
    text = (out / EXAMPLE.name / "report.md").read_text()
    assert "every planned change was declined" in text and "Declined:" in text
    # Resumed once finished, the session answers with its own verdict, as the adapt that finished it did.
    again = graphmode("resume", session, home=home, cwd=cwd)
    assert again.returncode == 1 and "has finished, not verified" in again.stdout, again.stdout + again.stderr


@pytest.mark.extended
def test_the_choice_the_hint_suggests_verifies(tmp_path, home):
    """The subset graphmode itself suggests must give a model that runs: here it gives the original's tokens (one
    round: the repair would otherwise stop to offer what the subset left out, tests/test_terminal.py). Opt-in: CI
    adapts a subset at the terminal (test_terminal.py) and checks the hint's needs there, after Ctrl-D
    (a_choice_is_refused_with_what_it_needs_and_declining_all_is_reported_honestly)."""
    out = tmp_path / "out"
    stopped = graphmode("adapt", str(EXAMPLE), "--backend", "aot_eager", "--runs", "1", "--rounds", "1",
                        "--out", str(out), home=home, cwd=tmp_path)
    session = re.search(r"graphmode resume (\w+)\s", stopped.stdout).group(1)
    hint = re.search(r"--approve (\S+)", stopped.stdout).group(1)
    resumed = graphmode("resume", session, "--approve", hint, home=home, cwd=tmp_path)
    report = json.loads((out / EXAMPLE.name / "report.json").read_text())
    assert report.get("ran", True) and report["tokens_equal"], resumed.stdout + resumed.stderr


def _line_of(file: str, text: str) -> int:
    return (EXAMPLE / file).read_text().splitlines().index(text) + 1


def _broken_copy(tmp_path: Path, file: str, old: str, new: str) -> Path:
    target = tmp_path / "target"
    shutil.copytree(EXAMPLE, target)
    path = target / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return target


@pytest.mark.parametrize(
    "make_target, expected",
    [
        (lambda tmp: tmp / "nowhere", "no such file or folder"),
        (lambda tmp: _broken_copy(tmp, "model.py", "class RMSNorm(nn.Module):", "class RMSNorm(nn.Module)"),
         f"model.py:{_line_of('model.py', 'class RMSNorm(nn.Module):')}:"),
        (lambda tmp: _broken_copy(tmp, "harness.py", "    torch.manual_seed(0)\n",
                                  "    torch.manual_seed(0)\n    raise RuntimeError('no weights here')\n"),
         "no weights here"),
    ],
    ids=["missing-path", "syntax-error", "harness-raises"],
)
def test_bad_input_gets_one_clear_line(tmp_path, home, make_target, expected):
    done = graphmode("adapt", str(make_target(tmp_path)), "--yes", "--backend", "eager", home=home, cwd=tmp_path)
    assert done.returncode == 2
    assert expected in done.stderr and "Traceback" not in done.stderr + done.stdout
    assert len(done.stderr.strip().splitlines()) == 1


def test_non_utf8_source_and_unknown_backend_and_session(tmp_path, home):
    target = _broken_copy(tmp_path, "model.py", "import math", "import math")
    (target / "model.py").write_bytes((target / "model.py").read_bytes() + b"\n# \xff\xfe\n")
    done = graphmode("adapt", str(target), "--yes", "--backend", "eager", home=home, cwd=tmp_path)
    assert done.returncode == 2 and "not UTF-8" in done.stderr

    npu = graphmode("adapt", str(EXAMPLE), "--yes", "--backend", "npugraph_ex", home=home, cwd=tmp_path)
    assert npu.returncode == 2 and "npugraph_ex" in npu.stderr and "Traceback" not in npu.stderr

    unknown = graphmode("resume", "nosuchid", home=home, cwd=tmp_path)
    assert unknown.returncode == 2 and "no session nosuchid" in unknown.stderr


@pytest.mark.parametrize(("passed", "status"), [(True, 0), (False, 1)], ids=["verified", "not-verified"])
def test_resume_of_a_finished_session_exits_with_that_sessions_verdict(tmp_path, home, monkeypatch, passed, status):
    """The exit-status contract (README) holds for a session resumed after it finished. The session is saved as the
    report step leaves it, through the workflow's own graph and checkpointer, so no model runs."""
    from graphmode.agent.cli.terminal import session_config
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer
    from graphmode.agent.workflow.state import RunOptions, RunState, Verification

    monkeypatch.setenv("GRAPHMODE_HOME", str(home))
    run_dir = tmp_path / "out" / "legacy_llm"
    state = RunState(session_id="finished1", options=RunOptions(target=str(EXAMPLE), run_dir=str(run_dir)),
                     verification=Verification(problems=[] if passed else ["tokens differ"]),
                     report_path=str(run_dir / "report.md"))
    with open_checkpointer() as checkpointer:
        graph = build_graph(checkpointer)
        graph.update_state(session_config("finished1"), state.model_dump(), as_node="report")
        assert not graph.get_state(session_config("finished1")).next
    done = graphmode("resume", "finished1", home=home, cwd=tmp_path)
    assert done.returncode == status, done.stdout + done.stderr
    assert f"has finished, {'verified' if passed else 'not verified'}" in done.stdout


def test_a_session_saved_in_an_earlier_layout_is_refused_with_what_to_do():
    """Sessions saved before the options were nested (layout 1: every field top-level) are not misread."""
    from graphmode.agent.errors import UserError
    from graphmode.agent.workflow.graph import saved_state, saved_target
    from graphmode.agent.workflow.state import SCHEMA_VERSION, RunOptions, RunState

    earlier = {"session_id": "old1", "target": "/models/llama", "run_dir": "/out/llama", "backend": "inductor"}
    with pytest.raises(UserError, match=r"session old1 was saved by an earlier graphmode \(state layout 1, this one "
                                        rf"reads {SCHEMA_VERSION}\); start it again with `graphmode adapt "
                                        r"/models/llama`"):
        saved_state("old1", earlier)
    assert saved_target(earlier) == "/models/llama"
    current = RunState(session_id="new1", options=RunOptions(target="/models/gpt", run_dir="/out/gpt"))
    values = dict(current)  # what the checkpointer hands back: one value per field, models kept as models
    assert saved_state("new1", values) == current and saved_target(values) == "/models/gpt"
