"""graphmode.toml: what to adapt and how, in one file for interactive and batch runs."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from graphmode.agent.errors import UserError
from graphmode.agent.targets.target_file import find, load

CONVENTIONS = Path(__file__).parent / "fixtures" / "conventions"


def graphmode(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=600)


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "graphmode.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, says", [
    ("[targets]\nharness = 'harness.py'\n", "unknown table"),
    ("[run]\nbackends = 'eager'\n", "no key 'backends' .*known: backend"),
    ("[run]\nsteps = '32'\n", "steps must be a whole number"),
    ("[run]\nyes = 1\n", "yes must be true or false"),
    ("[run]\nbatch_buckets = [1, 'two']\n", "batch_buckets must be a list of whole numbers"),
    ("[target]\nhf = 'llama'\nharness = 'harness.py'\n", "give one way to build the model"),
    ("[target]\ntiny = true\n", "tiny goes with hf"),
    ("[target\n", "not valid TOML"),
])
def test_a_bad_target_file_is_refused_with_its_key_named(tmp_path, text, says):
    with pytest.raises(UserError, match=says):
        load(write(tmp_path, text))


def test_a_folder_with_a_target_file_reads_it_and_a_toml_path_is_read_as_one(tmp_path):
    path = write(tmp_path / "model", "[run]\nbackend = 'eager'\nbatch_buckets = [1, 2]\n")
    assert find(tmp_path / "model") == path and find(path) == path and find(tmp_path) is None
    loaded = load(path)
    assert loaded.run == {"backend": "eager", "batch_buckets": [1, 2]} and loaded.folder == path.parent.resolve()


def test_the_command_line_overrides_the_files_run_options(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(Path(__file__).parents[1] / "examples" / "legacy_llm", folder)
    write(folder, "[run]\nsteps = 10\n")
    done = graphmode("adapt", str(folder), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "--steps 10:" in done.stderr, done.stdout + done.stderr
    done = graphmode("adapt", str(folder / "graphmode.toml"), "--steps", "5", home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "--steps 5:" in done.stderr, done.stdout + done.stderr


def test_sources_that_do_not_exist_and_a_convention_needing_edits_are_refused(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(CONVENTIONS / "start_pos", folder)
    write(folder, "[target]\nconvention = 'start_pos'\nsources = ['modle.py']\n")
    done = graphmode("adapt", str(folder), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "sources names modle.py" in done.stderr, done.stdout + done.stderr
    write(folder, "[target]\nconvention = 'sideways'\n")
    done = graphmode("adapt", str(folder), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "convention must be one of" in done.stderr, done.stdout + done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["graphmode.toml", "model.py"]


@pytest.mark.slow
def test_a_target_file_with_a_convention_and_run_options_adapts_a_folder_without_a_harness(tmp_path):
    folder = tmp_path / "meta_style"
    shutil.copytree(CONVENTIONS / "start_pos", folder)
    write(folder, f"[target]\nconvention = 'auto'\nsources = ['model.py']\n\n"
                  f"[run]\nbackend = 'eager'\nruns = 1\nyes = true\nout = '{tmp_path / 'out'}'\n")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    done = graphmode("adapt", str(folder), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "graphmode writes one for convention start_pos (detected)" in done.stdout
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()} == before
    run = tmp_path / "out" / "meta_style"
    report = json.loads((run / "report.json").read_text())
    assert report["passed"] and report["backend"] == "eager" and report["runs"] == 1
    assert (run / "target" / "harness.py").is_file() and "split_decode" in report["changes_applied"]
