"""One small function per workflow step. Each reads the state and returns the fields it changes."""
from __future__ import annotations

import ast
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import libcst as cst
from langgraph.types import interrupt

from graphmode.agent import progress
from graphmode.agent.chart import decode_chart
from graphmode.agent.diffs import change_diffs
from graphmode.agent.errors import UserError
from graphmode.agent.knowledge import skill
from graphmode.agent.leftovers import mark_decode_runs, merge_by_line
from graphmode.agent.output import render, write_adapted_tree, write_atomic
from graphmode.agent.state import Change, RunState
from graphmode.runners.backends import get as get_backend
from graphmode.transforms.codemods import CODEMODS, Options
from graphmode.transforms.findings import Finding
from graphmode.transforms.pipeline import FileAdaptation, adapt_source, fixed_by
from graphmode.transforms.rules import scan_source


# -- analyze ---------------------------------------------------------------------------------------
def analyze(state: RunState) -> dict:
    """Static rules over the sources, one traced eager run of the unmodified Prefill and Decode (the evidence the
    findings are checked against), then one real run of the unmodified Decode under Dynamo."""
    # torch is imported only by the steps that run models
    from graphmode.runners.evidence import collect_evidence
    from graphmode.runners.evidence_findings import reconcile
    from graphmode.runners.probe import probe

    target = Path(state.target)
    logs = Path(state.run_dir) / "logs"
    sources = _declared_sources(target)
    findings = [f for relative in sources for f in scan_source(_read(target, relative), relative)]
    evidence = _probe(lambda: collect_evidence(target, log_dir=logs, timeout_s=state.timeout_s))
    baseline = _probe(lambda: probe(target, steps=8, backend=state.backend, log_dir=logs, timeout_s=state.timeout_s))
    _check_batch_fits(state.batch_buckets, baseline)
    findings = _with_runtime_findings(reconcile(findings, evidence), baseline, sources)
    return {
        "sources": sources,
        "entry_class": baseline["entry_class"],
        "max_seq_len": baseline["max_seq_len"],
        "findings": [f.to_dict() for f in findings],
        "baseline": baseline,
        "evidence": {**evidence.to_dict(), "summary": evidence.summary()},
    }


def _check_batch_fits(buckets: list[int], baseline: dict) -> None:
    """The harness batch must fit a bucket; said now rather than after every verification run."""
    batch = (baseline.get("prompt_shape") or [1])[0]
    if buckets and batch > max(buckets):
        raise UserError(f"--batch-buckets {','.join(map(str, buckets))}: the harness prompt has a batch of {batch}, "
                        f"larger than the largest bucket; add a bucket of at least {batch}")


def _declared_sources(target: Path) -> list[str]:
    """The harness's SOURCES, read without running it; every .py but the harness when absent."""
    harness = target / "harness.py"
    module = cst.parse_module(_read(target, "harness.py"))
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign):
            assign = stmt.body[0]
            if getattr(assign.targets[0].target, "value", None) == "SOURCES" and isinstance(assign.value, cst.List):
                names = [e.value.evaluated_value for e in assign.value.elements if isinstance(e.value, cst.SimpleString)]
                missing = [n for n in names if not (target / n).is_file()]
                if missing:
                    raise UserError(f"{harness}: SOURCES names {', '.join(missing)}, which does not exist")
                return names
    return sorted(p.name for p in target.glob("*.py") if p.name != "harness.py")


def _read(target: Path, relative: str) -> str:
    path = target / relative
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:
        ast.parse(text, filename=str(path))  # Python's own message and position, as the user knows them
    except SyntaxError as error:
        raise UserError(f"{path}:{error.lineno}:{error.offset or 1}: syntax error: {error.msg}") from None
    return text


def _probe(run):
    """Runs a step that executes the user's code in a worker; its one-line failure becomes a UserError."""
    from graphmode.runners.subprocess_run import WorkerError

    try:
        return run()
    except WorkerError as error:
        raise UserError(str(error)) from None


def _with_runtime_findings(static: list[Finding], baseline: dict, sources: list[str]) -> list[Finding]:
    """Adds the graph breaks and recompiles the probe saw in the sources, so that no location is reported
    twice: evidence at a line a static finding names goes onto that finding, and a recompile guard goes
    onto the static finding (same file) that names the guarded variable, else the nearest one in the
    same function. Only what no static finding explains becomes a runtime finding of its own."""
    events = [("GM901", item.get("file"), item.get("line"), item.get("function") or "",
               f"graph break: {item.get('reason', '')}")
              for item in baseline.get("break_reasons", [])]
    events += [("GM902", site.get("file"), site.get("line"), site.get("function") or "",
                f"recompiled {site.get('count', 1)}x; guard: {site.get('first_reason', '')}")
               for site in baseline.get("recompile_sites", [])]
    merged = list(static)
    added: list[Finding] = []
    for code, path, line, function, what in events:
        relative = next((s for s in sources if path and Path(path).as_posix().endswith(s)), None)
        if relative is None or not line:
            continue  # outside the sources (the harness, torch itself): shown in the baseline section
        target = _explaining_finding(merged, relative, line, function, what if code == "GM902" else "")
        if target is not None:
            if what not in merged[target].evidence:
                merged[target] = replace(merged[target], evidence="; ".join(filter(None, [merged[target].evidence, what])))
        elif not any(f.path == relative and f.line == line and what in f.message for f in added):
            skill = "triage" if code == "GM901" else "positions-as-tensors"
            added.append(Finding(code, relative, line, 1, what, skill, source="runtime", autofix=False))
    return merged + added


def _explaining_finding(findings: list[Finding], path: str, line: int, function: str, guard: str) -> int | None:
    """Index of the static finding that explains a runtime event, or None."""
    same_line = [i for i, f in enumerate(findings) if f.path == path and f.line == line]
    if same_line or not guard:
        return same_line[0] if same_line else None
    guarded = re.findall(r"[A-Za-z_]\w*", guard.split("guard:", 1)[-1].replace("tensor ", "", 1))
    variable = guarded[0] if guarded else ""
    in_function = [i for i, f in enumerate(findings)
                   if f.path == path and function and f.function.split(".")[-1] == function]
    naming = [i for i in in_function if variable and variable in findings[i].message]
    if not naming and any(word in variable for word in ("past", "cache", "kv")):
        naming = [i for i in in_function if findings[i].code.startswith("GM30")]
    candidates = naming or in_function
    return min(candidates, key=lambda i: abs(findings[i].line - line)) if candidates else None


# -- design ----------------------------------------------------------------------------------------
def design(state: RunState) -> dict:
    """Plans every change the codemods can make and writes the design document for approval."""
    adaptations = _adapt(state, None)
    findings = [Finding.from_dict(f) for f in state.findings]
    plan = _plan(adaptations, findings)
    covered = {i for change in plan for i in change.fixes}
    manual = merge_by_line([
        {"kind": "finding", **f.to_dict(), "why": skill(f.skill).summary}
        for i, f in enumerate(findings) if i not in covered
    ] + [
        {"kind": "codemod", "path": a.path, **m.to_dict(), "why": skill(m.skill).summary}
        for a in adaptations.values() for m in a.manual
    ])
    file_diffs = {a.path: a.diff() for a in adaptations.values() if a.changed}
    diffs = change_diffs(file_diffs, {c.id: c.edits for c in plan})
    plan = [c.model_copy(update={"diff": diffs.get(c.id, "")}) for c in plan]
    planned = Path(state.run_dir) / "planned.diff"
    write_atomic(planned, "".join(file_diffs.values()))
    path = Path(state.run_dir) / "design.md"
    write_atomic(path, render(
        "design.md.j2", state=state, plan=plan, findings=findings, manual=manual, skill=skill,
        fixed={i: change.id for change in plan for i in change.fixes},
    ))
    return {"plan": plan, "manual": manual, "design_path": str(path), "planned_diff_path": str(planned)}


def _adapt(state: RunState, selected: set[str] | None) -> dict[str, FileAdaptation]:
    # With batch buckets, the static buffers must hold the largest one.
    calls = state.evidence.get("entry_calls") or {}
    options = Options(max_seq_len=state.max_seq_len, entry_class=state.entry_class,
                      max_batch_size=max(state.batch_buckets, default=Options.max_batch_size),
                      entry_roles=entry_roles(calls), recomputes_sequence=bool(state.evidence.get("recomputes_sequence")),
                      prefill_resets=tuple(calls.get("prefill_resets", [])),
                      traced=bool(state.evidence), evidence_caches=evidence_caches(state.evidence),
                      changing_int_params=changing_int_params(state.evidence),
                      host_sync_lines=host_sync_lines(state.evidence),
                      position_lines=position_lines(state.evidence))
    target = Path(state.target)
    return {rel: adapt_source(_read(target, rel), rel, selected, options) for rel in state.sources}


def entry_roles(calls: dict) -> tuple[tuple[str, str], ...]:
    """(parameter, role) for the codemods, from how the harness called the entry class's forward
    (runners.entry_calls): a parameter Decode never gets is "omitted"; positions carry their layout."""
    if not calls or calls.get("entry_class") is None:
        return ()
    roles = []
    for use in calls.get("parameters", []):
        role = use["role"] if use["in_decode"] else "omitted"
        if (role == "positions" and use.get("layout") != "1d") or role == "mask_rows":
            role = f"{role}:{use.get('layout')}"
        roles.append((use["name"], role))
    return tuple(roles)


def evidence_caches(evidence: dict) -> tuple[tuple[str, int, int], ...]:
    """(file, statement line, growing dim) of every KV cache the traced run saw grown by a `torch.cat` written
    in the sources themselves (not inside a library call)."""
    found = []
    for key, entry in evidence.get("lines", {}).items():
        file, _, line = key.rpartition(":")
        for growth in entry.get("growing", []):
            if growth.get("kind") == "cache" and not growth.get("via") and growth.get("dims"):
                found.append((file, entry.get("statement") or int(line), growth["dims"][0]))
    return tuple(sorted(set(found)))


def host_sync_lines(evidence: dict) -> tuple[tuple[str, int], ...]:
    """(file, statement line) of every statement the traced run saw read the device on the host in Decode."""
    return tuple(sorted({(key.rpartition(":")[0], entry.get("statement") or int(key.rpartition(":")[2]))
                         for key, entry in evidence.get("lines", {}).items()
                         if any(sync.get("decode") for sync in entry.get("syncs", []))}))


def position_lines(evidence: dict) -> tuple[tuple[str, int], ...]:
    """(file, statement line) of every statement the traced run saw make the positions of the tokens computed."""
    return tuple(sorted({(key.rpartition(":")[0], entry.get("statement") or int(key.rpartition(":")[2]))
                         for key, entry in evidence.get("lines", {}).items() if entry.get("positions")}))


def changing_int_params(evidence: dict) -> tuple[tuple[str, str, str], ...]:
    """(file, function qualname, parameter) of the int parameters the traced run saw change every Decode step."""
    return tuple(sorted((key.rpartition(":")[0], function["name"], param)
                        for key, function in evidence.get("functions", {}).items()
                        for param in function.get("params", {})))


def _plan(adaptations: dict[str, FileAdaptation], findings: list[Finding]) -> list[Change]:
    edits = {name: [] for name in CODEMODS}
    files = {name: [] for name in CODEMODS}
    for adaptation in adaptations.values():
        for name in adaptation.applied:
            files[name].append(adaptation.path)
        for edit in adaptation.edits:
            edits[edit.codemod].append({"path": adaptation.path, **edit.to_dict()})
    ids = {name: f"C{n}" for n, name in enumerate([n for n in CODEMODS if files[n]], start=1)}
    plan = []
    for name, change_id in ids.items():
        codemod = CODEMODS[name]
        fixes = [i for i, f in enumerate(findings) if _first_fixer(f, adaptations) == name]
        plan.append(Change(
            id=change_id, codemod=name, title=codemod.TITLE, description=codemod.DESCRIPTION, skill=codemod.SKILL,
            requires=[ids[r] for r in (*codemod.REQUIRES, *codemod.ASSUMES) if r in ids], files=files[name],
            edits=edits[name], fixes=fixes,
        ))
    return plan


def _first_fixer(finding: Finding, adaptations: dict[str, FileAdaptation]) -> str | None:
    adaptation = adaptations.get(finding.path)
    return fixed_by(finding, adaptation.edits) if adaptation else None


# -- confirm ---------------------------------------------------------------------------------------
def confirm(state: RunState) -> dict:
    """Waits for a person's choice (or takes every change with --yes). The command line checks a choice before
    the session sees it (agent.cli); this is the last guard: an inconsistent choice is refused, never trimmed."""
    if state.auto_approve:
        chosen = [c.id for c in state.plan]
    else:
        answer = interrupt({"design": state.design_path, "changes": [[c.id, c.title] for c in state.plan]})
        chosen = [c.id for c in state.plan] if answer == "all" else list(answer or [])
    problem = choice_problem(state.plan, chosen)
    if problem:
        raise UserError(problem)
    return {"approved": [c.id for c in state.plan if c.id in chosen]}


def unmet_needs(plan: list[Change], chosen: list[str]) -> list[str]:
    """The changes the chosen ones need, directly or through each other, that were not chosen (in plan order).
    Any change at all needs the entry points, when the plan has them: without `prefill`/`decode` the adapted
    model cannot be run in graph mode, so verify could say nothing about the changes chosen."""
    needs = {c.id: c.requires for c in plan}
    entries = [c.id for c in plan if c.codemod == "split_decode"]
    pending = list(chosen) + (entries if chosen else [])
    wanted = set(pending)
    while pending:
        for need in needs.get(pending.pop(), []):
            if need not in wanted:
                wanted.add(need)
                pending.append(need)
    return [c.id for c in plan if c.id in wanted - set(chosen)]


def choice_problem(plan: list[Change], chosen: list[str]) -> str | None:
    """Why a choice of changes cannot be applied as it stands (unknown ids, or needs left out); None if it can."""
    unknown = [c for c in chosen if c not in {change.id for change in plan}]
    if unknown:
        return f"no change {', '.join(unknown)} in this design (it has {', '.join(c.id for c in plan) or 'none'})"
    missing = unmet_needs(plan, chosen)
    if missing:
        by_id = {c.id: c for c in plan}
        reasons = [f"{c} needs {', '.join(n for n in by_id[c].requires if n not in chosen)}"
                   for c in chosen if any(n not in chosen for n in by_id[c].requires)]
        entries = next((c.id for c in plan if c.codemod == "split_decode"), None)
        if entries in missing:
            reasons.append(f"without {entries} (the prefill/decode entry points) the adapted model cannot run in "
                           "graph mode")
        why = "; ".join(reasons)
        fixed = [c.id for c in plan if c.id in set(chosen) | set(missing)]
        return f"{why}; approve {','.join(fixed)} instead"
    return None


# -- implement -------------------------------------------------------------------------------------
def implement(state: RunState) -> dict:
    """Applies the approved codemods to copies of the sources; the originals are never touched."""
    selected = {c.codemod for c in state.plan if c.id in (state.approved or [])}  # closed under needs (confirm)
    adaptations = _adapt(state, selected)
    run_dir = Path(state.run_dir)
    adapted_dir = run_dir / "adapted"
    write_adapted_tree(Path(state.target), adapted_dir, {a.path: a.adapted for a in adaptations.values() if a.changed})
    diff_path = run_dir / "changes.diff"
    write_atomic(diff_path, "".join(a.diff() for a in adaptations.values()))
    applied = [name for name in CODEMODS if any(name in a.applied for a in adaptations.values())]
    return {"applied": applied, "adapted_dir": str(adapted_dir), "diff_path": str(diff_path)}


# -- verify ----------------------------------------------------------------------------------------
def verify(state: RunState) -> dict:
    """Original eager against adapted with Decode compiled, each in a fresh process."""
    from graphmode.runners.verify import AdaptedNotRunnable, verify as run_verification

    log_dir = Path(state.run_dir) / "logs"
    def run():
        try:
            return run_verification(
                Path(state.target), Path(state.adapted_dir), state.backend, steps=state.steps, log_dir=log_dir,
                runs=state.runs, similarity=state.similarity, compile_cache=_compile_cache(state),
                batch_buckets=state.batch_buckets or None, timeout_s=state.timeout_s, progress=progress.say,
            )
        except AdaptedNotRunnable as error:
            return error  # the adaptation's outcome, not bad input: the report says why and what is left

    result = _probe(run)
    if isinstance(result, AdaptedNotRunnable):
        return {"verification": {"ran": False, "passed": False, "problems": [str(result)]}}
    return {"verification": result.to_dict()}


def _compile_cache(state: RunState) -> Path | None:
    if state.compile_cache == "off":
        return None
    if state.compile_cache:
        return Path(state.compile_cache).expanduser().resolve()
    cache = Path(state.run_dir) / "compile-cache"
    shutil.rmtree(cache, ignore_errors=True)  # a leftover from an earlier run would make run 1 look warm
    return cache


# -- report ----------------------------------------------------------------------------------------
CHART = "decode_ms_per_step.png"


def report(state: RunState) -> dict:
    run_dir = Path(state.run_dir)
    if state.verification.get("ran") is False:
        return _report_not_run(state, run_dir)
    manual = mark_decode_runs(state.manual, state.verification["adapted"].get("decode_lines", {}),
                              Path(state.target), Path(state.adapted_dir))
    summary = report_json(state, manual)
    chart = decode_chart(state.verification, run_dir / CHART)
    summary["decode_chart"] = chart
    write_atomic(run_dir / "report.json", json.dumps(summary, indent=2) + "\n")
    path = run_dir / "report.md"
    write_atomic(path, render("report.md.j2", state=state, summary=summary, skill=skill, chart=chart,
                              manual=manual, backend_device=get_backend(state.verification["backend"]).device))
    return {"report_path": str(path)}


def _report_not_run(state: RunState, run_dir: Path) -> dict:
    """The adapted model could not be run: what was applied, why it failed, what is left for a person."""
    manual = [{**m, "decode_runs": None} for m in state.manual]
    summary = {"passed": False, "ran": False, "problems": state.verification["problems"], "backend": state.backend,
               **_adaptation_fields(state, manual)}
    write_atomic(run_dir / "report.json", json.dumps(summary, indent=2) + "\n")
    path = run_dir / "report.md"
    write_atomic(path, render("report_not_run.md.j2", state=state, summary=summary, manual=manual))
    return {"report_path": str(path)}


def _adaptation_fields(state: RunState, manual: list[dict]) -> dict:
    """What every report.json says about the session and the adaptation, verified or not."""
    return {
        "target": state.target,
        "session_id": state.session_id,
        "changes_applied": state.applied,
        "changes_declined": [c.codemod for c in state.plan if c.id not in (state.approved or [])],
        "manual_items": len(state.manual),
        # One per line; `codes` (added): every rule and codemod that left that line, `code` being the first.
        "manual_items_detail": [{"path": m["path"], "line": m["line"], "kind": m["kind"],
                                 "code": m.get("code") or m.get("codemod"), "decode_runs": m["decode_runs"],
                                 "codes": [r.get("code") or r.get("codemod") for r in m.get("reasons", [m])]}
                                for m in manual],
        # The unmodified Decode's figures (None when its probe crashed and nothing could be measured), the
        # crash (added; None when it ran), what was changed to measure (added) and the headline saying all
        # of it (added).
        "baseline": {k: state.baseline.get(k) for k in ("graph_breaks", "recompiles", "recompile_limit_hit",
                                                        "crash", "measured_with", "headline")},
    }


def report_json(state: RunState, manual: list[dict]) -> dict:
    """The machine-readable report. Its top-level fields are stable; add, never rename."""
    v = state.verification
    eager, graph = v["eager"], v["graph"]
    traced = bool(v["adapted"].get("decode_lines"))
    return {
        "graph_breaks": v["graph_breaks"],
        "recompiles": v["recompiles"],
        "tokens_equal": v["tokens_equal"],
        "logits_max_abs_diff": v["logits_max_abs_diff"],
        "prefill_ms": {"eager": eager["prefill_ms"], "graph": graph["prefill_ms"]},
        "decode_ms_per_token": {"eager": eager["decode_ms_per_token"], "graph": graph["decode_ms_per_token"]},
        "warmup_s": graph["warmup_s"],
        "decode_speedup": v["decode_speedup"],
        "backend": v["backend"],
        "passed": v["passed"],
        "problems": v["problems"],
        "recompile_limit_hit": v["recompile_limit_hit"],
        "first_divergent_step": v["first_divergent_step"],
        "steps": v["steps"],
        **_adaptation_fields(state, manual),
        # Of the manual items, the ones on lines one traced Decode step of the adapted model runs (added;
        # None: not traced).
        "manual_items_run_by_decode": sum(bool(m["decode_runs"]) for m in manual) if traced else None,
        "env": v["adapted"]["env"],
        "timings": {"eager": eager, "graph": graph},
        "logits_max_abs_diff_per_step": v["logits_max_abs_diff_per_step"],
        "tokens": {"eager": v["original"]["tokens"], "graph": v["adapted"]["tokens"]},
        # Repeated runs (added): every figure per side as {"median", "min", "max", "runs"}; the scalar
        # fields above are these medians. Older sessions (one run) lack them.
        "runs": v.get("runs", 1),
        "figures": v.get("figures", {}),
        "decode_speedup_range": v.get("decode_speedup_range", {}),
        # model: the entry class analyze found; model_classes: what each side's harness really built.
        "variables": {**v.get("variables", {}), "model": state.entry_class or None,
                      "model_classes": v.get("variables", {}).get("model")},
        "tokens_identical_across_runs": v.get("tokens_identical_across_runs", {}),
        "logits_max_abs_diff_across_runs": v.get("logits_max_abs_diff_across_runs", {}),
        "tokens_compared": v.get("tokens_compared"),
        "tokens_differing": v.get("tokens_differing"),
        "similarity": v.get("similarity"),
        "similarity_threshold": v.get("similarity_threshold"),
        "decode_ms_per_step": v.get("decode_ms_per_step", {}),
        "compile_logs": [f"logs/{name}" for name in v.get("compile_logs", [])],
        "unstable_figures": v.get("unstable_figures", []),
        "compile_cache": v.get("compile_cache", {}),
        # Batch buckets (added): one entry per bucket run; [] without --batch-buckets.
        "batch_buckets": v.get("bucket_sweep", {}).get("buckets", []),
        "batch_buckets_skipped": v.get("bucket_sweep", {}).get("skipped", []),
        "batch_buckets_padding": v.get("bucket_sweep", {}).get("padding"),
        # The original harness against the adapted sources (added): {"ran", "tokens_equal", ...}.
        "own_harness": v.get("own_harness", {}),
    }
