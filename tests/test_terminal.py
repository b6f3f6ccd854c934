"""The `graphmode` session at a real terminal (a pseudo-terminal driven by pexpect): keys, answers, interruption.

The runs use the eager backend: what is checked is the session, and a round whose Decode breaks its graph compiles
again at each recompile, where aot_eager's tracing doubles that round's time."""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from test_workflow import (a_choice_is_refused_with_what_it_needs_and_declining_all_is_reported_honestly,
                           graphmode)

from graphmode.transforms.codemods import CODEMODS

pexpect = pytest.importorskip("pexpect")

EXAMPLE = Path(__file__).parents[1] / "examples" / "legacy_llm"


def _as_at_a_terminal() -> None:
    """Ctrl-C as a person's shell leaves it to a command it runs in the foreground. A suite started in the background
    of a non-interactive shell (`bash .ci/run &`) ignores SIGINT, and a child inherits that: its Ctrl-C would do
    nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(*args: str, home: Path, cwd: Path):
    # PAGER=cat: the diffs a person pages through come straight to the terminal, no `less` to quit.
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200", "TERM": "xterm", "PAGER": "cat"}
    return pexpect.spawn(sys.executable, ["-m", "graphmode.agent.cli", *args], env=env, cwd=str(cwd), encoding="utf-8",
                         timeout=600, dimensions=(50, 200), preexec_fn=_as_at_a_terminal)


def _change_ids(design: Path, *codemods: str) -> set[str]:
    """The ids the design gives the changes of these codemods (ids follow the chain, so they move as it grows)."""
    text = design.read_text()
    return {re.search(rf"### (C\d+)\. [^\n]*\(`{name}`\)", text).group(1) for name in codemods}


def _finish(child) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus if child.exitstatus is not None else 128 + child.signalstatus


def _workers_of(home: Path) -> list[int]:
    """Live worker processes (`python -m runners.workers.verify_worker ...`) of the graphmode run whose GRAPHMODE_HOME
    is `home` (read from /proc: every worker inherits graphmode's environment)."""
    found = []
    marker = f"GRAPHMODE_HOME={home}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                if b"graphmode.runners.workers.verify_worker" in line \
                        and marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_person_reads_a_diff_is_asked_for_what_a_subset_needs_revises_and_the_command_line_carries_on(tmp_path):
    """At the terminal: a change's diff, what a subset needs, a revised parameter, then Ctrl-D. The command line then
    carries on in later processes: the sessions list, a mistyped id and a wrong revision refused, a revision made
    there too, and the resume that verifies at the revised length. One analysis and one verification for both ways
    of answering a session."""
    out, home = tmp_path / "out", tmp_path / "home"
    child = _spawn("adapt", str(EXAMPLE), "--backend", "eager", "--runs", "1", "--out", str(out), home=home,
                   cwd=tmp_path)
    child.expect("Apply which changes")
    run = out / "legacy_llm"
    design = run / "design.md"
    first = design.read_text()
    # The probe's evidence is merged into the static findings: the rule's line carries what Dynamo saw.
    assert "classified as **recompile**" in first and "recompiled" in first and "graph break:" in first
    assert "Nothing: every finding has an automatic change." in first
    # The design names the transformers release it was made under (installed here, as the suite's extras pin).
    assert f"| transformers | {importlib.metadata.version('transformers')} (the release installed" in first
    cache, = _change_ids(design, "static_kv_cache")
    needs = _change_ids(design, "static_mask", "static_positions", "split_decode")
    child.sendline(f"d {cache}")  # one change's diff, through the pager
    child.expect(r"\+\+\+ b/model\.py")
    child.expect(r"self\.kv_cache\.update")
    child.expect("Apply which changes")
    child.sendline(cache)  # the cache alone needs the positions, the mask and the entry points
    child.expect(r"need[s]? (C\d(, C\d)*) too\. Add")
    assert set(child.match.group(1).split(", ")) == needs
    # The design (and the table above the question, from the same function) listed the same needs for the cache.
    section = first.split(f"### {cache}.")[1].split("\n### ")[0]
    listed = re.search(r"\*\*Needs:\*\* (C\d(?:, C\d)*)", section).group(1)
    assert set(listed.split(", ")) == needs
    child.sendline("no")  # nothing is added or dropped behind the person's back: the question comes again
    child.expect("Apply which changes")
    # A revision of a parameter the cache is built with: a wrong one is said and asked again, a right one makes the
    # design again, and the question comes back over it.
    child.sendline(f"e {cache} max_seq_len=0")
    child.expect("not a positive whole number")
    child.expect("Apply which changes")
    child.sendline(f"e {cache} max_seq_len=48")
    child.expect("revised max_seq_len=48: the design is made again")
    child.expect(r"max_seq_len=48")  # the table's parameters column
    child.expect("Apply which changes")
    child.sendeof()
    child.expect(r"graphmode resume (\w+)")
    session = child.match.group(1)
    assert _finish(child) == 4
    assert "`max_seq_len` = `48` (revised)" in design.read_text()

    # The command line, in later processes. Not a terminal: whole paths, to copy (a table would cut them).
    listed = graphmode("sessions", home=home, cwd=tmp_path)
    assert session in listed.stdout and "confirm" in listed.stdout
    assert f"{session}\t{EXAMPLE}\tconfirm" in listed.stdout, listed.stdout
    # A mistyped id is refused before the session sees it, and leaves the session as it was.
    mistyped = graphmode("resume", session, "--approve", "C9", home=home, cwd=tmp_path)
    assert mistyped.returncode == 2 and "no change C9" in mistyped.stderr and "Traceback" not in mistyped.stderr
    # A revision, checked the same way, makes the design again; the session stops for it.
    wrong = graphmode("resume", session, "--revise", f"{cache}.max_seq_len=lots", home=home, cwd=tmp_path)
    assert wrong.returncode == 2 and "not a positive whole number" in wrong.stderr and "unchanged" in wrong.stderr
    revised = graphmode("resume", session, "--revise", f"{cache}.max_seq_len=56", home=home, cwd=tmp_path)
    assert revised.returncode == 4, revised.stdout + revised.stderr
    assert "revised max_seq_len=56" in revised.stdout and f"graphmode resume {session}" in revised.stdout
    assert "`max_seq_len` = `56` (revised)" in design.read_text()
    assert (run / "designs" / "design-1.md").read_text() == first  # the first design is kept
    assert len(list((run / "designs").glob("design-*.md"))) == 3
    resumed = graphmode("resume", session, home=home, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (run / "planned.diff").read_text() == (run / "changes.diff").read_text()
    report = json.loads((run / "report.json").read_text())
    # The static path holds the revised length (the harness's MAX_SEQ_LEN stays 64; verify's 8 + 32 positions fit),
    # and the model verifies, the battery's sized-length rows at 56.
    assert report["tokens_equal"] is True and report["rounds"][0]["revisions"] == {"max_seq_len": 56}
    # No size in the file: verification hands the revised length to setup_caches.
    assert "GRAPHMODE_MAX_SEQ_LEN" not in (run / "adapted" / "model.py").read_text()
    assert any("the last slot of 56" in row["name"] for row in report["battery"])
    again = graphmode("resume", session, home=home, cwd=tmp_path)
    assert again.returncode == 0 and "has finished" in again.stdout


@pytest.mark.slow
def test_a_subset_approved_at_the_terminal_verifies(tmp_path):
    """A gpt-fast-style target already graph-ready: the person reads the entry points' diff and approves them
    alone, leaving out the assert rewrite; the model verifies."""
    target = Path(__file__).parent / "fixtures" / "targets" / "static_ready"
    child = _spawn("adapt", str(target), "--backend", "eager", "--runs", "1", "--out", str(tmp_path / "out"),
                   home=tmp_path / "home", cwd=tmp_path)
    child.expect("Apply which changes")
    entries, = _change_ids(tmp_path / "out" / "static_ready" / "design.md", "split_decode")
    child.sendline(f"d {entries}")
    child.expect(r"def decode\(self")
    child.expect("Apply which changes")
    child.sendline(entries)
    child.expect(r"Verified:(?:\x1b\[[0-9;]*m)* identical tokens")
    assert _finish(child) == 0
    report = json.loads((tmp_path / "out" / "static_ready" / "report.json").read_text())
    # Declined with the assert rewrite: the fusions the model's norm and projections would get.
    assert report["changes_applied"] == ["split_decode"] and report["changes_declined"][0] == "hoist_item"
    assert all(CODEMODS[name].FUSION for name in report["changes_declined"][1:])


@pytest.mark.slow
def test_ctrl_d_at_the_prompt_stops_with_the_session_saved_and_the_command_line_carries_on(tmp_path):
    """Ctrl-D saves the session at its confirmation; the command line then answers it (test_workflow.py's checks of
    a refused choice and of declining everything, on this session: one analysis for both)."""
    child = _spawn("adapt", str(EXAMPLE), "--backend", "eager", "--runs", "1", "--out", str(tmp_path / "out"),
                   home=tmp_path / "home", cwd=tmp_path)
    child.expect("Apply which changes")
    child.sendeof()
    child.expect("Stopped for confirmation. Session: ")
    status = _finish(child)
    assert status == 4, child.before
    assert "internal error" not in child.before
    said = re.sub(r"\x1b\[[0-9;]*m", "", child.before)  # as printed, less the colours
    a_choice_is_refused_with_what_it_needs_and_declining_all_is_reported_honestly(
        said, tmp_path / "out", tmp_path / "home", tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find the workers")
def test_ctrl_c_during_verify_names_the_session_and_leaves_no_worker(tmp_path):
    out, home = tmp_path / "out", tmp_path / "home"
    child = _spawn("adapt", str(EXAMPLE), "--yes", "--backend", "eager", "--runs", "3", "--out", str(out),
                   home=home, cwd=tmp_path)
    child.expect("implement")  # verify starts next; wait until one of its workers runs
    deadline = time.monotonic() + 120
    while not _workers_of(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(home), "no verify worker started"
    # CPython can drop a KeyboardInterrupt that lands while a finalizer runs ("Exception ignored in ..."); a person
    # then presses Ctrl-C again, and so does the test, while the run still has a worker to stop. Each press gets
    # time to be handled on a loaded machine: a second one landing in the handling of the first proves nothing.
    for _ in range(3):
        child.sendintr()
        if child.expect(["interrupted", pexpect.TIMEOUT], timeout=30) == 0:
            break
        assert _workers_of(home), f"verify finished without seeing the interrupt:\n{child.before[-2000:]}"
    else:
        raise AssertionError(f"three Ctrl-C never interrupted the run:\n{child.before[-3000:]}")
    child.expect(r"graphmode resume (\w+)")
    assert _finish(child) == 130
    deadline = time.monotonic() + 5
    while _workers_of(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _workers_of(home) == []


@pytest.mark.slow
def test_a_declined_change_behind_a_failure_is_named_and_offered_in_the_next_round(tmp_path):
    """The person declines the host-check hoist; Decode then breaks its graph at the assert it would have moved.
    The repair names that change with the line, and the second round asks whether to add it: yes verifies."""
    out = tmp_path / "out"
    child = _spawn("adapt", str(EXAMPLE), "--backend", "eager", "--runs", "1", "--out", str(out),
                   home=tmp_path / "home", cwd=tmp_path)
    child.expect("Apply which changes")
    design = out / "legacy_llm" / "design.md"
    hoist, = _change_ids(design, "hoist_item")
    others = [c for c in re.findall(r"^### (C\d+)\. ", design.read_text(), re.M) if c != hoist]
    child.sendline(",".join(others))
    assert_line = next(n for n, text in enumerate((EXAMPLE / "model.py").read_text().splitlines(), start=1)
                       if "assert tokens.max().item()" in text)
    child.expect(rf"{hoist} \(`hoist_item`\), which you declined, rewrites model\.py:{assert_line}, where the "
                 r"adapted Decode broke its graph(?: and recompiled)? in round 1")
    child.expect(rf"Add {hoist}\? ")
    child.sendline("yes")
    child.expect("Round 2: repaired into round 2")
    child.expect("Apply which changes")
    child.sendline("")  # the proposed choice: the person's round-1 choice with the change they just added
    child.expect(r"Verified:(?:\x1b\[[0-9;]*m)* identical tokens")
    assert _finish(child) == 0
    run = out / "legacy_llm"
    first, second = json.loads((run / "report.json").read_text())["rounds"]
    assert first["declined"] == ["hoist_item"] and first["passed"] is False
    assert {"kind": "declined", "change": hoist, "line": assert_line}.items() <= first["repairs"][0].items()
    assert "hoist_item" in second["approved"] and second["declined"] == [] and second["passed"] is True
    text = (run / "report.md").read_text()
    assert f"`model.py:{assert_line}`: {hoist} (`hoist_item`), declined by a person, rewrites this line" in text


def _round_two(home: Path, run_dir: Path, session: str) -> str:
    """A session stopped at round 2's confirmation, saved through the workflow's own graph without running a model:
    round 1 declined the host-check hoist and failed on the line it rewrites, and its repair found nothing else, so
    round 2 offers that change alone. Returns the change's id."""
    from graphmode.agent.cli.terminal import session_config
    from graphmode.agent.workflow import nodes
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer
    from graphmode.agent.workflow.state import Baseline, Round, RunOptions, RunState

    first = RunState(session_id=session, options=RunOptions(target=str(EXAMPLE), run_dir=str(run_dir),
                                                            backend="aot_eager", rounds=2),
                     sources=["model.py"],
                     baseline=Baseline(entry_class="Transformer", max_seq_len=64,
                                       headline="not probed: this test is about the confirmation", steps=8))
    first = RunState.model_validate({**first.model_dump(), **nodes.design(first)})
    hoist = next(c for c in first.plan if c.codemod == "hoist_item")
    line = next(n for n, text in enumerate((EXAMPLE / "model.py").read_text().splitlines(), start=1)
                if "assert tokens.max().item()" in text)
    offer = {"change": hoist.id, "codemod": "hoist_item", "title": hoist.title, "path": "model.py", "line": line,
             "adapted_line": line, "what": "graph break"}
    round_one = Round(number=1, design_path=first.design_path, approved=[c.codemod for c in first.plan if c != hoist],
                      declined=["hoist_item"], passed=False, problems=["1 graph break in Decode after warm-up"],
                      repairs=[{**offer, "kind": "declined", "reason": "assert on a tensor's value", "count": 1}],
                      outcome="repaired into round 2: the next confirmation offers it")
    second = first.model_copy(update={"round": 2, "rounds": [round_one], "declined": ["hoist_item"],
                                      "offers": [offer]})
    second = RunState.model_validate({**second.model_dump(), **nodes.design(second)})
    os.environ["GRAPHMODE_HOME"] = str(home)
    try:
        with open_checkpointer() as checkpointer:
            graph = build_graph(checkpointer)
            graph.update_state(session_config(session), second.model_dump(), as_node="design")
            graph.invoke(None, session_config(session))  # runs confirm, which waits for an answer
            assert graph.get_state(session_config(session)).next == ("confirm",)
    finally:
        os.environ.pop("GRAPHMODE_HOME")
    return next(c.id for c in second.plan if c.codemod == "hoist_item")


def test_declining_the_only_repair_offered_goes_to_the_report_instead_of_repeating_the_round(tmp_path):
    home, run_dir = tmp_path / "home", tmp_path / "out" / "legacy_llm"
    hoist = _round_two(home, run_dir, "again001")
    child = _spawn("resume", "again001", home=home, cwd=tmp_path)
    child.expect(rf"Add {hoist}\? ", timeout=60)
    child.sendline("no")
    # Not asked again for the same selection: straight to the report, which says why round 2 did not run.
    child.expect("Apply which changes|round 2 was not run", timeout=60)
    assert "round 2 was not run" in child.after.lower(), child.before
    assert _finish(child) == 1
    report = json.loads((run_dir / "report.json").read_text())
    said = report["problems"][0]
    assert said.startswith("round 2 was not run: you declined") and f"{hoist} (`hoist_item`)" in said
    assert "which failed (1 graph break in Decode after warm-up)" in said
    assert [r["number"] for r in report["rounds"]] == [1, 2] and report["rounds"][1]["applied"] == []
    assert f"**Result: not verified: {said}.**" in (run_dir / "report.md").read_text().replace("\n", " ")


@pytest.mark.parametrize("width", [60, 100, 200])
def test_the_change_table_fits_the_terminal_and_cuts_nothing(tmp_path, width):
    import io

    from rich.console import Console
    from rich.markup import render

    from graphmode.agent.cli.terminal import change_table, choice_prompt
    from graphmode.agent.workflow import nodes
    from graphmode.agent.workflow.state import Baseline, RunOptions, RunState

    state = RunState(session_id="table001", options=RunOptions(target=str(EXAMPLE), run_dir=str(tmp_path / "run")),
                     sources=["model.py"],
                     baseline=Baseline(entry_class="Transformer", max_seq_len=64,
                                       headline="not probed: this test is about the table", steps=8))
    state = RunState.model_validate({**state.model_dump(), **nodes.design(state)})
    screen = io.StringIO()
    Console(file=screen, width=width, color_system=None).print(change_table(state))
    lines = screen.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width and "…" not in screen.getvalue()
    # Every row's cells are all there: folded onto further lines, never cut (the id column is never folded).
    assert [line.split("│")[1].strip() for line in lines if line.startswith("│ C")] == [c.id for c in state.plan]
    cells = "".join(part.strip() for line in lines if line.startswith("│") for part in line.split("│")[6:7])
    assert "max_seq_len=64" in cells and "entry_class=Transformer" in cells

    # The question lists each answer once, the one Enter takes first.
    first, later = render(choice_prompt("all")).plain, render(choice_prompt("C2,C9")).plain
    assert first.startswith("Apply which changes? all (Enter), none,") and first.count("all") == 1
    assert later.startswith("Apply which changes? proposed: C2,C9 (Enter), all, none,") and later.count("all") == 1
