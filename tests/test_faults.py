"""Faults around a run: the output folder, hangs, limits checked at once, one session per folder, file modes."""
from __future__ import annotations

import json
import os
import shutil
import stat
import time

import pytest

from graphmode.agent.output import LOCK_NAME, run_folder_lock, write_adapted_tree, write_atomic
from test_workflow import EXAMPLE, graphmode


def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("not a folder\n")
    started = time.monotonic()
    done = graphmode("adapt", str(EXAMPLE), "--yes", "--backend", "eager", "--out", str(blocker / "sub"),
                     home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and f"{blocker} is a file" in done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - started < 20  # no analysis ran first


def test_steps_longer_than_the_harness_holds_are_refused_at_once(tmp_path):
    done = graphmode("adapt", str(EXAMPLE), "--yes", "--backend", "eager", "--steps", "64",
                     home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "MAX_SEQ_LEN is 64" in done.stderr


def test_a_second_session_cannot_write_into_a_folder_in_use(tmp_path):
    run_dir = tmp_path / "out" / EXAMPLE.name
    with run_folder_lock(run_dir, "abcd1234"):
        done = graphmode("adapt", str(EXAMPLE), "--yes", "--backend", "eager", "--out", str(tmp_path / "out"),
                         home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "in use by graphmode session abcd1234" in done.stderr
    assert not (run_dir / "design.md").exists()
    # The refused session left the holder's file alone; the holder removed it on its way out.
    assert not (run_dir / LOCK_NAME).exists()


def test_the_lock_file_goes_on_every_way_out_and_a_left_one_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with run_folder_lock(run_dir, "abcd1234"):
            assert (run_dir / LOCK_NAME).read_text() == "abcd1234"
            raise RuntimeError("analysis failed")
    assert not (run_dir / LOCK_NAME).exists()
    # A file left by a killed session holds no lock: the next session takes the folder.
    (run_dir / LOCK_NAME).write_text("dead0000")
    with run_folder_lock(run_dir, "efgh5678"):
        assert (run_dir / LOCK_NAME).read_text() == "efgh5678"
    assert not (run_dir / LOCK_NAME).exists()


def test_a_run_that_fails_in_analysis_leaves_no_lock_file(tmp_path):
    target = tmp_path / "target"
    shutil.copytree(EXAMPLE, target)
    harness = target / "harness.py"
    harness.write_text(harness.read_text().replace(
        "    torch.manual_seed(0)\n", "    torch.manual_seed(0)\n    raise RuntimeError('no weights here')\n", 1))
    done = graphmode("adapt", str(target), "--yes", "--backend", "eager", "--out", str(tmp_path / "out"),
                     home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "no weights here" in done.stderr, done.stdout + done.stderr
    run_dir = tmp_path / "out" / "target"
    assert run_dir.is_dir() and not (run_dir / LOCK_NAME).exists(), sorted(p.name for p in run_dir.iterdir())


@pytest.mark.slow
def test_a_hanging_decode_is_stopped_and_reported_with_its_step_and_last_line(tmp_path):
    target = tmp_path / "hangs"
    shutil.copytree(EXAMPLE, target)
    harness = target / "harness.py"
    text = harness.read_text()
    assert "def decode(" in text
    harness.write_text("import time as _time\n" + text.replace(
        "def decode(", "def _decode(", 1) + "\n\ndef decode(*args):\n    print('decoding', flush=True)\n"
        "    _time.sleep(600)\n")
    started = time.monotonic()
    done = graphmode("adapt", str(target), "--yes", "--backend", "eager", "--timeout", "20",
                     "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "timed out after 20 s" in done.stderr and "decoding" in done.stderr and "--timeout" in done.stderr
    assert time.monotonic() - started < 120


def test_run_files_take_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "report.md", "text\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == 0o644


def test_a_read_only_target_gives_a_writable_copy_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "target"
    shutil.copytree(EXAMPLE, target)
    for path in [*target.rglob("*"), target]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    dest = tmp_path / "out" / "adapted"
    try:
        write_adapted_tree(target, dest, {"model.py": "# rewritten\n"})
        assert (dest / "model.py").read_text() == "# rewritten\n"
        assert os.access(dest, os.W_OK) and stat.S_IMODE(dest.stat().st_mode) & stat.S_IWUSR
        assert not (tmp_path / "out" / ".adapted.staging").exists()
        # A rewrite that cannot be written (a path outside the copy) fails cleanly and leaves no staging.
        with pytest.raises(OSError):
            write_adapted_tree(target, dest, {"missing/deeper/model.py": "x\n"})
        assert not (tmp_path / "out" / ".adapted.staging").exists()
    finally:
        for path in [target, *target.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_a_second_run_says_it_replaces_a_finished_report(tmp_path):
    target = tmp_path / "target"
    shutil.copytree(EXAMPLE, target)
    harness = target / "harness.py"
    harness.write_text(harness.read_text().replace("    torch.manual_seed(0)\n",
                                                   "    torch.manual_seed(0)\n    raise RuntimeError('stop here')\n",
                                                   1))
    run_dir = tmp_path / "out" / "target"
    run_dir.mkdir(parents=True)
    (run_dir / "report.json").write_text(json.dumps({"session_id": "feedbeef"}))
    done = graphmode("adapt", str(target), "--yes", "--backend", "eager", "--out", str(tmp_path / "out"),
                     home=tmp_path / "home", cwd=tmp_path)
    assert "holds the report of session feedbeef; this run replaces it" in done.stdout
    assert done.returncode == 2 and "stop here" in done.stderr
