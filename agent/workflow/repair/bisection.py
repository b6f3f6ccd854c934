"""Which applied change makes the adapted model's tokens differ from the original's: a bisection over the chain.

The changes are tried as prefixes of the chain, each closed under what it needs, always with the entry points
(without `prefill`/`decode` nothing runs in graph mode). The full set is known to differ (verification saw it); the
smallest prefix that differs ends with the change that brought the difference in. That takes about log2(n) runs of
the adapted model instead of one per change, each one Decode in graph mode against the original's tokens.

A prefix that does not run at all (a change later in the chain supplies something it relies on, unsaid in the
needs) says nothing about the tokens; the search takes it as not differing and goes on towards the full set. The
culprit's claim is then checked where it counts: the next round verifies the adaptation without it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from graphmode.agent.workflow.choices import unmet_needs
from graphmode.agent.workflow.state import Change


@dataclass
class Bisection:
    culprit: Change | None  # None: nothing was left to try
    # {"changes": [ids], "differs": True | False | None (did not run), "detail": str}
    trials: list[dict] = field(default_factory=list)
    why: str = ""


def bisect_changes(plan: list[Change], applied: list[Change],
                   differs: Callable[[list[str]], tuple[bool | None, str]]) -> Bisection:
    """The change of `applied` (in chain order) whose addition makes `differs(ids)` true; `differs` runs the
    adaptation of those ids and says whether it differs from the original (None: it did not run), with a one-line
    detail."""
    entries = [c.id for c in applied if c.codemod == "split_decode"]
    base = entries + unmet_needs(plan, entries) if entries else []
    candidates = [c for c in applied if c.id not in base]
    found = Bisection(culprit=None)

    def prefix(k: int) -> list[str]:
        chosen = set(base) | {c.id for c in candidates[:k]}
        chosen |= set(unmet_needs(plan, sorted(chosen)))
        return [c.id for c in plan if c.id in chosen]

    def fails(k: int) -> bool:
        ids = prefix(k)
        result, detail = differs(ids)
        found.trials.append({"changes": ids, "differs": result, "detail": detail})
        return bool(result)

    if not candidates:
        found.why = "no change besides the entry points was applied: none can be left out"
        return found
    low, high = -1, len(candidates)  # prefix(high) differs; prefix(low) does not (-1: nothing tried yet)
    while high - low > 1:
        middle = (low + high + 1) // 2 if low < 0 else (low + high) // 2
        if fails(middle):
            high = middle
        else:
            low = middle
    if high == 0:
        found.why = (f"the entry points alone ({', '.join(prefix(0))}) already differ from the original: no change "
                     "can be left out")
        return found
    found.culprit = candidates[high - 1]
    before = next(t for t in found.trials if t["changes"] == prefix(high - 1))  # low = high - 1 was tried
    said = "did not run" if before["differs"] is None else "gives the original's tokens"
    found.why = (f"{', '.join(prefix(high - 1))} {said}; adding {found.culprit.id} (`{found.culprit.codemod}`) "
                 "makes the tokens differ")
    return found
