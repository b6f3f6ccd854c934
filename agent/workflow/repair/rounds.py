"""After a failed verification: what each failure was, and what the next round does about it.

Every graph break and recompile of the adapted run is mapped to the original's line and to the change that owns
it (agent.workflow.repair.failures), then:
- on a line a change a person declined would rewrite: that change is offered again at the next confirmation (a
  --yes round never adds back what a person declined);
- a graph break that read a tensor on the host where the original's traced run never went (a path only the
  static one takes, a threshold only a longer run crosses): the line joins the traced evidence the codemods read
  (`host_sync_lines`), and it becomes a finding of the next round with the adapted run's words;
- anything else is a finding for a person, with the adapted run's evidence.
When the tokens differ, the applied changes are bisected (agent.workflow.repair.bisection) and the one that brings the
difference in is left out of every later design. Another round runs only when something changed that could fix a
failure, and only while `--rounds` allows.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from graphmode.agent.output import remove_tree, write_adapted_tree
from graphmode.agent.workflow import progress
from graphmode.agent.workflow.adaptation import adapt_sources, host_sync_lines, static_length
from graphmode.agent.workflow.repair.bisection import Bisection, bisect_changes
from graphmode.agent.workflow.repair.failures import causes_among, mapped_failures
from graphmode.agent.workflow.state import Round, RunState, Verification
from graphmode.transforms.findings import Finding

# Words of Dynamo's break reasons when the graph stops to read a tensor's value on the host.
_HOST_READS = ("item()", ".item", "data-dependent", "data dependent", "tolist", "__bool__", "__int__", "__float__",
               "local_scalar_dense", "unbacked", "scalar")


def reads_host(reason: str) -> bool:
    text = reason.lower()
    return any(word in text for word in _HOST_READS)


@dataclass
class Repair:
    repairs: list[dict] = field(default_factory=list)  # Round.repairs
    host_sync_lines: list[list] = field(default_factory=list)  # new evidence: [file, original line]
    offers: list[dict] = field(default_factory=list)  # declined changes behind a failure (repair.failures)
    findings: list[Finding] = field(default_factory=list)  # what the adapted run alone revealed
    dropped: dict | None = None  # {"codemod", "change", "round", "why", "trials"}
    outcome: str = ""
    another_round: bool = False


def plan_repair(state: RunState, bisection: Bisection | None) -> Repair:
    """What the next round changes, from the failures of this one (and the bisection, when the tokens differed)."""
    repair = Repair()
    known = {tuple(pair) for pair in state.repair_evidence.get("host_sync_lines", [])}
    if state.evidence is not None:
        known |= set(host_sync_lines(state.evidence))
    # A line an earlier round's adapted run already made a finding of is not said again.
    said = {(f.path, f.line) for f in state.findings if f.source == "adapted"}
    failures = mapped_failures(state)
    repair.offers = causes_among(failures)
    for failure in failures:
        where = (failure["path"], failure["line"])
        entry = {key: failure[key] for key in ("what", "reason", "path", "line", "adapted_line", "count", "change",
                                               "codemod")}
        if failure["change"] is not None and not failure["approved"]:
            repair.repairs.append({**entry, "kind": "declined"})
            continue
        if failure["what"] == "graph break" and reads_host(failure["reason"]) and where not in known:
            repair.repairs.append({**entry, "kind": "evidence"})
            repair.host_sync_lines.append(list(where))
            known.add(where)
        else:
            repair.repairs.append({**entry, "kind": "applied" if failure["change"] else "kept"})
        if where not in said:
            said.add(where)
            repair.findings.append(_finding(state.round, failure))
    if bisection is not None:
        culprit = bisection.culprit
        repair.repairs.append({"kind": "dropped" if culprit else "bisected", "codemod": culprit.codemod if culprit
                               else None, "change": culprit.id if culprit else None, "what": "tokens differ",
                               "reason": bisection.why, "path": None, "line": None, "adapted_line": None})
        if culprit is not None:
            repair.dropped = {"codemod": culprit.codemod, "change": culprit.id, "round": state.round,
                              "why": bisection.why, "trials": bisection.trials}
    repair.another_round, repair.outcome = _next(state, repair)
    return repair


def _finding(round_number: int, failure: dict) -> Finding:
    code = "GM901" if failure["what"] == "graph break" else "GM902"
    said = "graph break" if code == "GM901" else "recompile"
    return Finding(code, failure["path"], failure["line"], 1,
                   f"{said} in round {round_number}'s adapted Decode (adapted line {failure['adapted_line']}): "
                   f"{failure['reason']}", "triage", source="adapted",
                   evidence=f"seen only when the adapted model ran (round {round_number}); the original's traced "
                            "run did not show it")


def _next(state: RunState, repair: Repair) -> tuple[bool, str]:
    """Whether another round could fix something, and the round's outcome in one sentence."""
    reasons = []
    if repair.dropped:
        reasons.append(f"{repair.dropped['change']} (`{repair.dropped['codemod']}`) changes the tokens and is left "
                       "out")
    if repair.host_sync_lines:
        lines = ", ".join(f"{path}:{line}" for path, line in repair.host_sync_lines)
        reasons.append(f"the adapted run read the host at {lines}, which the traced run never reached: planned with "
                       "that evidence")
    if repair.offers and not state.options.auto_approve:
        reasons += [offer_sentence(offers) + ": the next confirmation offers it"
                    for offers in by_change(repair.offers).values()]
    if state.round >= state.options.rounds:
        return False, f"not verified; no round left (--rounds {state.options.rounds})"
    if not reasons:
        left = "; a --yes run does not add back what a person declined" if repair.offers else ""
        return False, f"not verified; nothing a next round could change{left}"
    return True, f"repaired into round {state.round + 1}: " + "; ".join(reasons)


def by_change(offers: list[dict]) -> dict[str, list[dict]]:
    """The offers grouped by the declined change they name, in order."""
    grouped: dict[str, list[dict]] = {}
    for offer in offers:
        grouped.setdefault(offer["change"], []).append(offer)
    return grouped


def offer_sentence(offers: list[dict]) -> str:
    """"C1 (`hoist_item`), which you declined, rewrites model.py:147, where the adapted Decode broke its graph" for
    the offers of one change (its lines, and what the adapted Decode did at each)."""
    first = offers[0]
    lines: dict[str, list[str]] = {}
    for offer in offers:
        lines.setdefault(f"{offer['path']}:{offer['line']}", []).append(
            "broke its graph" if offer["what"] == "graph break" else "recompiled")
    where = "; ".join(f"{line}, where the adapted Decode {' and '.join(dict.fromkeys(did))}"
                      for line, did in lines.items())
    return f"{first['change']} (`{first['codemod']}`), which you declined, rewrites {where}"


def nothing_new(state: RunState, added: list[str]) -> str | None:
    """Why a later round cannot change anything, when it cannot: the last round's repair had nothing to offer but
    the declined changes behind its failures (no new evidence, no change left out), and the person declined them
    again (`added`: the codemods they took back). The same selection would fail the same way, so the session goes to
    the report with this sentence instead of running the round. None when the round can differ from the last."""
    if state.round < 2 or not state.offers or added:
        return None
    if any(r.get("kind") in ("evidence", "dropped") for r in state.rounds[-1].repairs):
        return None
    last = state.rounds[-1]
    refused = ", ".join(f"{change} (`{offers[0]['codemod']}`)" for change, offers in by_change(state.offers).items())
    failed = (last.problems or ["not verified"])[0]
    return (f"round {state.round} was not run: you declined {refused} again, the only change round {last.number}'s "
            f"repair could offer, so round {state.round} would apply the same changes as round {last.number}, which "
            f"failed ({failed})")


def round_record(state: RunState, repairs: list[dict], outcome: str) -> Round:
    """This round as the reports tell it."""
    v = state.verification
    approved = set(state.approved or [])
    ran = v is not None and v.ran
    return Round(
        number=state.round, design_path=state.designs[-1] if state.designs else state.design_path,
        approved=[c.codemod for c in state.plan if c.id in approved],
        declined=[] if state.options.auto_approve else [c.codemod for c in state.plan if c.id not in approved],
        applied=list(state.applied), revisions=dict(state.revisions),
        passed=v.passed if ran else None, problems=list(v.problems) if v is not None else [],
        tokens_equal=v.tokens_equal if ran else None, first_divergent_step=v.first_divergent_step if ran else None,
        graph_breaks=v.graph_breaks if ran else None, recompiles=v.recompiles if ran else None,
        decode_speedup=v.decode_speedup if ran else None, repairs=repairs, outcome=outcome,
    )


def tokens_differ(v: Verification) -> bool:
    """Whether the verification saw the tokens, or the logits beyond their tolerance, differ from the original's."""
    atol = v.logits_atol
    return not v.tokens_equal or (atol is not None and (v.logits_max_abs_diff or 0.0) > atol)


def bisect_applied(state: RunState) -> Bisection:
    """The applied change that brings in the token difference (repair.bisection), each trial one graph run of
    that prefix of the changes, written to bisect/trial-N/ in the run folder."""
    import torch

    from graphmode.runners.verify.verify import DEFAULT_LOGITS_ATOL, matches_original

    opts, v = state.options, state.verification
    run_dir, target = Path(opts.run_dir), Path(opts.target)
    logs, trials = run_dir / "logs", run_dir / "bisect"
    remove_tree(trials)
    reference_logits = logs / "original.logits.pt"
    reference = torch.load(reference_logits) if reference_logits.is_file() else None
    atol = DEFAULT_LOGITS_ATOL if v.logits_atol is None else v.logits_atol
    approved = set(state.approved or [])
    applied = [c for c in state.plan if c.id in approved and c.codemod in state.applied]

    numbers = itertools.count(1)

    def differs(ids: list[str]) -> tuple[bool | None, str]:
        number = next(numbers)
        folder = trials / f"trial-{number}"
        adaptations = adapt_sources(state, {c.codemod for c in state.plan if c.id in ids})
        write_adapted_tree(target, folder, {a.path: a.adapted for a in adaptations.values() if a.changed})
        progress.say(f"bisecting the changes: trial {number} ({','.join(ids)}): running")
        same, detail = matches_original(folder, opts.backend, opts.steps, v.original["tokens"], reference, logs,
                                        f"bisect-{number}", opts.timeout_s, logs, atol, static_length(state))
        progress.say(f"bisecting the changes: trial {number} ({','.join(ids)}): {detail}")
        return (None if same is None else not same), detail

    return bisect_changes(state.plan, applied, differs)
