"""From the traced run's evidence to the codemods' options, and from the codemods' edits to the planned changes."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from graphmode.agent.targets.sources import read_source
from graphmode.agent.workflow.state import Change, RunState
from graphmode.runners.evidence.model import Evidence
from graphmode.transforms.codemods import CODEMODS, Options
from graphmode.transforms.findings import Finding
from graphmode.transforms.pipeline import FileAdaptation, adapt_files, fixed_by


def adapt_sources(state: RunState, selected: set[str] | None) -> dict[str, FileAdaptation]:
    """Every file of the target through the codemods (`selected`: only these; None: all but those a bisection
    dropped), with the parameters of the session (a person's revisions over what analyze found) and the options
    the traced run's evidence gives them, with what later rounds' adapted runs added to it."""
    values = parameter_values(state)
    options = Options(max_seq_len=values["max_seq_len"], entry_class=values["entry_class"],
                      max_batch_size=values["max_batch_size"], fused_ops=values["fused_ops"])
    if state.evidence is not None:
        options = evidence_options(options, state.evidence)
    seen = state.repair_evidence.get("host_sync_lines", [])
    if seen:  # the adapted run read the host where the original's trace never went (agent.workflow.repair)
        options = replace(options, traced=True, host_sync_lines=tuple(sorted(
            {*options.host_sync_lines, *((file, line) for file, line in seen)})))
    every = frozenset(CODEMODS) - {d["codemod"] for d in state.dropped}
    planned = {c.codemod for c in state.plan}
    # Every planned change approved is the design's own selection: planned.diff is that adaptation, so the chain
    # is not run again for it.
    chosen = every if selected is None or (planned and planned <= selected <= every) else frozenset(selected)
    target = Path(state.options.target)
    texts = tuple((rel, read_source(target, rel)) for rel in state.sources)
    entry_file = _entry_file(state, values["entry_class"], {rel for rel, _ in texts})
    key = (chosen, options, texts, entry_file)
    if key not in _ADAPTED:
        if len(_ADAPTED) >= _KEPT:
            _ADAPTED.pop(next(iter(_ADAPTED)))
        _ADAPTED[key] = adapt_files(texts, chosen, lambda rel: options if entry_file in (None, rel)
                                    else replace(options, entry_class=None))
    return _ADAPTED[key]


def _entry_file(state: RunState, entry_class: str | None, sources: set[str]) -> str | None:
    """The source file the harness's model class comes from (the probe's record), where it is one of the sources and
    nobody revised the class: only that file's class of that name gets the entry points. A Hub folder may define a
    class of the same name in two files (Hunyuan-A13B's hunyuan.py, which auto_map names, and modeling_hunyuan.py):
    entries on the copy the harness never builds left the one it builds without them. None: every file, as before."""
    baseline = state.baseline
    if baseline is None or entry_class != baseline.entry_class or baseline.entry_file not in sources:
        return None
    return baseline.entry_file


# The chain's results in this process, by selection, options and source texts: design, implement and a
# bisection's trials ask for the same selection more than once in a session. Kept few: a result holds the
# file's texts several times.
_ADAPTED: dict[tuple, dict[str, FileAdaptation]] = {}
_KEPT = 8


def parameter_values(state: RunState) -> dict:
    """The parameters the codemods are built with (agent.workflow.revisions): a person's revision, else what analyze
    found. With batch buckets the static buffers hold the largest one."""
    found = {"max_seq_len": state.max_seq_len, "entry_class": state.entry_class,
             "max_batch_size": max(state.options.batch_buckets, default=Options.max_batch_size),
             "fused_ops": fused_ops_for(state.options.backend)}
    return {**found, **state.revisions}


def static_length(state: RunState) -> int | None:
    """The positions verification sets the adapted static path up for (`setup_caches`): a person's revision of
    max_seq_len; None leaves it to the harness's MAX_SEQ_LEN, which analyze found."""
    return state.revisions.get("max_seq_len")


def fused_ops_for(backend: str) -> str:
    """The fused operators the fusions write for `backend` (its class says): torch_npu's under the NPU backends."""
    from graphmode.runners.backends import BACKEND_NAMES, get  # the registry imports no torch

    return get(backend).fused_ops if backend in BACKEND_NAMES and backend != "auto" else Options.fused_ops


def evidence_options(options: Options, evidence: Evidence) -> Options:
    """`options` with what the traced run saw: how the harness called forward, and the lines of the sources that
    grew a cache, read the host, made or tested the positions, or took a growing tensor in."""
    calls = evidence.entry_calls
    return replace(options, entry_roles=entry_roles(calls), recomputes_sequence=bool(evidence.recomputes_sequence),
                   prefill_resets=tuple(calls.get("prefill_resets", [])), traced=True,
                   evidence_caches=evidence_caches(evidence), evidence_cache_writes=evidence_cache_writes(evidence),
                   changing_int_params=changing_int_params(evidence), host_sync_lines=host_sync_lines(evidence),
                   position_lines=position_lines(evidence), cache_reads=cache_reads(evidence),
                   position_tests=position_tests(evidence))


def entry_roles(calls: dict) -> tuple[tuple[str, str], ...]:
    """(parameter, role) for the codemods, from how the harness called the entry class's forward
    (runners.evidence.entry_calls): a parameter Decode never gets is "omitted"; positions carry their layout."""
    if not calls or calls.get("entry_class") is None:
        return ()
    roles = []
    for use in calls.get("parameters", []):
        role = use["role"] if use["in_decode"] else "omitted"
        if (role == "positions" and use.get("layout") != "1d") or role == "mask_rows":
            role = f"{role}:{use.get('layout')}"
        roles.append((use["name"], role))
    return tuple(roles)


# The codemods' options hold plain (file, line, ...) tuples: SourceLine's fields, unpacked.

def evidence_caches(evidence: Evidence) -> tuple[tuple[str, int, int], ...]:
    """(file, statement line, growing dim) of every KV cache the traced run saw grown by a `torch.cat` written
    in the sources themselves (not inside a library call)."""
    return tuple(sorted({(statement.file, statement.line, growth.dims[0])
                         for statement, entry in evidence.by_statement() for growth in entry.growing
                         if growth.kind == "cache" and not growth.via and growth.dims}))


def evidence_cache_writes(evidence: Evidence) -> tuple[tuple[str, int, tuple[int, ...], tuple], ...]:
    """(file, statement line, growing dim of each tensor, each tensor's shape per layer) of every statement the
    traced run saw grow a KV cache through a library call (a cache object's `update`), the tensors in the order
    the library grew them."""
    found = []
    for statement, entry in evidence.by_statement():
        grown = [g for g in entry.growing if g.kind == "cache" and g.via and g.dims]
        if grown:
            found.append((statement.file, statement.line, tuple(g.dims[0] for g in grown), _shapes_per_layer(grown)))
    return tuple(sorted(found))


def _shapes_per_layer(grown) -> tuple:
    """Each grown tensor's shapes, one per call (per layer), as tuples."""
    return tuple(tuple(tuple(shape) for shape in g.call_shapes or []) for g in grown)


def host_sync_lines(evidence: Evidence) -> tuple[tuple[str, int], ...]:
    """(file, statement line) of every statement the traced run saw read the device on the host in Decode."""
    return tuple(sorted({(statement.file, statement.line) for statement, entry in evidence.by_statement()
                         if any(sync.decode for sync in entry.syncs)}))


def position_lines(evidence: Evidence) -> tuple[tuple[str, int], ...]:
    """(file, statement line) of every statement the traced run saw make the positions of the tokens computed."""
    return tuple(sorted({(statement.file, statement.line) for statement, entry in evidence.by_statement()
                         if entry.positions}))


def position_tests(evidence: Evidence) -> tuple[tuple[str, int, str], ...]:
    """(file, statement line, "gt" | "ge") of every branch test the traced run saw compare how far the positions
    reach with a Python int."""
    return tuple(sorted({(statement.file, statement.line, test.op) for statement, entry in evidence.by_statement()
                         for test in entry.position_tests}))


def cache_reads(evidence: Evidence) -> tuple[tuple[str, int, str, str], ...]:
    """(file, statement line, op, "scores" | "reads") of every op the traced run saw take a growing tensor in: the
    ones whose output grows with it (derived growth: scores of the keys) and the ones whose output does not."""
    found = set()
    for statement, entry in evidence.by_statement():
        found |= {(statement.file, statement.line, growth.op, "scores") for growth in entry.growing
                  if growth.kind == "derived" and not growth.via}
        found |= {(statement.file, statement.line, op, "reads") for op in entry.reads_growing}
    return tuple(sorted(found))


def changing_int_params(evidence: Evidence) -> tuple[tuple[str, str, str], ...]:
    """(file, function qualname, parameter) of the int parameters the traced run saw change every Decode step."""
    return tuple(sorted((where.file, function.name, param)
                        for where, function in evidence.functions.items() for param in function.params))


def plan_changes(adaptations: dict[str, FileAdaptation], findings: list[Finding]) -> list[Change]:
    """One change per codemod that edits some file, in chain order, with the changes it needs and the findings
    it fixes."""
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


def fusion_numbers(codemod: str, full_config: dict | None) -> str:
    """A fusion's effect on one layer's Decode step by the memory-traffic model (runners/measure/traffic.py), in a
    sentence for the design: the ops it takes away, and at a full config's sizes the intermediate bytes; "" for a change
    that is no fusion."""
    from graphmode.runners.measure.traffic import fusion_effect, read_config  # stdlib only, no torch

    if not CODEMODS[codemod].FUSION:
        return ""
    sizes = read_config(full_config) if full_config is not None else None
    effect = fusion_effect(codemod, sizes)
    if effect is None:
        return ("Estimated effect: not held by the memory-traffic model; the report counts the ops of the captured "
                "Decode graph with and without it.")
    text = f"Estimated effect per layer per Decode step (memory-traffic model): {effect['ops']} fewer ops"
    if sizes is None:
        return text + ("; the bytes need the model's sizes (no config.json in the target): the report estimates them "
                       "at the sizes run.")
    return (text + f"; at the full config's sizes (hidden {sizes.hidden}, {sizes.layers} layers, batch 1, "
            f"{effect['kv_len']} cached positions) {effect['intermediates'] / 1024:.1f} KiB fewer intermediate bytes "
            f"of {effect['total'] / 1024 ** 2:.1f} MiB the layer moves, weights included.")


def _first_fixer(finding: Finding, adaptations: dict[str, FileAdaptation]) -> str | None:
    adaptation = adaptations.get(finding.path)
    if adaptation is None:
        return None
    # Seen failing in an earlier round's adapted run: the change that rewrites the line is its repair.
    if finding.source == "adapted":
        return next((e.codemod for e in sorted(adaptation.edits, key=lambda e: list(CODEMODS).index(e.codemod))
                     if e.start_line <= finding.line <= e.end_line), None)
    return fixed_by(finding, adaptation.edits)
