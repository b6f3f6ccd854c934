"""One small function per workflow step. Each reads the state and returns the fields it changes."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from langgraph.types import interrupt

from graphmode.agent.errors import UserError
from graphmode.agent.output import remove_tree, render, write_adapted_tree, write_atomic
from graphmode.agent.targets.sources import declared_sources, read_source
from graphmode.agent.workflow import progress
from graphmode.agent.workflow.adaptation import adapt_sources, evidence_caches, evidence_cache_writes, fusion_numbers, \
    parameter_values, plan_changes, static_length
from graphmode.agent.workflow.choices import choice_problem, needs_of, proposed_choice
from graphmode.agent.workflow.diffs import change_diffs
from graphmode.agent.workflow.knowledge import skill
from graphmode.agent.workflow.leftovers import entry_blockers, merge_by_line
from graphmode.agent.workflow.report.write import write_report
from graphmode.agent.workflow.revisions import PARAMETERS, parameters_of, traced_dims
from graphmode.agent.workflow.runtime_findings import with_runtime_findings
from graphmode.agent.workflow.state import Baseline, RunState, Verification
from graphmode.transforms.codemods import CODEMODS
from graphmode.transforms.output.helper_module import helper_module_diffs
from graphmode.transforms.rules import scan_source


def analyze(state: RunState) -> dict:
    """Static rules over the sources, one traced eager run of the unmodified Prefill and Decode (the evidence the
    findings are checked against), then one real run of the unmodified Decode under Dynamo."""
    # torch is imported only by the steps that run models
    from graphmode.runners.evidence.collect import collect_evidence
    from graphmode.runners.evidence.findings import reconcile
    from graphmode.runners.probe.probe import probe

    opts = state.options
    target, logs = Path(opts.target), Path(opts.run_dir) / "logs"
    sources = opts.sources or declared_sources(target)
    findings = [f for relative in sources for f in scan_source(read_source(target, relative), relative)]
    evidence = _user_code(lambda: collect_evidence(target, log_dir=logs, timeout_s=opts.timeout_s,
                                                   sources=opts.sources), opts.python)
    probed = _user_code(
        lambda: probe(target, steps=8, backend=opts.backend, log_dir=logs, timeout_s=opts.timeout_s), opts.python)
    probed.pop("sources", None)  # the harness's SOURCES, as `sources` below has them (or graphmode.toml's instead)
    baseline = Baseline.model_validate(probed)
    check_batch_fits(opts.batch_buckets, baseline)
    return {
        "sources": sources,
        "findings": with_runtime_findings(reconcile(findings, evidence), baseline, sources),
        "baseline": baseline,
        "evidence": evidence.to_dict(),  # as checkpoints keep it; RunState builds the record from it
    }


def check_batch_fits(buckets: list[int], baseline: Baseline) -> None:
    """The harness batch must fit a bucket; said now rather than after every verification run."""
    batch = (baseline.prompt_shape or [1])[0]
    if buckets and batch > max(buckets):
        raise UserError(f"--batch-buckets {','.join(map(str, buckets))}: the harness prompt has a batch of {batch}, "
                        f"larger than the largest bucket; add a bucket of at least {batch}")


def _user_code(run, python: str | None):
    """Runs a step that executes the user's code in workers, under the target's interpreter (`python`; None:
    graphmode's own); their one-line failure becomes a UserError."""
    from graphmode.runners.interpreter import running_under
    from graphmode.runners.subprocess_run import WorkerError

    try:
        with running_under(python):
            return run()
    except WorkerError as error:
        raise UserError(str(error)) from None


def design(state: RunState) -> dict:
    """Plans every change the codemods can make and writes the design document for approval."""
    adaptations = adapt_sources(state, None)
    plan = plan_changes(adaptations, state.findings)
    covered = {i for change in plan for i in change.fixes}
    manual = merge_by_line([
        {"kind": "finding", **f.to_dict(), "why": skill(f.skill).summary}
        for i, f in enumerate(state.findings) if i not in covered
    ] + [
        {"kind": "codemod", "path": a.path, **m.to_dict(), "why": skill(m.skill).summary}
        for a in adaptations.values() for m in a.manual
    ])
    file_diffs = {a.path: a.diff() for a in adaptations.values() if a.changed}
    # A change is shown as the static path differs from the original in the function it rewrites; the file itself
    # keeps that function's original body beside the rewrite (planned.diff).
    diffs = change_diffs({a.path: a.static_diff() for a in adaptations.values() if a.changed},
                         {c.id: c.edits for c in plan})
    config = full_config(Path(state.options.target))
    run_dir = Path(state.options.run_dir)
    plan = [c.model_copy(update={"diff_path": _write_change_diff(run_dir, c.id, diffs.get(c.id, "")),
                                 "numbers": fusion_numbers(c.codemod, config)})
            for c in plan]
    planned = run_dir / "planned.diff"
    write_atomic(planned, "".join(file_diffs.values())
                 + helper_module_diffs({a.path: a.adapted for a in adaptations.values() if a.changed}))
    path = run_dir / "design.md"
    from graphmode.runners.interpreter import own_interpreter  # reads metadata only: no torch

    # The releases the model runs on: those of the target's interpreter, checked and described when the run began.
    interpreter = state.options.interpreter or own_interpreter().to_dict()
    evidence = state.evidence
    caches = (evidence_caches(evidence), evidence_cache_writes(evidence)) if evidence else ((), ())
    text = render(
        "design.md.j2", state=state, plan=plan, findings=state.findings, manual=manual, skill=skill,
        fixed={i: change.id for change in plan for i in change.fixes}, interpreter=interpreter,
        needs={change.id: needs_of(plan, change.id) for change in plan},
        transformers=interpreter["transformers"], values=parameter_values(state), parameters=PARAMETERS,
        shown={change.id: parameters_of(change) for change in plan},
        dims={change.id: traced_dims(change, *caches) for change in plan},
        proposed=proposed_choice(plan, state.declined) if state.round > 1 else None,
        last_round=state.rounds[-1] if state.rounds else None, blockers=entry_blockers(manual),
    )
    write_atomic(path, text)
    # Every design is kept: a revision or a repair round writes a new one beside the earlier ones.
    kept = run_dir / "designs" / f"design-{len(state.designs) + 1}.md"
    write_atomic(kept, text)
    return {"plan": plan, "manual": manual, "design_path": str(path), "planned_diff_path": str(planned),
            "designs": [*state.designs, str(kept)], "revising": False}


def _write_change_diff(run_dir: Path, change: str, diff: str) -> str:
    """The change's diff in changes/<id>.diff of the run folder (each design writes them anew); "" for none."""
    path = run_dir / "changes" / f"{change}.diff"
    if not diff:
        path.unlink(missing_ok=True)
        return ""
    write_atomic(path, diff)
    return str(path)


def confirm(state: RunState) -> dict:
    """Waits for a person's answer (or, with --yes, takes every change but what a person declined in an earlier
    round). The command line checks an answer before the session sees it (agent.cli.sessions,
    agent.cli.terminal)."""
    if state.options.auto_approve:
        return take_answer(state, "proposed")
    return take_answer(state, interrupt({"design": state.design_path, "changes": [[c.id, c.title] for c in state.plan],
                                         "round": state.round, "offers": state.offers}))


def take_answer(state: RunState, answer) -> dict:
    """The fields an answer at confirmation changes: "all", "proposed" (agent.workflow.choices.proposed_choice), a list
    of ids, or {"revise": {parameter: value}} (design runs again with the new values). The last guard: an
    inconsistent choice is refused, never trimmed."""
    # The round would repeat the last one (agent.workflow.repair.rounds.nothing_new).
    if isinstance(answer, dict) and "stop" in answer:
        return {"approved": proposed_choice(state.plan, state.declined), "stopped": answer["stop"]}
    if isinstance(answer, dict):
        return {"revisions": {**state.revisions, **answer["revise"]}, "revising": True, "approved": None}
    chosen = _chosen_ids(state, answer)
    problem = choice_problem(state.plan, chosen)
    if problem:
        raise UserError(problem)
    return {"approved": [c.id for c in state.plan if c.id in chosen]}


def _chosen_ids(state: RunState, answer) -> list[str]:
    """The change ids a choice answer names: every planned one for "all", the proposed ones for "proposed", else
    the ids given."""
    if answer == "all":
        return [c.id for c in state.plan]
    if answer == "proposed":
        return proposed_choice(state.plan, state.declined)
    return list(answer or [])


def after_confirm(state: RunState) -> str:
    """The step after confirmation: design again after a revision; the report alone when every planned change
    was declined (an empty adaptation has nothing to verify) or when the round would only repeat the last one
    (`stopped`); implement otherwise, also when nothing was planned (a model may already have its entry points)."""
    if state.revising:
        return "design"
    return "report" if state.stopped or (state.plan and not state.approved) else "implement"


DECLINED_ALL = "every planned change was declined: nothing was adapted, so nothing was verified"


def implement(state: RunState) -> dict:
    """Applies the approved codemods to copies of the sources; the originals are never touched."""
    selected = {c.codemod for c in state.plan if c.id in (state.approved or [])}  # closed under needs (confirm)
    adaptations = adapt_sources(state, selected)
    run_dir = Path(state.options.run_dir)
    adapted_dir = run_dir / "adapted"
    write_adapted_tree(Path(state.options.target), adapted_dir,
                       {a.path: a.adapted for a in adaptations.values() if a.changed})
    diff_path = run_dir / "changes.diff"
    write_atomic(diff_path, "".join(a.diff() for a in adaptations.values())
                 + helper_module_diffs({a.path: a.adapted for a in adaptations.values() if a.changed}))
    applied = [name for name in CODEMODS if any(name in a.applied for a in adaptations.values())]
    unfused_dir = _write_unfused(state, selected, fusions_of(applied))
    return {"applied": applied, "adapted_dir": str(adapted_dir), "diff_path": str(diff_path),
            "unfused_dir": str(unfused_dir) if unfused_dir else ""}


UNFUSED_DIR = "adapted-unfused"


def fusions_of(applied: list[str]) -> list[str]:
    """The fusion codemods (FUSION = True) among `applied`, in chain order."""
    return [name for name in applied if name in CODEMODS and CODEMODS[name].FUSION]


def _write_unfused(state: RunState, selected: set[str], fusions: list[str]) -> Path | None:
    """With fusions applied, the same selection without them in adapted-unfused/ (verify times Decode with and
    without them); None, and no such folder left from an earlier run, when no fusion was applied."""
    unfused_dir = Path(state.options.run_dir) / UNFUSED_DIR
    if not fusions:
        remove_tree(unfused_dir)
        return None
    adaptations = adapt_sources(state, selected - set(fusions))
    write_adapted_tree(Path(state.options.target), unfused_dir,
                       {a.path: a.adapted for a in adaptations.values() if a.changed})
    return unfused_dir


def verify(state: RunState) -> dict:
    """Original eager against adapted with Decode compiled, each in a fresh process."""
    from graphmode.runners.verify.verify import AdaptedNotRunnable, verify as run_verification

    opts = state.options
    missing = _why_no_entries(state)
    if missing:  # nothing the adapted side could run: the design's own reason, not a missing method
        return {"verification": Verification(ran=False, problems=[missing])}

    def run():
        try:
            return run_verification(
                Path(opts.target), Path(state.adapted_dir), opts.backend, steps=opts.steps,
                log_dir=Path(opts.run_dir) / "logs", runs=opts.runs, similarity=opts.similarity,
                compile_cache=_compile_cache(state), batch_buckets=opts.batch_buckets or None,
                timeout_s=opts.timeout_s, progress=progress.say,
                # With fusions applied, a third side: the same adaptation without them, timed in the same runs.
                unfused_dir=Path(state.unfused_dir) if state.unfused_dir else None,
                fusions=fusions_of(state.applied), full_config=full_config(Path(opts.target)),
                static_length=static_length(state),
                # A failed round that another may repair: its own-harness and battery checks would be run on code
                # about to change; the round that verifies the repair runs them.
                checks_after_failed_runs=state.round >= opts.rounds,
            )
        except AdaptedNotRunnable as error:
            return error  # the adaptation's outcome, not bad input: the report says why and what is left

    result = _user_code(run, opts.python)
    if isinstance(result, AdaptedNotRunnable):
        return {"verification": Verification(ran=False, problems=[str(result)])}
    return {"verification": result}


def after_verify(state: RunState) -> str:
    """A verified model goes to the report; a failed verification to the repair, which decides whether another
    round can fix it."""
    return "report" if state.verification is not None and state.verification.passed else "repair"


def repair(state: RunState) -> dict:
    """Maps the failed verification to the original's lines and plans the next round (agent.workflow.repair): the
    evidence the adapted run revealed, a declined change offered again, a change that alters the tokens (bisected) left
    out. Without a next round, it records why."""
    from graphmode.agent.workflow.repair.rounds import bisect_applied, plan_repair, round_record, tokens_differ

    v = state.verification
    bisect = v is not None and v.ran and tokens_differ(v) and state.round < state.options.rounds
    fix = plan_repair(state, _user_code(lambda: bisect_applied(state), state.options.python) if bisect else None)
    record = round_record(state, fix.repairs, fix.outcome)
    # What a person declined stays out of later --yes rounds, unless they took it back in this one.
    declined = sorted(({*state.declined} - {*record.approved}) | {*record.declined})
    update = {"rounds": [*state.rounds, record], "declined": declined}
    if not fix.another_round:
        return update
    evidence = dict(state.repair_evidence)
    if fix.host_sync_lines:
        evidence["host_sync_lines"] = [*evidence.get("host_sync_lines", []), *fix.host_sync_lines]
    return {**update, "round": state.round + 1, "verification": None, "approved": None, "offers": fix.offers,
            "dropped": [*state.dropped, fix.dropped] if fix.dropped else state.dropped, "repair_evidence": evidence,
            "findings": [*state.findings, *fix.findings]}


def after_repair(state: RunState) -> str:
    """Design again when the repair opened a new round, else the report."""
    return "design" if state.verification is None else "report"


def full_config(target: Path) -> dict | None:
    """The model's full-size config, where the target has one: a Hugging Face folder's config.json (copied into the
    target as it was, before --tiny shrinks the model it builds), at the top or one folder down."""
    for path in [target / "config.json", *sorted(target.glob("*/config.json"))]:
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(values, dict):
            return values
    return None


def _why_no_entries(state: RunState) -> str | None:
    """Why the entry class got no prefill/decode entries, in the design's words (`entry_blockers`), when the entries
    were not added; None when they were, or when the class had its own."""
    if "split_decode" in state.applied:
        return None
    blockers = entry_blockers([item.model_dump() for item in state.manual])
    if not blockers:
        return None
    return f"`{state.entry_class}` has no prefill or decode entry points, as the design says: " + "; ".join(blockers)


def _compile_cache(state: RunState) -> Path | None:
    setting = state.options.compile_cache
    if setting == "off":
        return None
    if setting:
        return Path(setting).expanduser().resolve()
    cache = Path(state.options.run_dir) / "compile-cache"
    shutil.rmtree(cache, ignore_errors=True)  # a leftover from an earlier run would make run 1 look warm
    return cache


def report(state: RunState) -> dict:
    """The test report (agent.workflow.report.write): every round, what was measured, and what is left for a
    person; with every change declined, that nothing was adapted or verified."""
    from graphmode.agent.workflow.repair.rounds import round_record

    update: dict = {}
    if state.verification is None and after_confirm(state) == "report":
        update["verification"] = Verification(ran=False, problems=[state.stopped or DECLINED_ALL])
    finished = state.model_copy(update=update)
    if not state.rounds or state.rounds[-1].number != state.round:  # verified, or declined: the repair never ran
        outcome = "verified" if finished.verification.passed else \
            (finished.verification.problems or ["not verified"])[0]
        record = round_record(finished, [], outcome)
        if state.stopped:  # the round was not run: what is applied (adapted/) is the last round's, not this one's
            record = record.model_copy(update={"applied": []})
        update["rounds"] = [*state.rounds, record]
        finished = state.model_copy(update=update)
    return {**update, "report_path": str(write_report(finished))}
