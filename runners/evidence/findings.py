"""The runtime evidence (runners.evidence.model) as findings, and reconciled with the static rules' findings.

`evidence_findings` turns what the trace saw into findings of the usual codes; `reconcile` drops static findings
the trace contradicts on lines Decode ran, marks those on lines Decode never ran, attaches the trace's account to
the ones it confirms, and adds what no rule reported. Pure: no model runs here.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from graphmode.runners.evidence.model import (DECODE, PREFILL, SLICE_OPS, Evidence, FunctionEvidence, Growth,
                                              LineEvidence, ScalarChange, SourceLine, delta_text, grouped_by_op,
                                              shape_text)
from graphmode.transforms.findings import Finding
from graphmode.transforms.rules import RULES


# What the trace can say of each code, as the rule classes state it (transforms.rules: TRACED, EXPLAINED_BY, SKILL).
_RULES = {rule.CODE: rule for rule in RULES}
TRACED_CODES = frozenset(code for code, rule in _RULES.items() if rule.TRACED)
_WRITES = frozenset({"setitem", "index_put", "index_put_", "copy_"})
SEEN, PREFILL_ONLY, NOT_RUN = "seen", "prefill-only", "not-run"
CAT_OPS = frozenset({"cat", "concat", "concatenate", "hstack", "vstack", "dstack", "column_stack", "stack"})
# The code and the words of each kind of host sync the trace records (HostSync.kind).
SYNC_CODES = {"item": "GM101", "tolist": "GM101", "data-dependent": "GM101", "int": "GM102", "float": "GM102",
              "bool": "GM102", "cpu": "GM103", "numpy": "GM103", "format": "GM104", "branch": "GM402"}
_SYNC_WORDS = {"item": "`.item()`", "tolist": "`.tolist()`", "int": "`int()` of a tensor",
               "float": "`float()` of a tensor", "bool": "`bool()` of a tensor", "cpu": "a copy to the host",
               "numpy": "`.numpy()`", "format": "formatting a tensor as text",
               "data-dependent": "an op whose output size depends on tensor values",
               "branch": "a Python branch on a tensor value (`Tensor.__bool__`)"}


def _dims(g: Growth) -> str:
    return ("dim " if len(g.dims) == 1 else "dims ") + " and ".join(map(str, g.dims))


def _series(values: list[Any]) -> str:
    return " -> ".join(shape_text(v) if isinstance(v, list) else str(v) for v in values)


def _ints_text(scalars: list[ScalarChange]) -> str:
    return ", ".join(f"{s.arg} {_series(s.values)} ({delta_text(s.delta)})" for s in scalars)


def _cache_text(g: Growth, where: str) -> str:
    layout = f", layout {g.layout}" if g.layout else ""
    stacked = f", k and v stacked along dim {g.kv_dim}" if g.kv_dim is not None else ""
    piece = f"; the new piece is {g.piece} along dim {g.dims[0]}" if g.piece is not None else ""
    return (f"the KV cache grows with `{g.op}`{where} by {g.by} along {_dims(g)} every Decode step"
            f"{layout}{stacked}: {_series(g.shapes)}; one input is this line's own output of the "
            f"step before (a carried cache){piece}")


def _input_text(g: Growth, where: str, grows: str, new_tokens: int, tokens: bool) -> tuple[str, str]:
    """A growing input from outside the sources: the token sequence (no KV cache), a mask, or a cache."""
    if tokens:
        return "GM301", (f"no KV cache: the model gets the whole token sequence again every Decode step "
                         f"(`{g.op}`{where} output {grows}) and recomputes every position; keep a KV cache "
                         f"and feed only the {new_tokens} new token(s)")
    if g.dtype.startswith(("int", "uint", "long")) or g.dtype == "bool":
        return "GM201", (f"`{g.op}`{where} gets an integer or boolean tensor from outside the sources, not the "
                         f"tokens, that {grows}: a mask the caller grows with the sequence (generate()'s 2-D "
                         "attention mask), a new shape every step; hand it at the full length the static buffers "
                         "hold")
    return "GM301", (f"`{g.op}`{where} gets a tensor from outside the sources that {grows}; "
                     "a cache grown by the caller has a new shape every step")


def _growth_text(g: Growth, scalars: list[ScalarChange], new_tokens: int, tokens: bool = False) -> tuple[str, str]:
    """(code, message) for a growing tensor that is a cause; `tokens`: it is where the growing token sequence
    enters (Evidence.recomputes_sequence)."""
    where = f" (in {g.via})" if g.via else ""
    grows = f"grows by {g.by} along {_dims(g)} every Decode step: {_series(g.shapes)}"
    if g.kind == "cache":
        return "GM301", _cache_text(g, where)
    if g.kind == "input":
        return _input_text(g, where, grows, new_tokens, tokens)
    ints = f"; Python ints {_ints_text(scalars)}" if scalars else ""
    if g.kind == "slice":
        return "GM302", f"`{g.op}`{where} reads a slice of a fixed tensor that {grows}{ints}"
    return "GM201", f"`{g.op}`{where} builds a tensor per step that {grows}{ints}"


def _line_findings(line: SourceLine, entry: LineEvidence, evidence: Evidence) -> list[Finding]:
    messages: dict[str, list[str]] = defaultdict(list)
    for code, message in [*_growth_messages(line, entry, evidence), *_moving_int_messages(entry)]:
        messages[code].append(message)
    for sync in (sync for sync in entry.syncs if sync.decode):
        messages[SYNC_CODES[sync.kind]].append(_sync_text(sync, evidence.steps))
    return [Finding(code, line.file, line.line, 1, "; ".join(texts), _RULES[code].SKILL, function=entry.function,
                    source="trace", autofix=False, trace=SEEN)
            for code, texts in sorted(messages.items())]


def _growth_messages(line: SourceLine, entry: LineEvidence, evidence: Evidence) -> list[tuple[str, str]]:
    """(code, message) for each growth that starts at the line (not one derived from a growing input)."""
    return [_growth_text(g, [s for s in entry.scalars if s.op == g.op and s.via == g.via], evidence.new_tokens,
                         evidence.recomputes_sequence == line)
            for g in entry.growing if g.kind != "derived"]


def _moving_int_messages(entry: LineEvidence) -> list[tuple[str, str]]:
    """(code, message) for each op whose Python ints change every step, where no growth at the line explains them."""
    explained = {(g.op, g.via) for g in entry.growing if g.kind != "derived"}
    return [_moving_int_text(op, via, scalars)
            for (op, via), scalars in grouped_by_op(s for s in entry.scalars if (s.op, s.via) not in explained)]


def _sync_text(sync, steps: int) -> str:
    where, count = f" (in {sync.via})" if sync.via else "", f"{sync.decode / steps:g}x per Decode step"
    return f"{_SYNC_WORDS[sync.kind]} (`{sync.op}`{where}) reads the device on the host, {count}"


def _moving_int_text(op: str, via: str | None, scalars: list) -> tuple[str, str]:
    """(code, message) for an op that gets Python ints changing every Decode step: bounds of a write or a slice
    (GM302), or any other argument (GM501)."""
    where, ints = f" (in {via})" if via else "", _ints_text(scalars)
    if op in _WRITES:
        return "GM302", f"`{op}`{where} writes at Python-int bounds that change every Decode step: {ints}"
    if op in SLICE_OPS:
        return "GM302", f"`{op}`{where} slices at Python-int bounds that change every Decode step: {ints}"
    return "GM501", f"`{op}`{where} gets Python ints that change every Decode step: {ints}"


def _param_findings(evidence: Evidence) -> list[Finding]:
    out = []
    for where, function in evidence.functions.items():
        for name, change in function.params.items():
            out.append(Finding(
                "GM501", where.file, where.line, 1,
                f"`{name}` is a Python int parameter of `{function.name}` that changes every Decode step: "
                f"{_series(change.values)} ({delta_text(change.delta)}); each value is a new constant for a graph",
                _RULES["GM501"].SKILL, function=function.name, source="trace", autofix=False, trace=SEEN))
    return out


def evidence_findings(evidence: Evidence) -> list[Finding]:
    """Findings for every hazard the trace saw in Decode: carried caches (GM301), growing slices and
    moving slice bounds (GM302), tensors built per step with a growing size (GM201), Python ints that
    change every step (GM501, at the consuming line and at the parameter's function), host syncs
    (GM101-GM104) and branches on tensor values (GM402). Ops that grow only because an input grows are
    consequences and get no finding of their own."""
    found: list[Finding] = []
    for where, entry in evidence.lines.items():
        found.extend(_line_findings(where, entry, evidence))
    found.extend(_param_findings(evidence))
    return sorted(found, key=lambda f: (f.path, f.line, f.code))


@dataclass
class Reconciled:
    findings: list[Finding]  # the static findings kept (with what the trace said) and those added
    dropped: list[Finding]  # static findings on lines Decode ran without the hazard
    added: list[Finding]  # hazards the trace saw that no static finding reports


def _param_name(message: str) -> str | None:
    match = re.search(r"`(\w+)`", message)
    return match[1] if match else None


def _functions_named(evidence: Evidence, path: str, name: str) -> list[FunctionEvidence]:
    return [f for where, f in evidence.functions.items() if where.file == path and f.name == name]


def _static_verdict(f: Finding, evidence: Evidence, trace: dict[tuple[str, int], list[Finding]]) -> tuple[str, str]:
    """(SEEN | PREFILL_ONLY | NOT_RUN | "drop", what the trace saw) for one static finding."""
    steps = f"the {evidence.steps} traced Decode step(s)"
    functions = _functions_named(evidence, f.path, f.function) if f.code == "GM501" else []
    if functions:
        return _parameter_verdict(f, functions, trace, steps)
    phases = evidence.ran(f.path, f.line)
    if DECODE not in phases:
        return _not_run(phases, steps)
    located = evidence.at(f.path, f.line)
    entries = [entry for _, entry in located]
    if not _hazard_seen(f.code, entries):
        return "drop", ""
    return SEEN, "trace: " + "; ".join(dict.fromkeys(_seen_at(f, located, trace)))


def _seen_at(f: Finding, located: list, trace: dict[tuple[str, int], list[Finding]]) -> list[str]:
    """What the trace's own findings at the finding's lines say, or else the first growth seen there (a cat that
    grows only because its inputs grow has no finding of its own)."""
    seen = [t.message for line, _ in located for t in trace.get((f.path, line), [])
            if f.code in _RULES[t.code].EXPLAINED_BY]
    return seen or [f"{g.op} {_dims(g)} {_series(g.shapes)}" for _, e in located for g in e.growing][:1]


def _parameter_verdict(f: Finding, functions: list, trace: dict[tuple[str, int], list[Finding]],
                       steps: str) -> tuple[str, str]:
    """A GM501 finding on a parameter of traced functions: seen where the trace saw that parameter change, dropped
    where Decode ran the function and saw nothing, else the phases that ran it."""
    name = _param_name(f.message)
    if any(name in fn.params for fn in functions):
        said = [t.message for ts in trace.values() for t in ts if _same_parameter(f, t)]
        return SEEN, "trace: " + "; ".join(said)
    phases = {p for fn in functions for p in fn.phases}
    return ("drop", "") if DECODE in phases else _not_run(phases, steps)


def _grows_by_cat(entries: list) -> bool:
    return any(g.op in CAT_OPS or g.kind in ("cache", "input") for e in entries for g in e.growing)


def _hazard_seen(code: str, entries: list) -> bool:
    """Whether the trace's entries at a finding's line show the hazard its rule names in Decode."""
    if code == "GM301":
        return _grows_by_cat(entries)
    if code in ("GM201", "GM302"):
        return any(e.growing or e.scalars for e in entries)
    if code == "GM501":
        return any(e.scalars for e in entries)
    return any(s.decode for e in entries for s in e.syncs)  # host syncs and tensor branches


def _not_run(phases: set[str], steps: str) -> tuple[str, str]:
    if PREFILL in phases:
        return PREFILL_ONLY, f"trace: ran only in Prefill, not in {steps}"
    return NOT_RUN, f"trace: not run by Prefill or {steps} (other configurations may run it)"


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def reconcile_details(static: list[Finding], evidence: Evidence) -> Reconciled:
    """`reconcile`, with the static findings it dropped and the trace findings it added kept apart."""
    trace_findings = evidence_findings(evidence)
    by_line: dict[tuple[str, int], list[Finding]] = defaultdict(list)
    for t in trace_findings:
        by_line[(t.path, t.line)].append(t)
    kept, dropped = _judged_static(static, evidence, by_line)
    added: list[Finding] = []
    for t in trace_findings:
        i = _covering(kept, t, evidence)
        if i is None:
            added.append(t)
        elif t.message not in kept[i].evidence:
            kept[i] = replace(kept[i], evidence=_join(kept[i].evidence, f"trace: {t.message}"),
                              trace=kept[i].trace or SEEN)
    return Reconciled(kept + added, dropped, added)


def _judged_static(static: list[Finding], evidence: Evidence, by_line: dict[tuple[str, int], list[Finding]]
                   ) -> tuple[list[Finding], list[Finding]]:
    """(kept, dropped): each static finding the trace can judge, with what it saw, or dropped where it saw the line
    run in Decode without the hazard; the others kept as they are."""
    kept: list[Finding] = []
    dropped: list[Finding] = []
    for f in static:
        if f.path not in evidence.sources or f.code not in TRACED_CODES:
            kept.append(f)
            continue
        verdict, seen = _static_verdict(f, evidence, by_line)
        if verdict == "drop":
            dropped.append(f)
        else:
            kept.append(replace(f, trace=verdict, evidence=_join(f.evidence, seen)))
    return kept, dropped


def _covering(kept: list[Finding], t: Finding, evidence: Evidence) -> int | None:
    """The index of the first kept finding that already stands for trace finding `t` (its rule explains it at the
    same statement or parameter, or it is about a use of the parameter `t` saw change), or None."""
    statement = evidence.lines.get(SourceLine(t.path, t.line))
    lines = {t.line, statement.statement} if statement and statement.statement else {t.line}
    explained_by = _RULES[t.code].EXPLAINED_BY
    return next((i for i, f in enumerate(kept) if f.path == t.path and (
        f.code in explained_by and (f.line in lines or _same_parameter(f, t)) or _uses_parameter(f, t))), None)


def _same_parameter(static: Finding, trace: Finding) -> bool:
    """A static GM501 names a parameter on its own line; the trace's is at the function's def line."""
    return (static.code == trace.code == "GM501" and static.function == trace.function
            and _param_name(static.message) == _param_name(trace.message))


def _uses_parameter(static: Finding, trace: Finding) -> bool:
    """A static finding in the same function about a use of the int parameter the trace saw change (`if seq_len >
    self.max_seq_len_cached:`) already stands for it: the fix of that use is the fix of the parameter."""
    name = _param_name(trace.message) if trace.code == "GM501" else None
    return bool(name) and static.function == trace.function and f"`{name}`" in static.message


def reconcile(static: list[Finding], evidence: Evidence) -> list[Finding]:
    """Static findings checked against the trace, plus what only the trace saw.

    (a) A static finding of TRACED_CODES on a line Decode ran without that hazard is dropped (a GM402
    where Decode neither synced nor branched on a tensor; a GM301 whose cat did not grow). One on a
    line Decode never ran is kept, marked `trace="prefill-only"` or `"not-run"`: other configurations
    may run it. One the trace confirmed gets `trace="seen"` and what was seen in `evidence`.
    (b) Every trace finding no static finding on its line explains is added (source="trace").
    """
    return reconcile_details(static, evidence).findings
