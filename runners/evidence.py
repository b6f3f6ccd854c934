"""Runtime evidence: what the UNMODIFIED model's Prefill and Decode steps really do, line by line.

Static rules and codemods recognise caches and positions by names and code shapes; this module
records instead what happens when the harness runs, with no Dynamo involved:

- a `TorchFunctionMode` sees every torch function and Tensor method the user's code calls (`cat`,
  `arange`, `Tensor.__getitem__`, `.item()`, `Tensor.__bool__`, ...) with its arguments and result;
- a `TorchDispatchMode` sees the host syncs that happen below that level (`aten._local_scalar_dense`,
  `aten.nonzero`, boolean-mask indexing) in code that called no syncing function itself;
- `sys.settrace`, on the target's own files only, records which lines each phase ran and the Python
  int arguments every call of the target's functions received.

Each op is attributed to the innermost frame whose file is one of the harness's SOURCES (the line a
codemod can change); ops from library code that line called keep the library line as `via`. Ops with
no SOURCES frame (the harness itself, graphmode) are ignored. Comparing the Decode steps then gives:
tensors whose shape grows every step (and whether the line's own output of the step before is one of
the inputs: a carried KV cache), Python ints that change every step, and host syncs.

`collect_evidence` runs all this in a fresh process (runners/evidence_worker.py); `evidence_findings`
turns evidence into findings and `reconcile` checks static findings against it. Both are pure.
"""
from __future__ import annotations

import ast
import json
import linecache
import os
import re
import sys
import sysconfig
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from graphmode.runners.subprocess_run import WorkerError, run_worker

PREFILL, DECODE = "prefill", "decode"

# -- what the ops mean -------------------------------------------------------------------------------

# Metadata queries: no tensor data is read and no tensor is made; not worth a record.
_METADATA = frozenset({
    "__get__", "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset", "is_contiguous",
    "element_size", "data_ptr", "__len__", "is_floating_point", "is_complex", "get_device", "__hash__",
    "has_names",
})
# Function-level host syncs: the Python value a call returns needs the tensor's data on the host.
_SYNC_BY_NAME = {
    "item": "item", "tolist": "tolist", "equal": "item", "allclose": "item", "is_nonzero": "item",
    "__int__": "int", "__index__": "int", "__float__": "float", "__complex__": "float", "__bool__": "bool",
    "cpu": "cpu", "numpy": "numpy", "__array__": "numpy",
    "__format__": "format", "__repr__": "format", "__str__": "format",
}
# Aten ops that read tensor data on the host when no function above did (dispatch level).
_DISPATCH_SYNCS = {
    "_local_scalar_dense": "item", "item": "item", "is_nonzero": "item", "equal": "item",
    "nonzero": "data-dependent", "masked_select": "data-dependent", "_unique2": "data-dependent",
    "unique_dim": "data-dependent", "unique_consecutive": "data-dependent",
}
SYNC_CODES = {"item": "GM101", "tolist": "GM101", "data-dependent": "GM101", "int": "GM102", "float": "GM102",
              "bool": "GM102", "cpu": "GM103", "numpy": "GM103", "format": "GM104", "branch": "GM402"}
_SYNC_WORDS = {"item": "`.item()`", "tolist": "`.tolist()`", "int": "`int()` of a tensor",
               "float": "`float()` of a tensor", "bool": "`bool()` of a tensor", "cpu": "a copy to the host",
               "numpy": "`.numpy()`", "format": "formatting a tensor as text",
               "data-dependent": "an op whose output size depends on tensor values",
               "branch": "a Python branch on a tensor value (`Tensor.__bool__`)"}
# Ops that read part of an existing tensor: a growing result means a moving Python bound.
SLICE_OPS = frozenset({"getitem", "narrow", "slice", "select", "index_select", "split", "chunk", "unbind"})
# Comparisons with the tensor on the left that a branch taken once the positions pass a bound tests.
_BOUND_TESTS = frozenset({"gt", "ge"})
CAT_OPS = frozenset({"cat", "concat", "concatenate", "hstack", "vstack", "dstack", "column_stack", "stack"})
_MAX_INTS = 64  # ints kept per call: a torch.tensor(list) of a thousand ints is data, not positions
_INTEGER_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def _op_label(name: str) -> str:
    return name.strip("_") if name.startswith("__") else name


def _shape(values: list[int] | tuple[int, ...] | None) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]" if values is not None else "-"


def _ranges(lines: set[int] | list[int]) -> str:
    """Sorted line numbers as '3-5,9' (readable in JSON)."""
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


def _unranges(text: str) -> set[int]:
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        found.update(range(int(a), int(b or a) + 1))
    return found


# -- the evidence --------------------------------------------------------------------------------------

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
    delta: int | None  # the same change every step, else None
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
    lines: dict[str, LineEvidence] = field(default_factory=dict)  # "model.py:97" -> what happened there
    functions: dict[str, FunctionEvidence] = field(default_factory=dict)  # "model.py:85" (def line)
    coverage: dict[str, dict[str, str]] = field(default_factory=dict)  # file -> phase -> "3-9,12"
    recomputes_sequence: str | None = None  # "file:line" where a growing token sequence enters: no cache
    logits_equal: bool = True  # the traced run's logits equal an untraced run's, bit for bit
    max_abs_diff: float = 0.0
    untraced_s: float = 0.0  # Prefill + Decode steps without the trace, in the worker
    traced_s: float = 0.0
    worker_s: float = 0.0  # the whole worker process, from spawn to exit
    unattributed_ops: int = 0
    trace_errors: list[str] = field(default_factory=list)
    # How the harness called the model's forward (runners.entry_calls.EntryCalls as a dict); {} when the
    # harness's model is not an nn.Module.
    entry_calls: dict[str, Any] = field(default_factory=dict)

    # -- JSON ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lines"] = {k: _compact(v) for k, v in data["lines"].items()}
        data["functions"] = {k: _compact(v) for k, v in data["functions"].items()}
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Evidence":
        data = dict(data)
        data["lines"] = {k: _line_from_dict(v) for k, v in data.get("lines", {}).items()}
        data["functions"] = {
            k: FunctionEvidence(v["name"], v.get("phases", []),
                                {p: _build(ScalarChange, s) for p, s in v.get("params", {}).items()})
            for k, v in data.get("functions", {}).items()}
        return _build(cls, data)

    # -- questions -----------------------------------------------------------------------------------
    def ran(self, path: str, line: int) -> set[str]:
        """The phases that ran `path:line` ({"prefill", "decode"}, either, or none)."""
        phases = self.coverage.get(path, {})
        ran = {phase for phase, text in phases.items() if line in _unranges(text)}
        # A statement over several lines may have no line event of its own first line.
        return ran.union(*(entry.phases for _, entry in self.at(path, line)))

    def at(self, path: str, line: int) -> list[tuple[int, LineEvidence]]:
        """(line, what the trace recorded there) at `line` and inside the statement that starts at it."""
        found = []
        for key, entry in self.lines.items():
            file, _, number = key.rpartition(":")
            if file == path and (int(number) == line or entry.statement == line):
                found.append((int(number), entry))
        return found

    def function_at(self, path: str, line: int) -> FunctionEvidence | None:
        return self.functions.get(f"{path}:{line}")

    def origins(self) -> Iterator[tuple[str, LineEvidence, Growth]]:
        """Growing tensors that are causes, not consequences (every kind but `derived`)."""
        for key, entry in self.lines.items():
            for growth in entry.growing:
                if growth.kind != "derived":
                    yield key, entry, growth

    def summary(self) -> str:
        """A few lines for a person: what grows, which ints move, where the host is read."""
        lines = [f"traced Prefill (prompt {_shape(self.prompt_shape)}) + {self.steps} Decode step(s) of "
                 f"{Path(self.folder).name}: {self.traced_s:.2f} s traced, {self.untraced_s:.2f} s untraced; "
                 + ("logits identical" if self.logits_equal else f"LOGITS DIFFER (max {self.max_abs_diff:.3g})")]
        if self.recomputes_sequence:
            lines.append(f"no KV cache: the token sequence grows and is recomputed every step "
                         f"(enters at {self.recomputes_sequence})")
        groups: dict[str, list[str]] = defaultdict(list)
        for key, _entry, g in self.origins():
            label = f"{key} {g.op} dim {','.join(map(str, g.dims))} +{g.by}"
            if g.layout:
                label += f" {g.layout}"
            groups[g.kind].append(label)
        titles = {"cache": "KV cache grown by cat", "slice": "slices with a moving bound",
                  "created": "tensors built per step with a growing size", "input": "growing inputs"}
        for kind, title in titles.items():
            if groups[kind]:
                lines.append(f"{title}: " + "; ".join(groups[kind]))
        derived = sum(1 for e in self.lines.values() for g in e.growing if g.kind == "derived")
        ints = [f"{key} {op} {', '.join(s.arg for s in group)} {_deltas(group)}"
                for key, e in self.lines.items() for (op, _), group in _grouped(iter(e.scalars))]
        ints += [f"{f.name}({', '.join(f.params)}) {_deltas(list(f.params.values()))}"
                 for f in self.functions.values() if f.params]
        if ints:
            lines.append("Python ints changing every Decode step: " + "; ".join(ints))
        syncs = [f"{key} {s.kind} x{s.decode // max(self.steps, 1)}/step" for key, e in self.lines.items()
                 for s in e.syncs if s.decode]
        if syncs:
            lines.append("host syncs in Decode: " + "; ".join(syncs))
        if not (any(groups.values()) or ints or syncs or self.recomputes_sequence):
            lines.append("nothing grows, no Python int changes and nothing reads the host in Decode")
        elif derived:
            lines.append(f"({derived} op(s) grow only because an input grows)")
        return "\n".join(lines)


def _delta(delta: int | None) -> str:
    return "irregular" if delta is None else f"{delta:+d}/step"


def _deltas(changes: list["ScalarChange"]) -> str:
    return _delta(changes[0].delta) if len({c.delta for c in changes}) == 1 else "mixed"


def _compact(value: Any) -> Any:
    """Drops empty, None and False entries of nested records: the JSON stays short to read."""
    if isinstance(value, dict):  # `is`, not `in`: 0 == False, and a kv_dim of 0 must stay
        return {k: _compact(v) for k, v in value.items() if not (v is None or v is False or v == [] or v == {})}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def _build(cls: type, data: dict[str, Any]) -> Any:
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


# -- the trace -----------------------------------------------------------------------------------------

_SKIP, _OTHER = 0, 1  # frame kinds besides a source file's relative path
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_OWN_FILES = {os.path.realpath(__file__), os.path.realpath(__file__).replace("evidence.py", "evidence_worker.py")}
_LIB_DIRS = tuple({os.path.realpath(p) + os.sep for key in ("purelib", "platlib")
                   if (p := sysconfig.get_paths().get(key))})
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep

Producer = tuple[int, int, int]  # (site id, step, index of the call in that site's calls)


@dataclass(slots=True)  # one per op call: slots make the many small records cheaper
class _Call:
    step: int
    index: int  # position in its site's calls: how a Producer names it
    seq: int  # order of the call in the whole run
    out: tuple[int, ...] | None
    dtype: str
    inputs: tuple[tuple[Producer | None, tuple[int, ...], bool], ...]  # (producer, shape, integer dtype)
    ints: tuple[tuple[str, int], ...]
    values: tuple[int, ...] | None = None  # a small integer output's values (positions are such tensors)


@dataclass
class _Site:
    id: int
    file: str
    line: int
    function: str
    op: str
    via: str | None
    calls: list[_Call] = field(default_factory=list)


@dataclass(slots=True)
class _Pending:
    site: _Site
    inputs: tuple[tuple[Producer | None, tuple[int, ...], bool], ...]
    ints: tuple[tuple[str, int], ...]
    first: Any  # the first tensor argument: an in-place op returns it and it keeps its producer


def _qualname(code: Any) -> str:
    return getattr(code, "co_qualname", code.co_name).replace(".<locals>", "")


def _ints(op: str, args: tuple, kwargs: dict) -> tuple[tuple[str, int], ...]:
    """Every Python int among the arguments, with where it sits ("arg0", "index[1].stop", "dim")."""
    found: list[tuple[str, int]] = []

    def walk(value: Any, path: str, depth: int) -> None:
        if len(found) >= _MAX_INTS:
            return
        kind = type(value)
        if kind is int:  # bool is not int here: `type(True) is bool`
            found.append((path, value))
        elif kind is slice:
            walk(value.start, path + ".start", depth)
            walk(value.stop, path + ".stop", depth)
            walk(value.step, path + ".step", depth)
        elif depth < 3 and (kind is tuple or kind is list or kind is torch.Size):
            for j, item in enumerate(value):
                walk(item, f"{path}[{j}]", depth + 1)

    names = {1: "index", 2: "value"} if op in ("getitem", "setitem") else {}
    for i, value in enumerate(args):
        walk(value, names.get(i, f"arg{i}"), 0)
    for name, value in kwargs.items():
        walk(value, name, 0)
    return tuple(found)


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensor arguments, including those inside a list or tuple argument (`torch.cat([a, b])`)."""
    out: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif type(value) in (list, tuple):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def _to_host(args: tuple, kwargs: dict) -> bool:
    """`t.to("cpu")` / `t.to(device="cpu")`: a copy to the host on the target device even when this trace
    runs on the CPU (as `.cpu()` is). A torch.device counts only when the tensor is elsewhere:
    `t.to(h.device)` is the CPU here only because the trace runs there."""
    tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
    for target in (*args[1:2], kwargs.get("device")):
        if isinstance(target, str) and target == "cpu":
            return True
        if isinstance(target, torch.device) and target.type == "cpu" and tensor is not None:
            return tensor.device.type != "cpu"
    return False


class _FunctionMode(TorchFunctionMode):
    def __init__(self, tracer: "EvidenceTracer") -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _METADATA:
            return func(*args, **kwargs)
        tracer = self.tracer
        pending, sync = None, False
        try:
            pending, sync = tracer.before(name, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - the trace must never change what the model does
            tracer.failed(exc)
        if sync:
            tracer.in_sync += 1  # the dispatch mode must not count this sync a second time
            try:
                out = func(*args, **kwargs)
            finally:
                tracer.in_sync -= 1
        else:
            out = func(*args, **kwargs)
        if pending is not None:
            try:
                tracer.after(pending, out)
            except Exception as exc:  # noqa: BLE001
                tracer.failed(exc)
        return out


class _DispatchMode(TorchDispatchMode):
    """Host syncs below the function level: `.item()` inside library code that disabled torch functions,
    boolean-mask indexing, `nonzero` inside another op."""

    def __init__(self, tracer: "EvidenceTracer") -> None:
        super().__init__()
        self.tracer = tracer

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # By default torch wraps __torch_dispatch__ in torch._disable_dynamo, whose first call imports
        # torch._dynamo (4-8 s of imports, sympy included) for nothing: this trace never compiles.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tracer = self.tracer
        if not tracer.in_sync:
            try:
                name = func.overloadpacket.__name__
                kind = _DISPATCH_SYNCS.get(name)
                if kind is None and name == "index" and len(args) > 1:
                    indices = args[1] or ()
                    if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                        kind = "data-dependent"
                if kind is not None:
                    tracer.sync_at_dispatch(kind, name)
            except Exception as exc:  # noqa: BLE001
                tracer.failed(exc)
        return func(*args, **(kwargs or {}))


class EvidenceTracer:
    """Records ops, syncs, lines and int parameters while the harness runs; `evidence()` analyses them.

    Use: `with tracer.phase(PREFILL, 0): harness.prefill(...)`, then `with tracer.phase(DECODE, s)` for
    s = 1..N, then `tracer.evidence(...)`.
    """

    def __init__(self, folder: Path, sources: list[str]) -> None:
        self.folder = Path(folder).resolve()
        self.sources = list(sources)
        self._source_paths = {os.path.realpath(self.folder / s): s for s in sources}
        self._kinds: dict[str, Any] = {}
        self.step = 0
        self.phase_name = PREFILL
        self.in_sync = 0
        self._seq = 0
        self.sites: dict[tuple[str, int, str, str | None], _Site] = {}
        self._site_list: list[_Site] = []
        self._producer = WeakIdKeyDictionary()
        # (file, line, kind, op, via) -> {"function", "prefill": n, "decode": n}
        self.syncs: dict[tuple[str, int, str, str, str | None], dict[str, Any]] = {}
        self.coverage: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        # (file, def line) -> name, phases and per call (step, {param: int})
        self.function_calls: dict[tuple[str, int], dict[str, Any]] = {}
        self.unattributed = 0
        self.errors: list[str] = []  # the first few bookkeeping failures; the model ran on regardless

    # -- where an op comes from -----------------------------------------------------------------------
    def _classify(self, filename: str) -> Any:
        kind = self._kinds.get(filename)
        if kind is not None:
            return kind
        real = os.path.realpath(filename) if not filename.startswith("<") else filename
        if real in self._source_paths:
            kind = self._source_paths[real]
        elif filename.startswith("<") or real.startswith(_TORCH_DIR) or real in _OWN_FILES:
            kind = _SKIP
        elif _LIB_DIRS and real.startswith(_LIB_DIRS):
            kind = _OTHER
        elif real.startswith(_STDLIB_DIR):
            kind = _SKIP  # functools, contextlib: wrappers, never the line that made the op
        else:
            kind = _OTHER
        self._kinds[filename] = kind
        return kind

    def _where(self) -> tuple[str, int, Any, str | None] | None:
        """(source file, line, code object, via) of the innermost SOURCES frame, or None."""
        frame = sys._getframe(2)
        via = None
        while frame is not None:
            code = frame.f_code
            kind = self._classify(code.co_filename)
            if kind.__class__ is str:
                return kind, frame.f_lineno, code, via
            if kind == _OTHER and via is None:
                via = self._display(code.co_filename, frame.f_lineno)
            frame = frame.f_back
        return None

    def _display(self, filename: str, line: int) -> str:
        path = Path(os.path.realpath(filename))
        try:
            shown = str(path.relative_to(self.folder))
        except ValueError:
            shown = path.name
        return f"{shown}:{line}"

    def _site(self, file: str, line: int, code: Any, op: str, via: str | None) -> _Site:
        key = (file, line, op, via)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = _Site(len(self._site_list), file, line, _qualname(code), op, via)
            self._site_list.append(site)
        return site

    # -- called by the modes --------------------------------------------------------------------------
    def before(self, name: str, args: tuple, kwargs: dict) -> tuple[_Pending | None, bool]:
        where = self._where()
        if where is None:
            self.unattributed += 1
            return None, False
        file, line, code, via = where
        op = _op_label(name)
        kind = _SYNC_BY_NAME.get(name)
        if kind is None and name == "to" and _to_host(args, kwargs):
            kind = "cpu"
        if kind is not None:
            self._count_sync(file, line, code, kind, op, via)
        site = self._site(file, line, code, op, via)
        inputs = []
        for tensor in _tensors(args, kwargs):
            integer = not (tensor.is_floating_point() or tensor.is_complex())
            inputs.append((self._producer.get(tensor), tuple(tensor.shape), integer))
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        return _Pending(site, tuple(inputs), _ints(op, args, kwargs), first), kind is not None

    def after(self, pending: _Pending, out: Any) -> None:
        outputs = [out] if isinstance(out, torch.Tensor) else (
            [o for o in out if isinstance(o, torch.Tensor)] if type(out) in (tuple, list) else [])
        site = pending.site
        first = outputs[0] if outputs else None
        self._seq += 1
        site.calls.append(_Call(self.step, len(site.calls), self._seq,
                                tuple(first.shape) if first is not None else None,
                                str(first.dtype).replace("torch.", "") if first is not None else "",
                                pending.inputs, pending.ints, self._small_ints(first)))
        producer = (site.id, self.step, len(site.calls) - 1)
        for tensor in outputs:
            if tensor is pending.first:
                continue  # in place (`index_copy_`, `mul_`): the buffer keeps where it came from
            self._producer[tensor] = producer

    def _small_ints(self, tensor: torch.Tensor | None) -> tuple[int, ...] | None:
        """The values of a small integer tensor (ids, positions, lengths); None for anything else."""
        if tensor is None or tensor.dtype not in _INTEGER_DTYPES or tensor.dim() > 2 \
                or not 0 < tensor.numel() <= _MAX_INTS:
            return None
        self.in_sync += 1  # reading them is the trace's own sync, not the model's
        try:
            return tuple(tensor.detach().reshape(-1).tolist())
        finally:
            self.in_sync -= 1

    def sync_at_dispatch(self, kind: str, op: str) -> None:
        where = self._where()
        if where is None:
            self.unattributed += 1
            return
        file, line, code, via = where
        self._count_sync(file, line, code, kind, op, via)

    def _count_sync(self, file: str, line: int, code: Any, kind: str, op: str, via: str | None) -> None:
        record = self.syncs.setdefault((file, line, kind, op, via),
                                       {"function": _qualname(code), PREFILL: 0, DECODE: 0})
        record[self.phase_name] += 1

    def failed(self, exc: Exception) -> None:
        if len(self.errors) < 5:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    # -- lines and parameters (sys.settrace on the sources only) -------------------------------------
    def _on_call(self, frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        kind = self._classify(code.co_filename)
        if kind.__class__ is not str:
            return None  # torch, libraries: no line events, full speed
        phase = self.phase_name
        self.coverage[kind][phase].add(code.co_firstlineno)
        if event == "call":
            record = self.function_calls.setdefault(
                (kind, code.co_firstlineno), {"name": _qualname(code), "phases": set(), "calls": []})
            record["phases"].add(phase)
            count = code.co_argcount + code.co_kwonlyargcount
            local = frame.f_locals
            params = {n: local[n] for n in code.co_varnames[:count] if type(local.get(n)) is int}
            if params:
                record["calls"].append((self.step, params))
        return self._on_line

    def _on_line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            kind = self._classify(frame.f_code.co_filename)
            self.coverage[kind][self.phase_name].add(frame.f_lineno)
        return self._on_line

    class _Phase:
        def __init__(self, tracer: "EvidenceTracer", name: str, step: int) -> None:
            self.tracer, self.name, self.step = tracer, name, step

        def __enter__(self) -> None:
            t = self.tracer
            t.phase_name, t.step = self.name, self.step
            self._previous_trace = sys.gettrace()
            self._dispatch, self._function = _DispatchMode(t), _FunctionMode(t)
            self._dispatch.__enter__()
            self._function.__enter__()
            sys.settrace(t._on_call)

        def __exit__(self, *exc: Any) -> None:
            sys.settrace(self._previous_trace)
            self._function.__exit__(*exc)
            self._dispatch.__exit__(*exc)

    def phase(self, name: str, step: int) -> "EvidenceTracer._Phase":
        return EvidenceTracer._Phase(self, name, step)

    # -- analysis -------------------------------------------------------------------------------------
    def evidence(self, steps: int, prompt_shape: list[int], new_tokens: int) -> Evidence:
        return _Analysis(self, steps).build(prompt_shape, new_tokens)


def _steady(shapes: list[tuple[int, ...] | None]) -> tuple[list[int], int] | None:
    """(dims, by) when every step adds the same positive amount along the same dims, else None."""
    if len(shapes) < 2 or any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return None
    deltas = {tuple(b - a for a, b in zip(s0, s1)) for s0, s1 in zip(shapes, shapes[1:])}
    if len(deltas) != 1:
        return None
    delta = deltas.pop()
    if any(d < 0 for d in delta) or not any(delta):
        return None
    dims = [i for i, d in enumerate(delta) if d]
    return dims, delta[dims[0]]


_LAYOUTS = {4: {2: "[b, h, s, d]", 1: "[b, s, h, d]", 0: "[s, b, h, d]", 3: "[b, h, d, s]"},
            3: {1: "[b, s, d]", 0: "[s, b, d]", 2: "[b, d, s]"}}


def _layout(rank: int, seq_dim: int, kv_dim: int | None) -> str | None:
    """The cache layout the growing dim says: dim 2 of 4 is [b, h, s, d], dim 1 [b, s, h, d], dim 0 [s, b, h, d]."""
    if kv_dim is None:
        return _LAYOUTS.get(rank, {}).get(seq_dim)
    inner = _LAYOUTS.get(rank - 1, {}).get(seq_dim - (kv_dim < seq_dim))
    if inner is None:
        return None
    parts = inner.strip("[]").split(", ")
    parts.insert(kv_dim, "2")
    return "[" + ", ".join(parts) + "]"


class _Analysis:
    """Compares the Decode steps' records: growth, carried inputs, moving ints, syncs, phases."""

    def __init__(self, tracer: EvidenceTracer, steps: int) -> None:
        self.t = tracer
        self.steps = steps
        self.decode_steps = list(range(1, steps + 1))
        self.by_step: dict[int, dict[int, list[_Call]]] = {}
        for site in tracer._site_list:
            grouped: dict[int, list[_Call]] = defaultdict(list)
            for call in site.calls:
                grouped[call.step].append(call)
            self.by_step[site.id] = grouped
        # Growth of each site's outputs first: whether an input grows asks it of the input's producer.
        self.growth: dict[int, tuple[int, tuple[list[int], int]]] = {}
        for site in tracer._site_list:
            for k in range(self._aligned(site)):
                found = _steady([self.by_step[site.id][s][k].out for s in self.decode_steps])
                if found:
                    self.growth[site.id] = (k, found)
                    break
        self._statements: dict[str, dict[int, tuple[int, bool]]] = {}
        self._position_memo: dict[int, int | None] = {}  # site id -> the call holding the positions, or None

    def _aligned(self, site: _Site) -> int:
        """Calls per Decode step that can be compared step by step (the k-th call of every step)."""
        grouped = self.by_step[site.id]
        return min((len(grouped.get(s, [])) for s in self.decode_steps), default=0)

    def _input_grows(self, site: _Site, k: int, i: int) -> tuple[bool, bool]:
        """(grows, enters from outside) for input i of the k-th call of every Decode step."""
        calls = [self.by_step[site.id][s][k] for s in self.decode_steps]
        if any(len(c.inputs) <= i for c in calls):
            return False, False
        producers = [c.inputs[i][0] for c in calls]
        if all(p is not None for p in producers):
            return any(p[0] in self.growth for p in producers), False
        if any(p is not None for p in producers):
            return False, False
        return _steady([c.inputs[i][1] for c in calls]) is not None, True

    def _carried(self, site: _Site, k: int) -> int | None:
        """Index of the input that is this site's own output of the step before, in every step."""
        checked = [s for s in self.decode_steps if s >= 2] or self.decode_steps
        found = None
        for s in checked:
            call = self.by_step[site.id][s][k]
            hit = next((i for i, (p, _, _) in enumerate(call.inputs) if p and p[0] == site.id and p[1] == s - 1),
                       None)
            if hit is None:
                return None
            found = hit
        return found

    def _kv_dim(self, site: _Site, k: int, carried: int, growth_dims: list[int]) -> int | None:
        """The dim along which k and v sit in one tensor: the new piece is `stack`ed, or readers split it."""
        step = self.decode_steps[-1]
        call = self.by_step[site.id][step][k]
        shape = call.out or ()

        def valid(dim: int | None) -> int | None:
            if dim is None:
                return None
            dim = dim % len(shape) if shape else dim
            return dim if 0 <= dim < len(shape) and shape[dim] == 2 and dim not in growth_dims else None

        for i, (producer, _, _) in enumerate(call.inputs):
            if i == carried or producer is None:
                continue
            maker = self.t._site_list[producer[0]]
            if maker.op == "stack":
                ints = dict(maker.calls[producer[2]].ints)
                found = valid(ints.get("dim", ints.get("arg1", 0)))
                if found is not None:
                    return found
        for reader in self.t._site_list:
            for c in self.by_step[reader.id].get(step, []):
                if not c.inputs or c.inputs[0][0] != (site.id, step, call.index):
                    continue
                ints = dict(c.ints)
                dim = None
                if reader.op == "unbind":
                    dim = ints.get("dim", ints.get("arg1", 0))
                elif reader.op == "chunk" and ints.get("arg1", ints.get("chunks")) == 2:
                    dim = ints.get("dim", ints.get("arg2", 0))
                elif reader.op == "select" and ints.get("arg2", ints.get("index")) in (0, 1):
                    dim = ints.get("arg1", ints.get("dim"))
                elif reader.op == "getitem":
                    if ints.get("index") in (0, 1):
                        dim = 0
                    else:
                        dim = next((int(m[1]) for path, v in c.ints if v in (0, 1)
                                    and (m := re.fullmatch(r"index\[(\d+)\]", path))), None)
                found = valid(dim)
                if found is not None:
                    return found
        return None

    def _growth(self, site: _Site) -> tuple[Growth | None, bool]:
        """The site's Growth (None if it does not grow) and whether a tensor input grows."""
        n = self._aligned(site)
        growing_input = any(self._input_grows(site, k, i)[0]
                            for k in range(n) for i in range(len(self.by_step[site.id][1][k].inputs)))
        if site.id not in self.growth:
            return None, growing_input
        k, (dims, by) = self.growth[site.id]
        calls = [self.by_step[site.id][s][k] for s in self.decode_steps]
        prefill = self.by_step[site.id].get(0, [])
        growth = Growth(op=site.op, kind="created", dims=dims, by=by, shapes=[list(c.out) for c in calls],
                        dtype=calls[0].dtype,
                        prefill_shape=list(prefill[0].out) if prefill and prefill[0].out else None,
                        calls=n, via=site.via)
        carried = self._carried(site, k)
        if carried is not None:
            growth.carried = True
            integer = calls[-1].inputs[carried][2]
            growth.kind = "input" if integer else "cache"
            pieces = [shape for i, (_, shape, _) in enumerate(calls[-1].inputs)
                      if i != carried and len(shape) == len(calls[-1].out)]
            growth.piece = pieces[0][dims[0]] if pieces else None
            if not integer:
                growth.kv_dim = self._kv_dim(site, k, carried, dims)
                growth.layout = _layout(len(calls[-1].out), dims[0], growth.kv_dim)
                last = self.by_step[site.id][self.decode_steps[-1]]
                growth.call_shapes = [list(c.out) for c in last if c.out is not None]
            return growth, True
        inputs = [self._input_grows(site, k, i) for i in range(len(calls[0].inputs))]
        if any(grows for grows, _ in inputs):
            growth.kind = "input" if any(grows and outside for grows, outside in inputs) else "derived"
        elif site.op in SLICE_OPS:
            growth.kind = "slice"
        return growth, any(grows for grows, _ in inputs)

    def _scalars(self, site: _Site) -> list[ScalarChange]:
        for k in range(self._aligned(site)):
            calls = [self.by_step[site.id][s][k] for s in self.decode_steps]
            per_step = [dict(c.ints) for c in calls]
            changes = []
            for path in per_step[0]:
                if not all(path in ints for ints in per_step):
                    continue
                values = [ints[path] for ints in per_step]
                changed, delta = _change(values)
                if changed:
                    changes.append(ScalarChange(site.op, path, values, delta, site.via))
            if changes:
                return changes
        return []

    def _statement(self, file: str, line: int) -> tuple[int, bool]:
        """(first line of the innermost statement holding `line`, whether `line` is a branch's test)."""
        if file not in self._statements:
            table: dict[int, tuple[int, bool]] = {}
            try:
                tree = ast.parse((self.t.folder / file).read_text())
            except (OSError, SyntaxError, ValueError):
                tree = None
            if tree is not None:
                statements = sorted((n for n in ast.walk(tree) if isinstance(n, ast.stmt)),
                                    key=lambda n: (n.end_lineno or n.lineno) - n.lineno, reverse=True)
                for node in statements:
                    for n in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                        table[n] = (node.lineno, table.get(n, (0, False))[1])
                for node in ast.walk(tree):
                    # The jump on a condition may carry the line of the `if` or of the test: both count.
                    spans = []
                    if isinstance(node, (ast.If, ast.While, ast.Assert, ast.IfExp)):
                        spans = [(min(node.lineno, node.test.lineno), node.test.end_lineno or node.test.lineno)]
                    elif isinstance(node, ast.comprehension):
                        spans = [(test.lineno, test.end_lineno or test.lineno) for test in node.ifs]
                    for first, last in spans:
                        for n in range(first, last + 1):
                            table[n] = (table.get(n, (n, False))[0], True)
            self._statements[file] = table
        return self._statements[file].get(line, (line, False))

    def _entry(self, lines: dict[str, LineEvidence], file: str, line: int, function: str) -> LineEvidence:
        key = f"{file}:{line}"
        if key not in lines:
            start, _ = self._statement(file, line)
            text = linecache.getline(str(self.t.folder / file), line).strip()
            lines[key] = LineEvidence(function=function, text=text[:100] + ("..." if len(text) > 100 else ""),
                                      phases=[], statement=start if start != line else None)
        return lines[key]

    def build(self, prompt_shape: list[int], new_tokens: int) -> Evidence:
        t = self.t
        lines: dict[str, LineEvidence] = {}
        first_input: tuple[int, str] | None = None
        for site in t._site_list:
            growth, growing_input = self._growth(site) if self._aligned(site) else (None, False)
            scalars = [] if growing_input else self._scalars(site)
            reads = growth is None and growing_input and site.via is None
            if growth is None and not scalars and not reads:
                continue
            entry = self._entry(lines, site.file, site.line, site.function)
            if reads and site.op not in entry.reads_growing:
                entry.reads_growing.append(site.op)
            if growth is not None:
                entry.growing.append(growth)
                if growth.kind == "input" and self._token_input(site):
                    seq = self.by_step[site.id][1][0].seq
                    if first_input is None or seq < first_input[0]:
                        first_input = (seq, f"{site.file}:{site.line}")
            entry.scalars.extend(scalars)
        for site in t._site_list:
            if site.via is None and self._positions(site, prompt_shape, new_tokens):
                self._entry(lines, site.file, site.line, site.function).positions = True
        for (file, line, kind, op, via), record in t.syncs.items():
            _, branch = self._statement(file, line)
            if kind == "bool" and branch:
                kind = "branch"
            entry = self._entry(lines, file, line, record["function"])
            entry.syncs.append(HostSync(kind, op, record[PREFILL], record[DECODE], via))
        self._position_tests(lines, prompt_shape, new_tokens)
        for key, entry in lines.items():
            file, _, line = key.rpartition(":")
            ran = {phase for phase, covered in t.coverage.get(file, {}).items() if int(line) in covered}
            if entry.growing or entry.scalars or entry.positions or entry.reads_growing or entry.position_tests:
                ran.add(DECODE)
            for sync in entry.syncs:
                ran |= {phase for phase in (PREFILL, DECODE) if getattr(sync, phase)}
            entry.phases = [p for p in (PREFILL, DECODE) if p in ran]
        return Evidence(
            folder=str(t.folder), sources=t.sources, steps=self.steps, prompt_shape=list(prompt_shape),
            new_tokens=new_tokens, lines=dict(sorted(lines.items(), key=lambda kv: _line_key(kv[0]))),
            functions=self._functions(), coverage=self._coverage(),
            recomputes_sequence=first_input[1] if first_input else None,
            unattributed_ops=t.unattributed, trace_errors=list(t.errors))

    def _position_tests(self, lines: dict[str, LineEvidence], prompt_shape: list[int], new_tokens: int) -> None:
        """Records the comparisons of the positions with a Python int in the tests of the branches that read the
        device in Decode (`PositionTest`)."""
        branches = {(file, self._statement(file, line)[0])
                    for (file, line, kind, _, _), record in self.t.syncs.items()
                    if kind == "bool" and record[DECODE] and self._statement(file, line)[1]}
        prompt = prompt_shape[-1] if prompt_shape else 0
        for site in self.t._site_list:
            if site.via is None and site.op in _BOUND_TESTS \
                    and (site.file, self._statement(site.file, site.line)[0]) in branches:
                found = self._position_test(site, prompt, new_tokens)
                if found is not None:
                    self._entry(lines, site.file, site.line, site.function).position_tests.append(found)

    def _position_test(self, site: _Site, prompt: int, new_tokens: int) -> PositionTest | None:
        """The site's comparison when, in every call of every Decode step, its one tensor held the step's last
        position plus the same offset (0 or 1) and the other side was the same Python int."""
        if len(self.decode_steps) < 2:
            return None  # one step cannot tell a position from any other number
        seen = set()
        for step in self.decode_steps:
            calls = self.by_step[site.id].get(step, [])
            if not calls:
                return None
            last = prompt + step * new_tokens - 1
            for call in calls:
                bound = dict(call.ints).get("arg1")
                producer = call.inputs[0][0] if len(call.inputs) == 1 else None
                if bound is None or producer is None:
                    return None
                values = self.t._site_list[producer[0]].calls[producer[2]].values
                if values is None or len(values) != 1:
                    return None
                seen.add((values[0] - last, bound))
        if len(seen) != 1:
            return None
        offset, bound = seen.pop()
        return PositionTest(site.op, offset, bound) if offset in (0, 1) else None

    def _positions(self, site: _Site, prompt_shape: list[int], new_tokens: int) -> bool:
        """Whether the site makes the positions of the tokens computed at every Decode step (rows of
        `past, ..., past + new - 1`, past being the prompt plus the tokens before) out of something else than
        positions: the first such tensor on the way, not each view of it."""
        prompt = prompt_shape[-1] if prompt_shape else 0
        k = self._holds_positions(site.id, prompt, new_tokens)
        if k is None:
            return False
        inputs = self.by_step[site.id][self.decode_steps[-1]][k].inputs
        return not any(p is not None and self._holds_positions(p[0], prompt, new_tokens) is not None
                       for p, _, _ in inputs)

    def _holds_positions(self, site_id: int, prompt: int, new_tokens: int) -> int | None:
        """The index of the site's call that holds the positions at every Decode step, or None."""
        memo = self._position_memo
        if site_id not in memo:
            found = None
            for k in range(self._aligned(self.t._site_list[site_id])):
                calls = [self.by_step[site_id][s][k] for s in self.decode_steps]
                wanted = [tuple(range(prompt + (s - 1) * new_tokens, prompt + s * new_tokens))
                          for s in self.decode_steps]
                if len(calls) >= 2 and all(c.values and len(c.values) % new_tokens == 0
                                           and c.values == want * (len(c.values) // new_tokens)
                                           for c, want in zip(calls, wanted)):
                    found = k
                    break
            memo[site_id] = found
        return memo[site_id]

    def _token_input(self, site: _Site) -> bool:
        """A growing integer input of this site comes from outside the sources, or is carried: token ids."""
        k = self.growth[site.id][0]
        call = self.by_step[site.id][1][k]
        carried = self._carried(site, k)
        return any(integer and (i == carried or self._input_grows(site, k, i) == (True, True))
                   for i, (_, _, integer) in enumerate(call.inputs))

    def _functions(self) -> dict[str, FunctionEvidence]:
        out: dict[str, FunctionEvidence] = {}
        for (file, line), record in sorted(self.t.function_calls.items()):
            params: dict[str, ScalarChange] = {}
            grouped: dict[int, list[dict[str, int]]] = defaultdict(list)
            for step, values in record["calls"]:
                grouped[step].append(values)
            n = min((len(grouped.get(s, [])) for s in self.decode_steps), default=0)
            for k in range(n):
                per_step = [grouped[s][k] for s in self.decode_steps]
                for name in per_step[0]:
                    if name in params or not all(name in p for p in per_step):
                        continue
                    values = [p[name] for p in per_step]
                    changed, delta = _change(values)
                    if changed:
                        params[name] = ScalarChange(record["name"], name, values, delta)
            out[f"{file}:{line}"] = FunctionEvidence(
                record["name"], [p for p in (PREFILL, DECODE) if p in record["phases"]], params)
        return out

    def _coverage(self) -> dict[str, dict[str, str]]:
        return {file: {phase: _ranges(lines) for phase, lines in sorted(phases.items())}
                for file, phases in sorted(self.t.coverage.items())}


def _change(values: list[int]) -> tuple[bool, int | None]:
    """(whether the value changed at every step, the change per step when it is always the same)."""
    steps = [b - a for a, b in zip(values, values[1:])]
    if not steps or any(s == 0 for s in steps):
        return False, None
    return True, steps[0] if len(set(steps)) == 1 else None


def _line_key(key: str) -> tuple[str, int]:
    file, _, line = key.rpartition(":")
    return file, int(line)


# -- in a fresh process ------------------------------------------------------------------------------

class EvidenceError(WorkerError):
    """The evidence worker failed (the harness raised, broke the contract) or timed out."""


def collect_evidence(folder: Path, steps: int = 4, timeout_s: float = 300,
                     log_dir: Path | None = None, sources: list[str] | None = None) -> Evidence:
    """Traces the UNMODIFIED model's Prefill and `steps` Decode steps in a fresh process; `sources`: the files to
    trace, instead of the harness's SOURCES.

    Raises EvidenceError with one line (the user's file:line when their code raised)."""
    if steps < 2:
        raise ValueError(f"steps must be at least 2 to see what changes between Decode steps, got {steps}")
    with tempfile.TemporaryDirectory(prefix="graphmode-evidence-") as tmp:
        out = Path(tmp) / "evidence.json"
        seconds = run_worker("graphmode.runners.evidence_worker",
                             ["--folder", str(Path(folder).resolve()), "--steps", str(steps), "--out", str(out),
                              *(["--sources", ",".join(sources)] if sources else [])],
                             name="evidence", timeout_s=timeout_s, log_dir=log_dir, error=EvidenceError)
        evidence = Evidence.from_dict(json.loads(out.read_text()))
    evidence.worker_s = seconds
    return evidence


def _grouped(scalars: Iterator[ScalarChange]) -> list[tuple[tuple[str, str | None], list[ScalarChange]]]:
    groups: dict[tuple[str, str | None], list[ScalarChange]] = defaultdict(list)
    for s in scalars:
        groups[(s.op, s.via)].append(s)
    return list(groups.items())
