"""The test report: report.md for reviewers, report.json for tools, and the Decode chart, from a finished session."""
from __future__ import annotations

import json
from pathlib import Path

from graphmode.agent.output import render, write_atomic
from graphmode.agent.workflow.report.chart import decode_chart
from graphmode.agent.workflow.repair.failures import declined_causes
from graphmode.agent.workflow.knowledge import skill
from graphmode.agent.workflow.leftovers import mark_decode_runs
from graphmode.agent.workflow.state import RunState
from graphmode.runners.backends import get as get_backend
from graphmode.transforms.codemods import CODEMODS

CHART = "decode_ms_per_step.png"


def write_report(state: RunState) -> Path:
    """report.md, report.json and the Decode chart in the run folder; returns report.md's path."""
    run_dir = Path(state.options.run_dir)
    v = state.verification
    if not v.ran:
        return _write_not_run(state, run_dir)
    manual = mark_decode_runs([m.model_dump() for m in state.manual], v.adapted.get("decode_lines", {}),
                              Path(state.options.target), Path(state.adapted_dir))
    summary = report_json(state, manual)
    chart = decode_chart(v.model_dump(), run_dir / CHART)
    summary["decode_chart"] = chart
    write_atomic(run_dir / "report.json", json.dumps(summary, indent=2) + "\n")
    path = run_dir / "report.md"
    write_atomic(path, render("report.md.j2", state=state, summary=summary, skill=skill, chart=chart,
                              manual=manual, backend_device=get_backend(v.backend).device))
    return path


def _write_not_run(state: RunState, run_dir: Path) -> Path:
    """The adapted model could not be run: what was applied, why it failed, what is left for a person."""
    manual = [{**m.model_dump(), "decode_runs": None} for m in state.manual]
    summary = {"passed": False, "ran": False, "problems": state.verification.problems, "backend": state.options.backend,
               **_adaptation_fields(state, manual)}
    write_atomic(run_dir / "report.json", json.dumps(summary, indent=2) + "\n")
    path = run_dir / "report.md"
    write_atomic(path, render("report_not_run.md.j2", state=state, summary=summary, manual=manual))
    return path


def _adaptation_fields(state: RunState, manual: list[dict]) -> dict:
    """What every report.json says about the session and the adaptation, verified or not."""
    return {
        "target": state.options.target,
        "hf": state.options.hf,  # added: the --hf model (None for a harness folder)
        "session_id": state.session_id,
        "changes_applied": state.applied,
        "changes_declined": [c.codemod for c in state.plan if c.id not in (state.approved or [])],
        "manual_items": len(state.manual),
        # The findings of the design (added), and how many of them a change that was applied removes (added;
        # `graphmode batch` tabulates both beside manual_items).
        "findings": len(state.findings),
        "findings_fixed": len({i for c in state.plan if c.id in (state.approved or []) and c.codemod in state.applied
                               for i in c.fixes}),
        # One per line; `codes` (added): every rule and codemod that left that line, `code` being the first.
        "manual_items_detail": [{"path": m["path"], "line": m["line"], "kind": m["kind"],
                                 "code": m.get("code") or m.get("codemod"), "decode_runs": m["decode_runs"],
                                 "codes": [r.get("code") or r.get("codemod") for r in m.get("reasons", [m])]}
                                for m in manual],
        # The first of them on Decode's path, with its words (added; `first_on_decode`): what stops a run whose
        # problem is a consequence of it (no entry points where the cache was not made static).
        "first_decode_item": first_on_decode(manual),
        # The unmodified Decode's figures (None when its probe crashed and nothing could be measured), the
        # crash (added; None when it ran), what was changed to measure (added) and the headline saying all
        # of it (added).
        "baseline": {k: getattr(state.baseline, k) for k in ("graph_breaks", "recompiles", "recompile_limit_hit",
                                                        "crash", "measured_with", "headline")},
        # Every round of design -> verify (added; agent.workflow.repair): its design, choice, verdict, repairs and
        # outcome; the fields above are the last round's. `dropped`: the changes a bisection left out, with its trials.
        "rounds": [r.model_dump() for r in state.rounds],
        "dropped": state.dropped,
        # `graphmode verify` (added): the folder verified, who wrote it, and its files not as graphmode wrote them;
        # None in a session's own report.
        "hand_edits": state.hand_edits,
    }


def first_on_decode(manual: list[dict]) -> dict | None:
    """The first item left for a person on Decode's path, as {"at": "file:line", "code", "reason"}: on a line one
    traced Decode step of the adapted model runs, or, where the adapted model was not traced (no entries, not run),
    a finding the unmodified Decode's trace saw run (`Finding.trace` "seen"); None where no item is known to be on
    it. Its reason is the one the trace saw, else the line's first."""
    for item in manual:
        reasons = item.get("reasons") or [item]
        seen = [r for r in reasons if r.get("trace") == "seen"]
        if item.get("decode_runs") or (item.get("decode_runs") is None and seen):
            return _item_at(item, (seen or reasons)[0])
    return None


def _item_at(item: dict, reason: dict) -> dict:
    """{"at": "file:line", "code", "reason"} of an item left for a person, with one of its reasons."""
    return {"at": f"{item['path']}:{item['line']}", "code": reason.get("code") or reason.get("codemod"),
            "reason": reason.get("message") or reason.get("reason")}


def _side(env: dict) -> dict:
    """The interpreter one side's workers ran under, with its Python and transformers (runners.measure.env_info)."""
    return {"executable": env.get("executable"), "python": env.get("python"), "transformers": env.get("transformers")}


def report_json(state: RunState, manual: list[dict]) -> dict:
    """The machine-readable report. Its top-level fields are stable; add, never rename."""
    v = state.verification
    eager, graph = v.eager, v.graph
    traced = bool(v.adapted.get("decode_lines"))
    return {
        # Failures on lines a declined change would have rewritten (repair.failures), named with that change.
        "declined_causes": declined_causes(state),
        "graph_breaks": v.graph_breaks,
        "recompiles": v.recompiles,
        "tokens_equal": v.tokens_equal,
        "logits_max_abs_diff": v.logits_max_abs_diff,
        "prefill_ms": {"eager": eager.prefill_ms, "graph": graph.prefill_ms},
        "decode_ms_per_token": {"eager": eager.decode_ms_per_token, "graph": graph.decode_ms_per_token},
        "warmup_s": graph.warmup_s,
        "decode_speedup": v.decode_speedup,
        "backend": v.backend,
        "passed": v.passed,
        "problems": v.problems,
        "recompile_limit_hit": v.recompile_limit_hit,
        "first_divergent_step": v.first_divergent_step,
        "steps": v.steps,
        **_adaptation_fields(state, manual),
        # Of the manual items, the ones on lines one traced Decode step of the adapted model runs (added;
        # None: not traced).
        "manual_items_run_by_decode": sum(bool(m["decode_runs"]) for m in manual) if traced else None,
        # The adapted side's environment, and the interpreter each side ran under (a target may name its own).
        "env": {**v.adapted["env"],
                "sides": {"original": _side(v.original["env"]), "adapted": _side(v.adapted["env"])}},
        "timings": {"eager": eager.model_dump(), "graph": graph.model_dump()},
        "logits_max_abs_diff_per_step": v.logits_max_abs_diff_per_step,
        "tokens": {"eager": v.original["tokens"], "graph": v.adapted["tokens"]},
        # Repeated runs (added): every figure per side as {"median", "min", "max", "runs"}; the scalar
        # fields above are these medians. Older sessions (one run) lack them.
        "runs": v.runs,
        "figures": v.figures,
        "decode_speedup_range": v.decode_speedup_range,
        # Whether decode_speedup cannot be quoted (added; the report's "unstable"): too spread over the runs, or
        # timed beside another batch target's work.
        "decode_speedup_unstable": v.decode_speedup_unstable,
        # model: the entry class analyze found; model_classes: what each side's harness really built.
        "variables": {**v.variables, "model": state.entry_class or None, "model_classes": v.variables.get("model")},
        "tokens_identical_across_runs": v.tokens_identical_across_runs,
        "logits_max_abs_diff_across_runs": v.logits_max_abs_diff_across_runs,
        "tokens_compared": v.tokens_compared,
        "tokens_differing": v.tokens_differing,
        "similarity": v.similarity,
        "similarity_threshold": v.similarity_threshold,
        "decode_ms_per_step": v.decode_ms_per_step,
        "compile_logs": [f"logs/{name}" for name in v.compile_logs],
        "unstable_figures": v.unstable_figures,
        # Timing runs that ran beside another batch target's work after waiting out GRAPHMODE_CORES_WAIT_S (added).
        "timed_beside_other_targets": v.timed_beside_other_targets,
        "compile_cache": v.compile_cache,
        # Batch buckets (added): one entry per bucket run; [] without --batch-buckets.
        "batch_buckets": v.bucket_sweep.get("buckets", []),
        "batch_buckets_skipped": v.bucket_sweep.get("skipped", []),
        "batch_buckets_padding": v.bucket_sweep.get("padding"),
        # The original harness against the adapted sources (added): {"ran", "tokens_equal", ...}.
        "own_harness": v.own_harness,
        # The equivalence battery (added): rows {"name", "path", "status", "detail"}; part of the verdict.
        "battery": v.battery,
        # Why the own harness and the battery did not run (added): the runs had already failed and another round could
        # repair them first; "" when they ran.
        "later_checks_skipped": v.later_checks_skipped,
        # With fusions applied (added; {} without): Decode with and without them in the same runs, the ops of one
        # Decode step before (without) and after (with), and what each fusion does (`notes`).
        "fusion": {**v.fusion, "notes": fusion_notes(v.fusion["applied"])} if v.fusion else {},
        # What capture/replay needs (added): {"static_addresses": {side: [per run {"tensors", "checks", "moved"}]},
        # "cuda_graphs": {side: [per run {"captures", "replays", "skips", "skip_reasons", ...}], "buckets": {...}}}.
        "capture": v.capture,
    }


def fusion_notes(names: list[str]) -> dict[str, str]:
    """What each applied fusion does, in its codemod's words (its DESCRIPTION; a name this graphmode does not know
    is said to be so)."""
    return {name: CODEMODS[name].DESCRIPTION if name in CODEMODS
            else "no description: this graphmode has no codemod of that name" for name in names}
