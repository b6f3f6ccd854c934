"""Which changes a person's choice needs: a choice is completed with a person's consent or refused, never trimmed."""
from __future__ import annotations

from graphmode.agent.workflow.state import Change


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


def needs_of(plan: list[Change], change_id: str) -> list[str]:
    """Everything applying `change_id` alone needs (directly, through other changes, and the entry points): what the
    design and the confirmation table list for it, and what a choice of it alone is asked to add."""
    return unmet_needs(plan, [change_id])


def choice_problem(plan: list[Change], chosen: list[str]) -> str | None:
    """Why a choice of changes cannot be applied as it stands (unknown ids, or needs left out); None if it can."""
    unknown = [c for c in chosen if c not in {change.id for change in plan}]
    if unknown:
        return f"no change {', '.join(unknown)} in this design (it has {', '.join(c.id for c in plan) or 'none'})"
    missing = unmet_needs(plan, chosen)
    if missing:
        reasons = [f"{c} needs {', '.join(n for n in needs_of(plan, c) if n not in chosen)}"
                   for c in chosen if any(n not in chosen for n in needs_of(plan, c))]
        entries = next((c.id for c in plan if c.codemod == "split_decode"), None)
        if entries in missing:
            reasons.append(f"without {entries} (the prefill/decode entry points) the adapted model cannot run in "
                           "graph mode")
        why = "; ".join(reasons)
        fixed = [c.id for c in plan if c.id in set(chosen) | set(missing)]
        return f"{why}; approve {','.join(fixed)} instead"
    return None


def proposed_choice(plan: list[Change], declined: list[str]) -> list[str]:
    """Every change but those of the codemods a person declined in an earlier round, and those that need one of
    them: what a later round proposes, and what a --yes round applies (it never adds back what a person declined)."""
    left_out = {c.id for c in plan if c.codemod in declined}
    return [c.id for c in plan if c.id not in left_out and not left_out & set(needs_of(plan, c.id))]
