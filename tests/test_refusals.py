"""Usage errors are refused before anything heavy is imported: no torch, no transformers, no langgraph.

A refusal that waits on torch's import (seconds of CPU, more on a loaded machine) to say that `--out` names a file
is a refusal nobody wants to wait for. Each case runs `graphmode` in a fresh interpreter and reads which of the heavy
modules it had imported by the time it returned.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "legacy_llm"
HEAVY = ("torch", "transformers", "langgraph", "libcst")

_PROBE = """
import json, sys
from graphmode.agent.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "imported": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _refuse(tmp_path: Path, *argv: str) -> tuple[dict, str]:
    env = {**os.environ, "GRAPHMODE_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture()
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "not-a-folder"
    path.write_text("")
    return path


@pytest.fixture()
def broken_config(tmp_path: Path) -> Path:
    path = tmp_path / "broken" / "config.json"
    path.parent.mkdir()
    path.write_text('{"model_type": "llama",')  # cut short
    return path


@pytest.mark.parametrize(("argv", "said"), [
    (["adapt", str(EXAMPLE), "--out", "{file}"], "is a file, not a folder"),
    (["adapt", str(EXAMPLE), "--out", "{file}/below"], "is a file, not a folder"),
    (["adapt", "{tmp}/nothing-here"], "no such file or folder"),
    (["adapt", str(EXAMPLE), "--steps", "4"], "--steps 4: must be at least 32"),
    (["adapt", str(EXAMPLE), "--runs", "0"], "--runs 0: must be at least 1"),
    (["adapt", str(EXAMPLE), "--similarity", "1.5"], "a ratio between 0 and 1"),
    (["adapt", str(EXAMPLE), "--backend", "no-such-backend"], "valid names: auto"),
    (["adapt", str(EXAMPLE), "--batch-buckets", "2,x"], "'x' is not a positive integer"),
    (["adapt", str(EXAMPLE), "--compile-cache", "{file}"], "is a file, not a folder"),
    (["adapt", str(EXAMPLE), "--compile-cache", "{file}/below"], "is a file, not a folder"),
    (["adapt", str(EXAMPLE), "--tiny"], "--tiny goes with --hf"),
    (["adapt", str(EXAMPLE), "--out", str(EXAMPLE / "out")], "outside the target folder"),
    (["adapt", "--hf", "{tmp}/no/such/model"], "no such file or folder"),
    (["adapt", "--hf", str(EXAMPLE)], "no config.json"),
    (["adapt", "--hf", "{config}"], "not readable JSON"),
    (["adapt", "--hf", "{config}", "--tiny"], "not readable JSON"),
    (["adapt", "--hf", "llama", "--tiny", "--out", "{file}"], "is a file, not a folder"),
    (["resume", "nosuchid"], "no session nosuchid"),
    (["fix", "{tmp}/missing.py"], "missing.py"),
    (["scan", "{tmp}/missing"], "missing"),
    (["batch", "{tmp}/missing.toml"], "missing.toml"),
])
def test_a_usage_error_is_refused_before_torch_or_the_workflow_is_imported(tmp_path, a_file, broken_config, argv,
                                                                          said):
    argv = [a.format(file=a_file, tmp=tmp_path, config=broken_config) for a in argv]
    result, stderr = _refuse(tmp_path, *argv)
    assert result["status"] == 2, stderr
    assert said in stderr
    assert result["imported"] == [], f"{' '.join(argv)} imported {result['imported']} before refusing"


def test_resume_finds_saved_sessions_in_langgraphs_own_table_without_langgraph(tmp_path, monkeypatch):
    # The database is written by langgraph's saver, as a real session writes it; the look-up reads it without.
    from langgraph.checkpoint.base import empty_checkpoint

    from graphmode.agent.workflow.graph import open_checkpointer

    monkeypatch.setenv("GRAPHMODE_HOME", str(tmp_path / "home"))
    with open_checkpointer() as checkpointer:
        checkpointer.put({"configurable": {"thread_id": "abc12345", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})
    probe = ("import sys; from graphmode.agent.home import session_saved; "
             "print(session_saved('abc12345'), session_saved('nosuchid'), 'langgraph' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=dict(os.environ),
                          timeout=60)
    assert done.stdout.split() == ["True", "False", "False"], done.stderr


def test_help_says_the_least_steps_the_refusal_holds_to_and_why(capsys):
    from graphmode.agent.cli import main
    from graphmode.runners.run_settings import MIN_STEPS

    with pytest.raises(SystemExit):
        main(["adapt", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    steps = text.split("--steps STEPS ", 1)[1].split(" --runs", 1)[0]
    assert f"at least {MIN_STEPS}" in steps and "length thresholds" in steps, steps
