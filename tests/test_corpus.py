"""Opt-in: graphmode on decoder models written by others, from released PyPI packages (`pytest -m corpus`).

Cases come from GRAPHMODE_CORPUS (tests/corpus/core.py): space-separated entries `VERSION:MODEL,MODEL`
(transformers), `PACKAGE==VERSION:MODEL,MODEL` (transformers, litgpt, x-transformers, torchtune,
llama-models, mistral-inference, remote), `testbed` (the whole bed, core.TESTBED) or `remote` (Hub remote
code and research code from GitHub mirrors, core.REMOTE; skipped until `cd tests && python -m corpus.remote
fill` has filled their cache); default
"4.36.2:llama,mistral". Each case downloads its wheels (`pip download --no-deps`), extracts them into a
site folder, builds a tiny random target (the model files + a harness in the library's own calling
convention), checks that the original runs, then runs `graphmode adapt TARGET --yes --backend inductor
--runs N` and expects 0 graph breaks, 0 recompiles and identical tokens. Last, the case's own harness
runs against the adapted sources (`python harness.py STEPS` in graphmode-out/<target>/adapted/) and
must print the same tokens as against the originals. A case that cannot be built fails and says why;
a case that fails lists every check that failed.

Environment: GRAPHMODE_CORPUS_CACHE=DIR keeps the downloads and sites between runs;
GRAPHMODE_CORPUS_RUNS=N is adapt's --runs (default 3); GRAPHMODE_CORPUS_KEEP=DIR writes each case's
graphmode output to DIR/<case> (design.md, report.md, adapted/) and appends one JSON line per case to
DIR/results.jsonl (result, first item left for a person that Decode runs, seconds).

It needs the network (PyPI) and minutes per case, so it only runs when `-m` selects `corpus`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from corpus import core
from lint_findings import findings, own_limit, too_long

pytestmark = pytest.mark.corpus

CASES = core.corpus_cases()
STEPS = 32  # `python harness.py STEPS`: the own-harness token comparison


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory) -> Path:
    cache = os.environ.get("GRAPHMODE_CORPUS_CACHE")
    if cache:
        root = Path(cache).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
        return root
    return tmp_path_factory.mktemp("corpus")


def _keep_dir() -> Path | None:
    keep = os.environ.get("GRAPHMODE_CORPUS_KEEP")
    return Path(keep).expanduser().resolve() if keep else None


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def first_blocker(report: dict, design: Path) -> str:
    """The first thing graphmode could not do, as 'file:line CODE text' from design.md's "Left for a
    person" list: the first item one traced Decode step runs; when Decode was not traced (the adapted
    model did not run), the first rewrite that gave up (split_decode's first: without entries nothing
    runs), else the first item at all."""
    items = report.get("manual_items_detail") or []
    ran = [item for item in items if item.get("decode_runs")]
    untraced = all(item.get("decode_runs") is None for item in items)
    gave_up = [item for item in items if item.get("kind") == "codemod"] if untraced else []
    gave_up.sort(key=lambda item: item.get("code") != "split_decode")  # no entries: split_decode says why
    chosen = (ran or gave_up or items or [None])[0]
    if chosen is None:
        return ""
    note = "" if ran else (" (Decode not traced)" if chosen.get("decode_runs") is None else " (not run by Decode)")
    where = f"{chosen.get('path')}:{chosen.get('line')}"
    text = design.read_text(encoding="utf-8") if design.is_file() else ""
    for line in text.splitlines():
        if line.startswith(f"- `{where}`"):
            return line[2:].split(". Why it hurts")[0].split(" (`skills/")[0] + note
    return f"{where} {chosen.get('code', '')}{note}"


def _classify(record: dict) -> str:
    """One word for the baseline table."""
    if record.get("skipped"):
        return "skipped"
    if not record.get("original_ok", False):
        return "original fails" if record.get("built") else "cannot build"
    report = record.get("report")
    said = " ".join(map(str, (report or {}).get("problems") or [])) + record.get("adapt_output", "")
    if "prefill/decode(tokens, input_pos)" in said or "has no prefill or decode" in said:
        return "no entries"
    if report is None:
        return "crash"
    if report.get("graph_breaks"):
        return "graph breaks"
    if report.get("recompiles"):
        return "recompiles"
    if report.get("tokens_equal") is None:
        return "crash"
    if not report["tokens_equal"]:
        return "tokens differ"
    if report.get("problems"):
        return "problems"
    return "verified"


def _save(record: dict) -> None:
    keep = _keep_dir()
    if keep is None:
        return
    keep.mkdir(parents=True, exist_ok=True)
    with open(keep / "results.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_adapts_and_verifies(case: core.Case, corpus_root: Path, tmp_path: Path):
    if case.error:
        pytest.fail(case.error, pytrace=False)
    started = time.monotonic()
    record: dict = {"case": case.id, "built": False, "original_ok": False, "report": None}
    try:
        _run_case(case, corpus_root, tmp_path, record)
    finally:
        record["seconds"] = round(time.monotonic() - started, 1)
        record["result"] = _classify(record)
        record.pop("adapt_output", None)
        _save(record)


def _run_case(case: core.Case, corpus_root: Path, tmp_path: Path, record: dict) -> None:
    try:
        target = core.build_target(case, corpus_root, tmp_path / "targets")
    except core.CaseSkipped as error:
        record["why"] = str(error)
        record["skipped"] = True
        pytest.skip(str(error))
    except core.CaseError as error:
        record["why"] = str(error)
        pytest.fail(f"{case.id}: cannot build the case: {error}", pytrace=False)
    record["built"] = True

    original = core.run_harness(target, STEPS)
    if not original.ok:
        record["why"] = _tail(original.why(), 3)
        pytest.fail(f"{case.id}: cannot build the case: the original model does not run "
                    f"(python {target / 'harness.py'} {STEPS}): {original.why()}", pytrace=False)
    record["original_ok"] = True

    keep = _keep_dir()
    out = keep / case.slug if keep else tmp_path / "out"
    if out.exists():
        shutil.rmtree(out)
    runs = core.runs_from_env()
    adapt_started = time.monotonic()
    done = core.graphmode("adapt", str(target), "--yes", "--backend", "inductor", "--runs", str(runs),
                          "--out", str(out), home=tmp_path / "home", cwd=tmp_path)
    record["adapt_seconds"] = round(time.monotonic() - adapt_started, 1)
    record["adapt_exit"] = done.returncode
    record["adapt_output"] = done.stdout + done.stderr
    run = out / target.name
    record["output"] = str(run)
    problems: list[str] = []

    report_path = run / "report.json"
    if not report_path.is_file():
        design = run / "design.md"
        where = f" (design: {design})" if design.is_file() else f" (logs: {run / 'logs'})"
        problems.append(f"`graphmode adapt` exited {done.returncode} without a report{where}:\n"
                        f"{_tail(done.stdout + done.stderr)}")
        record["why"] = _tail(done.stdout + done.stderr, 2)
    else:
        report = json.loads(report_path.read_text())
        record["report"] = {key: report.get(key) for key in (
            "graph_breaks", "recompiles", "tokens_equal", "changes_applied", "manual_items",
            "manual_items_run_by_decode", "problems", "decode_speedup")}
        record["first_blocker"] = first_blocker(report, run / "design.md")
        # A report of a run whose adapted side could not start has no figures (graph_breaks is absent).
        summary = (f"graph_breaks={report.get('graph_breaks')} recompiles={report.get('recompiles')} "
                   f"tokens_equal={report.get('tokens_equal')} applied={report.get('changes_applied')} "
                   f"manual_items={report.get('manual_items')} problems={report.get('problems')} "
                   f"(report: {run / 'report.md'}; first item left for a person: {record['first_blocker'] or 'none'})")
        if (report.get("graph_breaks") or report.get("recompiles") or not report.get("tokens_equal")
                or done.returncode != 0):
            problems.append(f"verification failed (exit {done.returncode}): {summary}")

    # The case's own harness, run against the adapted sources, must print the original's tokens.
    adapted = run / "adapted"
    if not (adapted / "harness.py").is_file():
        problems.append(f"own harness on the adapted sources: not run, no {adapted / 'harness.py'} "
                        "(graphmode wrote no adapted folder)")
        record["own_harness"] = "not run"
    else:
        mine = core.run_harness(adapted, STEPS)
        if not mine.ok:
            problems.append(f"own harness on the adapted sources crashed (python {adapted / 'harness.py'} {STEPS}): "
                            f"{mine.why()}")
            record["own_harness"] = "crash: " + _last_error(mine.stderr or mine.stdout)
        elif mine.tokens != original.tokens:
            step = next((i for i, (a, b) in enumerate(zip(original.tokens[0], mine.tokens[0])) if a != b), None)
            problems.append(f"own harness on the adapted sources gives other tokens (first differs at step {step}):\n"
                            f"  original {original.tokens}\n  adapted  {mine.tokens}")
            record["own_harness"] = f"tokens differ from step {step}"
        else:
            record["own_harness"] = "same tokens"

    # The adapted sources hold no lint finding (pyflakes', a line past the file's own limit) their original lacks.
    if adapted.is_dir():
        record["lint"] = _new_lint(target, adapted)
        problems += [f"lint: {said}" for said in record["lint"]]

    if problems:
        pytest.fail(f"{case.id}:\n- " + "\n- ".join(problems), pytrace=False)


def _new_lint(original: Path, adapted: Path) -> list[str]:
    """For each rewritten Python file, the lint findings its original does not have."""
    said = []
    for path in sorted(adapted.rglob("*.py")):
        relative = path.relative_to(adapted)
        before = original / relative
        if not before.is_file() or before.read_text(errors="replace") == path.read_text(errors="replace"):
            continue
        text, old = path.read_text(errors="replace"), before.read_text(errors="replace")
        own = findings(old, path.name)
        # An undefined name the original reads undefined too is the model's own bug (Hunyuan-A13B's hunyuan.py never
        # defines `logger`): a statement the rewrite copies into a fork or twin reads it once more, nothing new.
        new = Counter({key: count for key, count in (findings(text, path.name) - own).items()
                       if not (key[0] == "F821" and key in own)})
        said += [f"{relative}: {code} {message} (x{count})" for (code, message), count in new.items()]
        said += [f"{relative}:{row}: longer than the original's {own_limit(old)} columns"
                 for row in too_long(text, own_limit(old), old)]
    return said


def _last_error(text: str) -> str:
    """The exception line of a traceback (with the innermost file:line before it)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    where = next((m.group(0) for line in reversed(lines) if (m := re.search(r'File "([^"]+)", line (\d+)', line))), "")
    where = re.sub(r'File "(?:[^"]*/)?([^"/]+)", line (\d+)', r"\1:\2", where)
    return f"{lines[-1].strip() if lines else '?'} ({where})"
