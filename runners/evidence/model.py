"""The runtime evidence as data: what the traced run of the UNMODIFIED model saw, line by line, and its JSON.

Standard library only, no torch: the agent reads the evidence a run saved (RunState.evidence) and the findings are
made from it without the seconds torch takes to import. The tracer (runners.evidence.tracer) records, the analysis
(runners.evidence.analysis) builds these records from what it recorded, runners.evidence.findings turns them into
findings.

Lines are keyed by `SourceLine(file, line)`; the JSON keeps the "model.py:97" strings it always had.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

PREFILL, DECODE = "prefill", "decode"

# Ops that read part of an existing tensor: a growing result means a moving Python bound (a Growth of kind "slice").
SLICE_OPS = frozenset({"getitem", "narrow", "slice", "select", "index_select", "split", "chunk", "unbind"})


class SourceLine(NamedTuple):
    """A line of one of the target's source files, as the evidence keys it; written "model.py:97" in the JSON.

    A NamedTuple, not a dataclass: it sorts by file then line, unpacks as `file, line = where`, and
    dataclasses.asdict keeps it whole as a dict key (it would turn a dataclass key into an unhashable dict)."""
    file: str  # relative to the target folder, as the harness's SOURCES name it
    line: int

    @classmethod
    def parse(cls, text: str) -> SourceLine:
        """SourceLine("model.py", 97) from "model.py:97"; the last colon splits, so a path may hold colons."""
        file, _, line = text.rpartition(":")
        return cls(file, int(line))

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Growth:
    """An op whose output grows by the same amount every Decode step."""
    op: str  # "cat", "arange", "getitem", "expand", ...
    # cache: a carried cat (one input is this line's own output of the step before)
    # input: the growth enters from outside the sources (e.g. the whole token sequence every step)
    # slice: part of a fixed tensor, bounded by a Python int that moves
    # created: a new tensor sized by Python ints that grow (arange, full, expand of a fixed tensor)
    # derived: a consequence of a growing input (matmul with the cache, softmax, ...)
    kind: str
    dims: list[int]
    by: int  # per Decode step, along each of dims
    shapes: list[list[int]]  # output shape at each Decode step (the line's first growing call)
    dtype: str = ""
    prefill_shape: list[int] | None = None
    calls: int = 1  # calls of this op at this line per Decode step (e.g. one per layer)
    via: str | None = None  # the library line that made the op, when it is not the line itself
    carried: bool = False
    piece: int | None = None  # size of the new piece along dims[0], for a carried cat
    layout: str | None = None  # "[b, h, s, d]" ... for a carried cache
    kv_dim: int | None = None  # k and v stacked along this dim of one tensor
    # For a carried cache: its shape after the last Decode step in each call at this line, in call order (one call
    # per layer where the line runs once per layer). Caches are sized from these, not from the first call's alone:
    # layers, and the tensors a line writes (MLA's keys and values), may differ.
    call_shapes: list[list[int]] | None = None


@dataclass
class ScalarChange:
    """A Python int an op received that changed every Decode step."""
    op: str
    arg: str  # "arg0", "index[1].stop", "dim", ... (for a function: the parameter name)
    values: list[int]  # at each Decode step
    delta: int | None = None  # the same change every step, else None (which `_compact` leaves out of the JSON)
    via: str | None = None


@dataclass
class HostSync:
    kind: str  # item, tolist, int, float, bool, branch, cpu, numpy, format, data-dependent
    op: str
    prefill: int = 0  # calls in Prefill
    decode: int = 0  # calls over all Decode steps
    via: str | None = None


@dataclass
class PositionTest:
    """A comparison that tested how far the positions reach against a Python int at every Decode step: `tensor OP
    bound`, the tensor holding the step's last position plus `offset` (1: the count of positions so far)."""
    op: str  # "gt" | "ge": the tensor on the left
    offset: int  # 0 or 1
    bound: int


@dataclass
class LineEvidence:
    function: str
    text: str
    phases: list[str]
    statement: int | None = None  # first line of the statement, when this line is inside it
    growing: list[Growth] = field(default_factory=list)
    scalars: list[ScalarChange] = field(default_factory=list)
    syncs: list[HostSync] = field(default_factory=list)
    # The line makes the positions of the tokens computed (past, past + 1, ... at every Decode step) out of
    # something else (a mask's cumsum, lengths): where a model has no position input, this is where one goes.
    positions: bool = False
    # Ops at this line that read a tensor growing every Decode step and give back one that does not: attention
    # reading the cache along its growing dim in one op (`scaled_dot_product_attention`), or weights times values.
    reads_growing: list[str] = field(default_factory=list)
    # Comparisons of the positions with a Python int that a branch here tested (dynamic NTK rotary's
    # `if max(position_ids) + 1 > self.max_position_embeddings`): the size of a static cache settles them.
    position_tests: list[PositionTest] = field(default_factory=list)


@dataclass
class FunctionEvidence:
    """A function of the sources that ran; `params` are its int parameters that changed every Decode step."""
    name: str
    phases: list[str]
    params: dict[str, ScalarChange] = field(default_factory=dict)


@dataclass
class Evidence:
    folder: str
    sources: list[str]
    steps: int  # Decode steps traced
    prompt_shape: list[int]
    new_tokens: int  # tokens per Decode step
    lines: dict[SourceLine, LineEvidence] = field(default_factory=dict)  # what happened at each line
    functions: dict[SourceLine, FunctionEvidence] = field(default_factory=dict)  # keyed by the def line
    coverage: dict[str, dict[str, str]] = field(default_factory=dict)  # file -> phase -> "3-9,12"
    recomputes_sequence: SourceLine | None = None  # where a growing token sequence enters: no cache
    logits_equal: bool = True  # the traced run's logits equal an untraced run's, bit for bit
    max_abs_diff: float = 0.0
    untraced_s: float = 0.0  # Prefill + Decode steps without the trace, in the worker
    traced_s: float = 0.0
    worker_s: float = 0.0  # the whole worker process, from spawn to exit
    unattributed_ops: int = 0
    trace_errors: list[str] = field(default_factory=list)
    # How the harness called the model's forward (runners.evidence.entry_calls.EntryCalls as a dict); {} when the
    # harness's model is not an nn.Module.
    entry_calls: dict[str, Any] = field(default_factory=dict)
    # Calls the model's code made to `torch.npu` that graphmode's CPU stand-in answered (runners/npu_standin.py):
    # [call, "file:line"] each, the file relative to the folder (calls from library code are left out).
    npu_stand_ins: list[list[str]] = field(default_factory=list)

    # -- JSON ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lines"] = {str(k): _compact(v) for k, v in data["lines"].items()}
        data["functions"] = {str(k): _compact(v) for k, v in data["functions"].items()}
        if self.recomputes_sequence is not None:
            data["recomputes_sequence"] = str(self.recomputes_sequence)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evidence:
        """The evidence `to_dict` wrote; keys it does not know (the agent's "summary") are left out."""
        data = dict(data)
        data["lines"] = {SourceLine.parse(k): _line_from_dict(v) for k, v in data.get("lines", {}).items()}
        data["functions"] = {
            SourceLine.parse(k): FunctionEvidence(v["name"], v.get("phases", []),
                                                  {p: _build(ScalarChange, s) for p, s in v.get("params", {}).items()})
            for k, v in data.get("functions", {}).items()}
        if data.get("recomputes_sequence"):
            data["recomputes_sequence"] = SourceLine.parse(data["recomputes_sequence"])
        return _build(cls, data)

    # -- questions -----------------------------------------------------------------------------------
    def ran(self, path: str, line: int) -> set[str]:
        """The phases that ran `path:line` ({"prefill", "decode"}, either, or none)."""
        phases = self.coverage.get(path, {})
        ran = {phase for phase, text in phases.items() if line in lines_in_ranges(text)}
        # A statement over several lines may have no line event of its own first line.
        return ran.union(*(entry.phases for _, entry in self.at(path, line)))

    def at(self, path: str, line: int) -> list[tuple[int, LineEvidence]]:
        """(line, what the trace recorded there) at `line` and inside the statement that starts at it."""
        return [(where.line, entry) for where, entry in self.lines.items()
                if where.file == path and (where.line == line or entry.statement == line)]

    def by_statement(self) -> Iterator[tuple[SourceLine, LineEvidence]]:
        """What the trace recorded at each line, keyed by the first line of the statement holding it: the line a
        codemod finds a statement by."""
        for where, entry in self.lines.items():
            yield SourceLine(where.file, entry.statement or where.line), entry

    def origins(self) -> Iterator[tuple[SourceLine, LineEvidence, Growth]]:
        """Growing tensors that are causes, not consequences (every kind but `derived`)."""
        for where, entry in self.lines.items():
            for growth in entry.growing:
                if growth.kind != "derived":
                    yield where, entry, growth

    def summary(self) -> str:
        """A few lines for a person: what grows, which ints move, where the host is read."""
        lines = [f"traced Prefill (prompt {shape_text(self.prompt_shape)}) + {self.steps} Decode step(s) of "
                 f"{Path(self.folder).name}: {self.traced_s:.2f} s traced, {self.untraced_s:.2f} s untraced; "
                 + ("logits identical" if self.logits_equal else f"LOGITS DIFFER (max {self.max_abs_diff:.3g})")]
        if self.recomputes_sequence:
            lines.append(f"no KV cache: the token sequence grows and is recomputed every step "
                         f"(enters at {self.recomputes_sequence})")
        growing = self._growth_lines()
        ints, syncs = self._moving_ints(), self._decode_syncs()
        lines += growing
        if ints:
            lines.append("Python ints changing every Decode step: " + "; ".join(ints))
        if syncs:
            lines.append("host syncs in Decode: " + "; ".join(syncs))
        grows = any(True for _ in self.origins())
        return "\n".join(lines + self._closing_line(grows or bool(ints or syncs or self.recomputes_sequence)))

    def _closing_line(self, anything_seen: bool) -> list[str]:
        """That nothing was seen, or how many ops grow only because an input grows."""
        if not anything_seen:
            return ["nothing grows, no Python int changes and nothing reads the host in Decode"]
        derived = sum(1 for e in self.lines.values() for g in e.growing if g.kind == "derived")
        return [f"({derived} op(s) grow only because an input grows)"] if derived else []

    def _growth_lines(self) -> list[str]:
        """One line per kind of growth seen (the cache, moving slices, tensors built per step, inputs)."""
        groups: dict[str, list[str]] = defaultdict(list)
        for where, _entry, g in self.origins():
            label = f"{where} {g.op} dim {','.join(map(str, g.dims))} +{g.by}"
            groups[g.kind].append(f"{label} {g.layout}" if g.layout else label)
        titles = {"cache": "KV cache grown by cat", "slice": "slices with a moving bound",
                  "created": "tensors built per step with a growing size", "input": "growing inputs"}
        return [f"{title}: " + "; ".join(groups[kind]) for kind, title in titles.items() if groups[kind]]

    def _moving_ints(self) -> list[str]:
        """The Python ints (op arguments and function parameters) that change every Decode step."""
        ints = [f"{where} {op} {', '.join(s.arg for s in group)} {_deltas(group)}"
                for where, e in self.lines.items() for (op, _), group in grouped_by_op(e.scalars)]
        return ints + [f"{f.name}({', '.join(f.params)}) {_deltas(list(f.params.values()))}"
                       for f in self.functions.values() if f.params]

    def _decode_syncs(self) -> list[str]:
        return [f"{where} {s.kind} x{s.decode // max(self.steps, 1)}/step" for where, e in self.lines.items()
                for s in e.syncs if s.decode]


# -- text for people (the summary here, the findings' messages in runners.evidence.findings) ---------------

def shape_text(values: list[int] | tuple[int, ...] | None) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]" if values is not None else "-"


def delta_text(delta: int | None) -> str:
    return "irregular" if delta is None else f"{delta:+d}/step"


def _deltas(changes: list[ScalarChange]) -> str:
    return delta_text(changes[0].delta) if len({c.delta for c in changes}) == 1 else "mixed"


def grouped_by_op(scalars: Iterable[ScalarChange]) -> list[tuple[tuple[str, str | None], list[ScalarChange]]]:
    """The changing ints by the op that received them, (op, via): one sentence per op, naming each of its ints."""
    groups: dict[tuple[str, str | None], list[ScalarChange]] = defaultdict(list)
    for s in scalars:
        groups[(s.op, s.via)].append(s)
    return list(groups.items())


# -- coverage as text: sorted line numbers as "3-5,9", short and readable in the JSON ----------------------

def line_ranges(lines: set[int] | list[int]) -> str:
    """Sorted line numbers as '3-5,9'."""
    out: list[str] = []
    ordered = sorted(lines)
    start = prev = None
    for n in ordered + [None]:
        if start is not None and (n is None or n != prev + 1):
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if n is not None:
            start = n if start is None else start
            prev = n
    return ",".join(out)


def lines_in_ranges(text: str) -> set[int]:
    """'3-5,9' -> {3, 4, 5, 9}: what `line_ranges` wrote."""
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        found.update(range(int(a), int(b or a) + 1))
    return found


# -- (de)serialisation of the nested records ------------------------------------------------------------------

def _compact(value: Any) -> Any:
    """Drops empty, None and False entries of nested records: the JSON stays short to read."""
    if isinstance(value, dict):  # `is`, not `in`: 0 == False, and a kv_dim of 0 must stay
        return {k: _compact(v) for k, v in value.items() if not (v is None or v is False or v == [] or v == {})}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def _build(cls: type, data: dict[str, Any]) -> Any:
    """`cls` from the fields of `data` it has: `_compact` left the empty ones out, so their defaults come back."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _line_from_dict(data: dict[str, Any]) -> LineEvidence:
    return LineEvidence(
        function=data.get("function", ""), text=data.get("text", ""), phases=data.get("phases", []),
        statement=data.get("statement"),
        growing=[_build(Growth, g) for g in data.get("growing", [])],
        scalars=[_build(ScalarChange, s) for s in data.get("scalars", [])],
        syncs=[_build(HostSync, s) for s in data.get("syncs", [])], positions=bool(data.get("positions")),
        reads_growing=list(data.get("reads_growing", [])),
        position_tests=[_build(PositionTest, t) for t in data.get("position_tests", [])])
