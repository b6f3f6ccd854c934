"""`graphmode batch`: a manifest of targets, each adapted in its own process, resumable, summarised.

Real runs: the bundled legacy example (eager backend, one run per side), a copy of it whose harness raises on
import, and one whose build_model hangs. The store is a GRAPHMODE_HOME of the test's own.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from graphmode.agent.batch.job import JobOutcome
from graphmode.agent.batch.manifest import load_manifest
from graphmode.agent.batch.summary import breaches, make_row, parse_fail_on, write_summary
from graphmode.agent.errors import UserError
from graphmode.runners.measure.shared_cores import WAIT_ENV

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LEGACY = EXAMPLES / "legacy_llm"


# A timing run waits this long for the cores alone (runners.measure.shared_cores) before it runs beside a neighbour:
# here the neighbour may be the target that hangs on purpose.
CORES_WAIT = {WAIT_ENV: "5"}


def graphmode(*args: str, home: Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200", **CORES_WAIT}
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=timeout)


def spawn(*args: str, home: Path, cwd: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200", **CORES_WAIT}
    with open(log, "w") as handle:
        return subprocess.Popen([sys.executable, "-m", "graphmode.agent.cli", *args], stdout=handle,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd, stdin=subprocess.DEVNULL)


def variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """A copy of the legacy example whose harness has `old` replaced by `new`."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "model.py").write_text((LEGACY / "model.py").read_text())
    harness = (LEGACY / "harness.py").read_text()
    assert old in harness
    (folder / "harness.py").write_text(harness.replace(old, new, 1))
    return folder


def broken(tmp_path: Path) -> Path:
    return variant(tmp_path, "broken", "import torch\n", "import torch\nraise RuntimeError('broken on purpose')\n")


def hanging(tmp_path: Path) -> Path:
    return variant(tmp_path, "hang", "    torch.manual_seed(0)\n", "    import time\n    time.sleep(600)\n"
                                                                      "    torch.manual_seed(0)\n")


def stored(home: Path) -> dict[str, str]:
    """name -> status of every batch row in the test's store."""
    db = home / "sessions.sqlite"
    if not db.exists():
        return {}
    connection = sqlite3.connect(db, timeout=30)
    try:
        return dict(connection.execute("SELECT name, status FROM batch_targets").fetchall())
    except sqlite3.OperationalError:  # the table is not there yet
        return {}
    finally:
        connection.close()


def wait_for(condition, what: str, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the batch ended before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{log.read_text()}"
        time.sleep(0.5)


def processes_of(home: Path) -> list[int]:
    """Live processes (adapt, its workers) started with this test's GRAPHMODE_HOME (read from /proc)."""
    marker = f"GRAPHMODE_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def gone(home: Path, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while processes_of(home):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def summary_rows(out: Path) -> list[dict]:
    return json.loads((out / "summary.json").read_text())["rows"]


MANIFEST = """\
[defaults]
backend = "eager"
runs = 1

[[target]]
path = "{legacy}"

[[target]]
path = "broken"

[[target]]
path = "hang"
{hang_run}
"""


@pytest.mark.slow
def test_a_batch_killed_half_way_resumes_skipping_what_finished_and_lists_every_target_once(tmp_path):
    broken(tmp_path)
    hanging(tmp_path)
    home, out, manifest = tmp_path / "home", tmp_path / "out", tmp_path / "manifest.toml"
    manifest.write_text(MANIFEST.format(legacy=LEGACY, hang_run=""))
    log = tmp_path / "first.log"
    batch = spawn("batch", str(manifest), "--out", str(out), "--jobs", "2", home=home, cwd=tmp_path, log=log)
    try:
        # Half-way: the legacy model verified and the broken harness refused, while the hanging one runs on.
        wait_for(lambda: stored(home).get("legacy_llm") not in (None, "running") and stored(home).get("hang") ==
                 "running", "finished target beside a running one", 400, batch, log)
        batch.kill()  # SIGKILL: no clean-up runs in the batch itself
        batch.wait(timeout=30)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert gone(home), "a target's processes outlived the killed batch"
    first = stored(home)
    said = (out / "legacy_llm" / "adapt.log").read_text()
    assert first["legacy_llm"] == "verified" and first["broken"] == "bad_input", f"{first}\n{said}"
    assert first["hang"] == "running", first  # as the batch left it
    report = out / "legacy_llm" / "legacy_llm" / "report.json"
    finished_at = report.stat().st_mtime_ns
    # Its timing runs waited for the cores alone, while the hanging target's worker held them (it sleeps inside a
    # shared claim), and then ran beside it: its report says so and calls the speed-up unstable.
    timed = json.loads(report.read_text())
    assert timed["timed_beside_other_targets"] >= 1 and timed["decode_speedup_unstable"] is True, timed
    assert "share this machine's cores" in log.read_text()

    # Run again, repeating the failures too, now with a short limit for the hanging target (a limit is not part
    # of a target's key). The verified target is skipped; the killed one, never finished, runs.
    manifest.write_text(MANIFEST.format(legacy=LEGACY, hang_run="run = { target_timeout = 8 }"))
    broken_log = (out / "broken" / "adapt.log").stat().st_mtime_ns
    again = graphmode("batch", str(manifest), "--out", str(out), "--jobs", "2", "--retry-failed", home=home,
                      cwd=tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "3 target(s), 1 done earlier, 2 to run" in again.stdout, again.stdout
    assert "skipped (done earlier): legacy_llm: verified" in again.stdout, again.stdout
    assert report.stat().st_mtime_ns == finished_at  # not run again
    assert (out / "broken" / "adapt.log").stat().st_mtime_ns != broken_log  # run again
    rows = summary_rows(out)
    assert [row["name"] for row in rows] == ["legacy_llm", "broken", "hang"]
    by_name = {row["name"]: row for row in rows}
    assert by_name["hang"]["status"] == "timeout" and by_name["broken"]["status"] == "bad_input"
    assert "broken on purpose" in by_name["broken"]["problem"]

    # The summary's figures are the target's report.json's.
    legacy = by_name["legacy_llm"]
    figures = json.loads(report.read_text())
    assert legacy["status"] == "verified" and legacy["tokens_equal"] is True
    for field, source in (("graph_breaks", "graph_breaks"), ("recompiles", "recompiles"), ("manual_items",
                          "manual_items"), ("decode_speedup", "decode_speedup"), ("warmup_s", "warmup_s"),
                          ("findings", "findings"), ("fixed_automatically", "findings_fixed"),
                          ("decode_speedup_unstable", "decode_speedup_unstable")):
        assert legacy[field] == figures[source], field
    assert 0 < legacy["fixed_automatically"] <= legacy["findings"]
    # Verified in its first round: the summary gives each target's rounds (the report's), and nothing bisected out.
    assert legacy["rounds"] == len(figures["rounds"]) == 1 and legacy["dropped"] == []
    for kind in ("report", "design", "diff"):
        assert (out / legacy[kind]).is_file(), kind
    assert (out / "summary.md").read_text().count("| legacy_llm |") == 1
    assert (out / "speedups.png").stat().st_size > 0

    # A finished manifest runs nothing, failures included (without --retry-failed): it rewrites the summary, in
    # seconds.
    started = time.monotonic()
    done = graphmode("batch", str(manifest), "--out", str(out), home=home, cwd=tmp_path)
    seconds = time.monotonic() - started
    assert done.returncode == 1 and "3 done earlier, 0 to run" in done.stdout, done.stdout + done.stderr
    assert "skipped (done earlier): broken: bad input" in done.stdout, done.stdout
    assert seconds < 10, seconds
    assert [row["name"] for row in summary_rows(out)] == ["legacy_llm", "broken", "hang"]

    # --fail-on, on a manifest of the verified target alone (the same spec in the same folder: done already).
    alone = tmp_path / "alone.toml"
    alone.write_text(MANIFEST.format(legacy=LEGACY, hang_run="").split("[[target]]\npath = \"broken\"")[0])
    speedup = legacy["decode_speedup"]
    plain = graphmode("batch", str(alone), "--out", str(out), home=home, cwd=tmp_path)
    assert plain.returncode == 0 and "1 done earlier, 0 to run" in plain.stdout, plain.stdout + plain.stderr
    above = graphmode("batch", str(alone), "--out", str(out), "--fail-on", f"speedup<{speedup * 2:.4g}", home=home,
                      cwd=tmp_path)
    assert above.returncode == 1 and "legacy_llm: Decode speed-up" in above.stdout, above.stdout + above.stderr
    half = f"{speedup / 2:.4g}"
    below = graphmode("batch", str(alone), "--out", str(out), "--fail-on", "manual", "--fail-on", f"speedup<{half}",
                      home=home, cwd=tmp_path)
    assert below.returncode == (1 if legacy["manual_items"] else 0), below.stdout + below.stderr
    assert json.loads((out / "summary.json").read_text())["fail_on"] == ["manual", f"speedup<{float(half):g}"]


def test_sigterm_stops_the_running_targets_and_leaves_them_pending(tmp_path):
    hanging(tmp_path)
    home, out, manifest = tmp_path / "home", tmp_path / "out", tmp_path / "manifest.toml"
    manifest.write_text('[defaults]\nbackend = "eager"\n\n[[target]]\npath = "hang"\n')
    log = tmp_path / "batch.log"
    batch = spawn("batch", str(manifest), "--out", str(out), home=home, cwd=tmp_path, log=log)
    try:
        # Running, and its worker (the one that hangs in build_model) started.
        wait_for(lambda: stored(home).get("hang") == "running" and len(processes_of(home)) >= 3,
                 "running target", 120, batch, log)
        batch.send_signal(signal.SIGTERM)
        assert batch.wait(timeout=60) == 130, log.read_text()
    finally:
        if batch.poll() is None:
            batch.kill()
    assert gone(home), "a target's processes outlived the batch"
    assert stored(home) == {}, stored(home)  # not done, not running: pending
    assert [(row["name"], row["status"]) for row in summary_rows(out)] == [("hang", "pending")]
    assert "interrupted" in log.read_text()
    # While it hung, the batch said where the target stood, and where its own output goes.
    assert f"hang: analyze… (its log: {out / 'hang' / 'adapt.log'})" in log.read_text()


def test_a_targets_steps_reach_the_batch_while_it_runs(tmp_path):
    """A job's lines come to the batch as the run prints them, not when it ends: here the run prints a step line as
    adapt does and then waits, and the batch stops it once the line came."""
    from graphmode.agent.batch.job import BatchJob, run_job
    from graphmode.agent.batch.run import step_line

    script = ("import time\nprint('graphmode: adapting x (session 0123abcd)', flush=True)\n"
              "print('\u2713 analyze (1.0 s): 3 findings in 1 file(s)', flush=True)\n"
              "print('  verify: eager (original) run 1 of 3: done in 2.0 s', flush=True)\ntime.sleep(60)\n")
    seen, stop = [], threading.Event()

    def progress(line: str) -> None:
        seen.append(line)
        if "run 1 of 3" in line:
            stop.set()

    outcome = run_job(BatchJob(name="t", folder=str(tmp_path / "t"), args=["-c", script], timeout_s=120), stop,
                      progress=progress)
    assert outcome.interrupted, outcome  # stopped on the line, while the run still slept
    assert [step_line(line) for line in seen] == [None, "✓ analyze (1.0 s): 3 findings in 1 file(s)",
                                                  "verify: eager (original) run 1 of 3: done in 2.0 s"]


@pytest.mark.slow
def test_a_target_runs_as_a_ray_task_and_comes_back_into_the_summary(tmp_path):
    pytest.importorskip("ray")
    broken(tmp_path)
    home, out, manifest = tmp_path / "home", tmp_path / "out", tmp_path / "manifest.toml"
    manifest.write_text('[defaults]\nbackend = "eager"\n\n[[target]]\npath = "broken"\n')
    done = graphmode("batch", str(manifest), "--out", str(out), "--executor", "ray", home=home, cwd=tmp_path,
                     timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "each task asked for num_cpus=1" in done.stdout, done.stdout  # no GPU or NPU in this cluster
    [row] = summary_rows(out)
    assert row["executor"] == "ray" and row["status"] == "bad_input" and row["exit_code"] == 2
    assert "broken on purpose" in row["problem"]
    assert stored(home) == {"broken": "bad_input"}


def write(folder: Path, text: str, name: str = "manifest.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, says", [
    ("[defaults]\nruns = 1\n[[target]\n", r"not valid TOML: .*line 3"),
    ("[default]\n[[target]]\npath = 'model'\n", "unknown table.*default"),
    ("[defaults]\n", "no targets"),
    ("[[target]]\npath = 'model'\nbackends = 'eager'\n", r"\[\[target\]\] 1 has no key 'backends'"),
    ("[[target]]\npath = 'model'\nrun = { step = 40 }\n", r"\[\[target\]\] 1 run has no key 'step'"),
    ("[defaults]\nruns = 'one'\n[[target]]\npath = 'model'\n", r"\[defaults\] runs must be a whole number"),
    ("[[target]]\npath = 'model'\n[[target]]\npath = 'model'\n", "two targets are named 'model'"),
    ("[[target]]\npath = 'nowhere'\n", "path 'nowhere' does not exist"),
    ("[[target]]\npath = 'model'\nrun = { out = 'x' }\n", "run has out"),
    ("[[target]]\npath = 'model'\nhf = 'llama'\n", "names path and hf"),
    ("[[target]]\nname = 'a/b'\npath = 'model'\n", "name must be a folder name"),
    ("[[target]]\nname = 'x'\n", "says nothing to adapt"),
    ("[[target]]\nconvention = 'start_pos'\n", "names a convention but no folder"),
    ("[[target]]\npath = 'empty'\nconvention = 'sideways'\n", "convention must be one of"),
    ("[[target]]\npath = 'empty'\n", "no harness.py in"),
    ("[[target]]\npath = 'model'\nsources = ['modle.py']\n", "sources names modle.py"),
    ("[defaults]\nbackend = 'fast'\n[[target]]\npath = 'model'\n", "backend = 'fast' must be one of"),
    ("[[target]]\npath = 'model'\nrun = { steps = 8 }\n", "steps = 8 must be at least 32"),
    ("[[target]]\nhf = './missing/config.json'\ntiny = true\n", "does not exist"),
    ("[[target]]\npath = 'model'\nrun = { compile_cache = 'TMP/model/harness.py' }\n", "is a file, not a folder"),
])
def test_a_bad_manifest_is_refused_with_what_and_where(tmp_path, text, says):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "harness.py").write_text("")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=says):
        load_manifest(write(tmp_path, text.replace("TMP", str(tmp_path))), out=tmp_path / "out")


def test_a_missing_manifest_is_bad_input_on_one_line_and_runs_nothing(tmp_path):
    done = graphmode("batch", str(tmp_path / "missing.toml"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "missing.toml: no such file" in done.stderr, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    bad = graphmode("batch", str(write(tmp_path, "[[target]]\npath = 'nowhere'\n")), "--fail-on", "fast",
                    home=tmp_path / "home", cwd=tmp_path)
    assert bad.returncode == 2 and "--fail-on 'fast'" in bad.stderr, bad.stdout + bad.stderr
    assert not (tmp_path / "graphmode-out").exists()


def test_a_targets_key_follows_its_spec_and_options_but_not_its_time_limit(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "harness.py").write_text("")
    text = "[defaults]\nruns = 1\n[[target]]\npath = 'model'\n"
    path = write(tmp_path, text)
    key = load_manifest(path).targets[0].key
    assert load_manifest(path, target_timeout=5).targets[0].key == key
    assert load_manifest(write(tmp_path, text + "run = { target_timeout = 9 }\n")).targets[0].key == key
    assert load_manifest(write(tmp_path, text + "run = { runs = 2 }\n")).targets[0].key != key
    assert load_manifest(path, overrides={"backend": "eager"}).targets[0].key != key
    assert load_manifest(path).out == (Path.cwd() / "graphmode-out" / "manifest").resolve()


def test_a_folder_with_its_own_target_file_brings_its_options(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "harness.py").write_text("")
    (tmp_path / "model" / "model.py").write_text("")
    (tmp_path / "model" / "graphmode.toml").write_text("[target]\nsources = ['model.py']\n[run]\nsteps = 40\n"
                                                       "out = 'elsewhere'\n")
    [target] = load_manifest(write(tmp_path, "[defaults]\nsteps = 33\nruns = 1\n[[target]]\npath = 'model'\n"
                                             "run = { runs = 2 }\n")).targets
    assert target.target == {"sources": ["model.py"], "harness": str((tmp_path / "model" / "harness.py").resolve())}
    assert target.run == {"yes": True, "steps": 40, "runs": 2}


def test_the_example_manifest_names_every_bundled_example_and_a_tiny_hf_model():
    manifest = load_manifest(EXAMPLES / "batch" / "manifest.toml")
    names = [t.name for t in manifest.targets]
    assert {"legacy_llm", "meta_llama", "hf_cache_api"} <= set(names)
    assert any(t.target.get("hf") == "llama" and t.target.get("tiny") for t in manifest.targets)


def test_fail_on_reads_manual_and_speedup_thresholds():
    conditions = parse_fail_on(["manual,speedup<1.5", "speedup < 2"])
    assert [str(c) for c in conditions] == ["manual", "speedup<1.5", "speedup<2"]
    rows = [{"name": "a", "manual_items": 2, "decode_speedup": 3.0}, {"name": "b", "manual_items": 0,
                                                                     "decode_speedup": 1.2}]
    said = breaches(rows, conditions)
    assert said == ["a: 2 item(s) left for a person (--fail-on manual)",
                    "b: Decode speed-up 1.20x is below 1.5x (--fail-on speedup<1.5)",
                    "b: Decode speed-up 1.20x is below 2x (--fail-on speedup<2)"]
    for bad in ("speedup>1", "speedup<", "manuals", "speedup<inf"):
        with pytest.raises(UserError, match="--fail-on"):
            parse_fail_on([bad])


def test_the_summary_marks_a_speedup_its_report_calls_unstable(tmp_path):
    for name in ("steady", "shaky"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "harness.py").write_text("")
    manifest = load_manifest(write(tmp_path, "[defaults]\nruns = 3\n[[target]]\npath = 'steady'\n"
                                             "[[target]]\npath = 'shaky'\n"), out=tmp_path / "out")
    reports = {"steady": {"decode_speedup": 2.1, "decode_speedup_unstable": False, "runs": 3},
               "shaky": {"decode_speedup": 230.63, "decode_speedup_unstable": True, "runs": 3}}
    rows = [make_row(target, JobOutcome(target.name, 0, report=reports[target.name]), "verified", manifest.out,
                     "local") for target in manifest.targets]
    summary = write_summary(manifest, rows, parse_fail_on(["speedup<500"]), chart=True)
    text = (manifest.out / "summary.md").read_text()
    assert "| 2.10x |" in text and "| 230.63x (unstable, not to be quoted) |" in text
    assert "do not quote them" in text
    assert [row["decode_speedup_unstable"] for row in summary["rows"]] == [False, True]
    said = "shaky: Decode speed-up 230.63x (unstable, not to be quoted) is below 500x (--fail-on speedup<500)"
    assert said in summary["fail_on_breaches"]
    assert (manifest.out / "speedups.png").stat().st_size > 0
    steady_only = write_summary(manifest, rows[:1], [], chart=False)
    assert "do not quote" not in (manifest.out / "summary.md").read_text() and steady_only["targets"] == 1


@pytest.mark.parametrize("spread", [False, True], ids=["steady", "spread"])
def test_every_printed_speed_figure_carries_the_qualifier_its_report_gives(tmp_path, spread):
    """The terminal's verify line, the batch progress line, the batch table and summary.md say a Decode figure is
    unstable exactly when the report does (report.json's decode_speedup_unstable, the verdict report.md's headline
    gives): one verdict and one wording for all of them."""
    from graphmode.agent.batch.run import _line
    from graphmode.agent.batch.summary import cells
    from graphmode.agent.cli.terminal import verify_line
    from graphmode.agent.workflow.report.write import write_report
    from test_fusion_report import _state

    state = _state(tmp_path, {})
    if spread:  # runs as a contended machine gives them: the speed-up anywhere between 0.24x and 50.9x
        state.verification.decode_speedup_range = {"median": 2.0, "min": 0.24, "max": 50.9}
    write_report(state)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["decode_speedup_unstable"] == spread

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "harness.py").write_text("")
    manifest = load_manifest(write(tmp_path, "[[target]]\npath = 'target'\n"), out=tmp_path / "out")
    row = make_row(manifest.targets[0], JobOutcome("target", 0, report=report, seconds=1.0), "verified",
                   manifest.out, "local")
    write_summary(manifest, [row], [], chart=False)
    printed = {"terminal verify line": verify_line(state.verification), "batch progress line": _line(row, 1, 1),
               "batch table": " | ".join(cells(row)), "summary.md": (manifest.out / "summary.md").read_text()}
    for where, text in printed.items():
        assert ("(unstable, not to be quoted)" in text) == spread, (where, text)
