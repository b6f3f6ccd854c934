"""`graphmode fix`: the codemods alone over files and folders, written as copies or shown as diffs."""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

from graphmode.transforms.codemods.lib.helper_code import helper_module_text

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "legacy_llm"
MANUAL_FIXTURE = ROOT / "tests" / "fixtures" / "codemods" / "static_positions" / "slice_use.in.py"


def fix(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", "fix", *map(str, args)], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def _model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "models" / "legacy"
    folder.mkdir(parents=True)
    shutil.copy(EXAMPLE / "model.py", folder / "model.py")
    return folder


def test_copies_diff_and_record_and_a_second_run_changes_nothing(tmp_path):
    folder = _model_folder(tmp_path)
    original = (folder / "model.py").read_text()
    out = tmp_path / "out"
    done = fix(folder, "--out", out, "--entry-class", "Transformer")
    assert done.returncode in (0, 1), done.stderr
    assert (folder / "model.py").read_text() == original  # the original is never touched
    adapted = (out / "legacy" / "model.py").read_text()
    assert adapted != original and "def decode(" in adapted
    compile(adapted, "model.py", "exec")
    diff = (out / "changes.diff").read_text()
    assert "--- a/legacy/model.py" in diff and "+++ b/legacy/model.py" in diff
    # The helpers are not pasted into the copy: it imports them from graphmode_static.py, written beside it and
    # shown in the diff as a new file.
    assert "\nfrom graphmode_static import " in adapted and "class GraphmodeStaticPath" not in adapted
    assert (out / "legacy" / "graphmode_static.py").read_text() == helper_module_text()
    assert "--- /dev/null\n+++ b/legacy/graphmode_static.py\n" in diff
    record = json.loads((out / "fix.json").read_text())
    assert record["counts"]["rewritten"] == 1 and record["counts"]["crashed"] == 0
    [entry] = record["results"]
    assert entry["status"] == "rewritten" and entry["edits"] > 0 and "split_decode" in entry["applied"]

    again = fix(out / "legacy", "--out", tmp_path / "again", "--entry-class", "Transformer")
    assert again.returncode in (0, 1), again.stderr
    assert json.loads((tmp_path / "again" / "fix.json").read_text())["counts"]["rewritten"] == 0


def test_a_file_with_no_entry_class_is_an_item_for_a_person_and_promises_no_setup_caches(tmp_path):
    folder = _model_folder(tmp_path)  # its model class is `Transformer`: no *ForCausalLM / *LMHeadModel name
    out = tmp_path / "out"
    done = fix(folder, "--out", out)
    model = folder / "model.py"
    # One line on stderr names the file, the option and the class a harness would build (the module no other uses).
    [said] = [line for line in done.stderr.splitlines() if line.startswith(f"{model}: ")]
    assert "no entry class found" in said and "--entry-class NAME" in said and "(candidates: Transformer)" in said
    assert "1 items for a person" in done.stderr and done.returncode == 1, done.stderr  # an item: exit status 1
    [entry] = json.loads((out / "fix.json").read_text())["results"]
    [item] = entry["manual"]
    assert item["codemod"] == "split_decode" and "Transformer" in item["reason"] and entry["no_entry"]
    assert item["line"] == model.read_text().splitlines().index("class Transformer(nn.Module):") + 1
    assert f"{model}:{item['line']}: split_decode not applied" in done.stdout
    # The static path is written, with no entries and no `setup_caches`, and no comment says otherwise.
    adapted = (out / "legacy" / "model.py").read_text()
    assert "def decode(" not in adapted and "def setup_caches(" not in adapted
    mentions = [line for line in adapted.splitlines() if "setup_caches" in line]
    # (graphmode's helpers, whose docstrings explain `setup_caches`, sit in graphmode_static.py beside it)
    assert all("an entry class's `setup_caches` would" in line for line in mentions), mentions
    assert "sized by `graphmode_resize`" in adapted

    named = fix(folder, "--out", tmp_path / "named", "--entry-class", "Transformer")
    with_entry = (tmp_path / "named" / "legacy" / "model.py").read_text()
    assert f"{model}: " not in named.stderr and "def setup_caches(" in with_entry
    assert "sized by setup_caches" in with_entry


def test_diff_prints_and_writes_nothing_and_jobs_agree(tmp_path):
    folder = _model_folder(tmp_path)
    shutil.copy(MANUAL_FIXTURE, folder / "refused.py")
    one = fix(folder, "--diff", "--jobs", "1", cwd=tmp_path)
    two = fix(folder, "--diff", "--jobs", "2", cwd=tmp_path)
    assert not (tmp_path / "graphmode-fix").exists()
    assert one.stdout == two.stdout and "+++ b/legacy/model.py" in one.stdout
    assert one.stdout.count("+++ b/legacy/graphmode_static.py\n") == 1
    # An item left for a person is one line, file:line: CODEMOD reason; it makes the exit status 1.
    assert one.returncode == 1
    items = [line for line in one.stdout.splitlines() if line.startswith(str(folder / "refused.py") + ":")]
    assert items and all(line.split(":")[1].isdigit() for line in items), one.stdout
    assert "static_positions" in items[0]


def test_diff_prints_each_file_once_it_is_done_so_an_interrupted_run_keeps_them(tmp_path):
    # z_wait.py is a named pipe: reading it waits until the test writes it. a_model.py, first by path, is done
    # meanwhile, and its diff must be out while fix still waits.
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(EXAMPLE / "model.py", folder / "a_model.py")
    waits = folder / "z_wait.py"
    os.mkfifo(waits)
    proc = subprocess.Popen([sys.executable, "-m", "graphmode.agent.cli", "fix", "--diff", "--jobs", "1", str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    early = b""
    try:
        while b"+++ b/models/a_model.py" not in early:
            ready, _, _ = select.select([proc.stdout], [], [], 60)  # a guard against waiting forever, not a timing
            chunk = os.read(proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                break
            early += chunk
    finally:
        with open(waits, "w") as pipe:  # lets fix read z_wait.py and finish
            pipe.write("x = 1\n")
    rest, stderr = proc.communicate(timeout=120)
    assert b"+++ b/models/a_model.py" in early, (early + rest + stderr).decode()
    assert proc.returncode in (0, 1) and (early + rest).count(b"+++ b/models/a_model.py") == 1  # 1: items left


def test_bad_files_are_reported_and_the_rest_is_done(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "broken.py").write_text("def f(:\n    pass\n")
    (folder / "latin.py").write_bytes(b"x = '\xe9'\n")
    out = tmp_path / "out"
    done = fix(folder, "--out", out)
    assert done.returncode == 2
    assert f"{folder / 'broken.py'}: error: 1:" in done.stderr and "syntax error" in done.stderr
    assert f"{folder / 'latin.py'}: error:" in done.stderr
    counts = json.loads((out / "fix.json").read_text())["counts"]
    assert counts["unreadable"] == 2 and counts["rewritten"] == 1


def test_refusals_exit_2_and_write_nothing(tmp_path):
    folder = _model_folder(tmp_path)
    missing = fix(tmp_path / "nowhere")
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr
    inside = fix(folder, "--out", folder / "out")
    assert inside.returncode == 2 and "outside" in inside.stderr and not (folder / "out").exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    refused = fix(folder, "--out", foreign)
    assert refused.returncode == 2 and "not written by `graphmode fix`" in refused.stderr
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_files_of_one_name_in_different_folders_each_keep_their_own_copy_and_diff(tmp_path):
    # `fix a/model.py b/model.py c/model.py --out X`: three copies at X/a, X/b, X/c, each named by its own diff.
    sources = {}
    for name in ("a", "b", "c"):
        folder = tmp_path / "zoo" / name
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(f"# the copy in {name}/\n" + (EXAMPLE / "model.py").read_text())
        sources[name] = folder / "model.py"
    out = tmp_path / "out"
    done = fix(*sources.values(), sources["a"], "--out", out, "--entry-class", "Transformer", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    record = json.loads((out / "fix.json").read_text())
    assert record["files"] == 3 and record["counts"]["rewritten"] == 3  # the file given twice is fixed once
    diff = (out / "changes.diff").read_text()
    for name, source in sources.items():
        copy = (out / name / "model.py").read_text()
        assert "def decode(" in copy and copy.startswith(f"# the copy in {name}/\n")
        assert f"+++ b/{name}/model.py" in diff
