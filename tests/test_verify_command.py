"""`graphmode verify ORIGINAL ADAPTED`: verify and report alone, on a folder of adapted sources edited by hand.

The folder is `graphmode fix`'s output for the bundled example with one rewrite taken back by hand: the host read
it had moved out of the graph is put back, so the adapted Decode breaks its graph on that line, and verify must
say so with the line, list the file as edited, and leave both folders as they were.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[1] / "examples" / "legacy_llm"
# The hoisted host read `graphmode fix` writes, and the line as the original has it.
HOISTED = ("        if not torch.compiler.is_compiling():  # graphmode: eager only (a host read or print).\n"
           "            assert tokens.max().item()")
REVERTED = "        assert tokens.max().item()"


def graphmode(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=600)


def tree_fingerprint(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def fixed(tmp_path_factory) -> Path:
    """`graphmode fix` of the example, as written (no model runs)."""
    tmp = tmp_path_factory.mktemp("fixed")
    done = graphmode("fix", str(EXAMPLE), "--entry-class", "Transformer", "--out", str(tmp / "fixed"),
                     home=tmp / "home", cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "fixed"


@pytest.fixture(scope="module")
def reverted(fixed: Path, tmp_path_factory) -> dict:
    """The fixed folder with the hoisted host read taken back by hand, verified once."""
    tmp = tmp_path_factory.mktemp("reverted")
    folder = tmp / "fixed"
    subprocess.run(["cp", "-r", str(fixed), str(folder)], check=True)
    model = folder / EXAMPLE.name / "model.py"
    text = model.read_text()
    assert HOISTED in text
    model.write_text(text.replace(HOISTED, REVERTED, 1))
    line = model.read_text().splitlines().index(REVERTED + " < self.args.vocab_size, \"token id out of range\"") + 1
    before = {"original": tree_fingerprint(EXAMPLE), "adapted": tree_fingerprint(folder)}
    done = graphmode("verify", str(EXAMPLE), str(folder), "--backend", "eager", "--runs", "1",
                     "--out", str(tmp / "out"), home=tmp / "home", cwd=tmp)
    return {"done": done, "line": line, "before": before, "folder": folder,
            "run": tmp / "out" / f"{EXAMPLE.name}-verify"}


@pytest.mark.slow
def test_a_rewrite_reverted_by_hand_is_a_graph_break_on_its_line(reverted):
    done, line, run = reverted["done"], reverted["line"], reverted["run"]
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((run / "report.json").read_text())
    assert not report["passed"] and report["graph_breaks"] >= 1
    assert any(f"graph break(s) in Decode at model.py:{line}" in problem for problem in report["problems"]), \
        report["problems"]
    assert report["hand_edits"] == {"folder": str(reverted["folder"]), "written_by": "graphmode fix",
                                    "files": [{"path": "model.py", "how": "edited"}]}
    text = (run / "report.md").read_text()
    assert "**Result: not verified.**" in text and f"model.py:{line}" in text
    assert "- `model.py` (edited)" in text
    # The workers ran a copy: neither folder given was changed, not even by a __pycache__.
    assert tree_fingerprint(EXAMPLE) == reverted["before"]["original"]
    assert tree_fingerprint(reverted["folder"]) == reverted["before"]["adapted"]
    assert (run / "adapted" / "harness.py").is_file() and (run / "adapted" / "graphmode_static.py").is_file()


def test_a_folder_as_fix_wrote_it_has_no_edited_files(fixed):
    from graphmode.agent.workflow.verify_only import origin_of
    from graphmode.agent.workflow.hand_edits import edited_files

    origin = origin_of(EXAMPLE.resolve(), fixed.resolve())
    assert origin.written_by == "graphmode fix" and origin.root == fixed.resolve() / EXAMPLE.name
    assert edited_files(EXAMPLE, origin.root, origin.changes_diff, origin.prefix) == []


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (lambda tmp, fixed: [str(tmp / "nowhere"), str(fixed)], "nowhere: no such file or folder"),
        (lambda tmp, fixed: [str(EXAMPLE), str(tmp / "nowhere")], "nowhere: no such file or folder"),
        (lambda tmp, fixed: [str(EXAMPLE), str(EXAMPLE)], "must be apart from the target folder"),
        (lambda tmp, fixed: [str(fixed), str(fixed)], "no harness.py"),
        (lambda tmp, fixed: [str(EXAMPLE), str(fixed), "--out", str(fixed)], "the output must be outside"),
        (lambda tmp, fixed: [str(EXAMPLE), str(fixed), "--backend", "no-such"], "--backend no-such: unknown"),
        (lambda tmp, fixed: [str(EXAMPLE), str(fixed), "--runs", "0"], "--runs 0:"),
    ],
    ids=["missing-original", "missing-adapted", "same-folder", "no-harness", "out-inside", "backend", "runs"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, fixed, arguments, expected):
    done = graphmode("verify", *arguments(tmp_path, fixed), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert expected in done.stderr and "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "graphmode-out").exists()
