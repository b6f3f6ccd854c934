"""The evidence trace: what runs under torch while the harness runs the UNMODIFIED model, and what it records.

- a `TorchFunctionMode` sees every torch function and Tensor method the user's code calls (`cat`,
  `arange`, `Tensor.__getitem__`, `.item()`, `Tensor.__bool__`, ...) with its arguments and result;
- a `TorchDispatchMode` sees the host syncs that happen below that level (`aten._local_scalar_dense`,
  `aten.nonzero`, boolean-mask indexing) in code that called no syncing function itself;
- `sys.settrace`, on the target's own files only, records which lines each phase ran and the Python
  int arguments every call of the target's functions received.

Each op is attributed to the innermost frame whose file is one of the harness's SOURCES (the line a
codemod can change); ops from library code that line called keep the library line as `via`. Ops with
no SOURCES frame (the harness itself, graphmode) are ignored. Recording is all this module does:
runners.evidence.analysis compares the Decode steps' records and builds the evidence
(runners.evidence.model) from them. runners/workers/evidence_worker.py runs both in a fresh process.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from graphmode.runners.evidence.model import DECODE, PREFILL

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
_MAX_INTS = 64  # ints kept per call: a torch.tensor(list) of a thousand ints is data, not positions
_INTEGER_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def _op_label(name: str) -> str:
    return name.strip("_") if name.startswith("__") else name


# -- which files count: the sources, the libraries they call, or neither ------------------------------------

_SKIP, _OTHER = 0, 1  # frame kinds besides a source file's relative path
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
# The trace's own modes and the worker that calls the harness: on the stack of every op, never the line that made it.
_OWN_FILES = {os.path.realpath(__file__),
              os.path.join(os.path.dirname(os.path.realpath(__file__)), "evidence_worker.py")}
_LIB_DIRS = tuple({os.path.realpath(p) + os.sep for key in ("purelib", "platlib")
                   if (p := sysconfig.get_paths().get(key))})
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep


# -- the records (what runners.evidence.analysis reads) ---------------------------------------------------

Producer = tuple[int, int, int]  # (site id, step, index of the call in that site's calls)


@dataclass(slots=True)  # one per op call: slots make the many small records cheaper
class OpCall:
    step: int
    index: int  # position in its site's calls: how a Producer names it
    seq: int  # order of the call in the whole run
    out: tuple[int, ...] | None
    dtype: str
    inputs: tuple[tuple[Producer | None, tuple[int, ...], bool], ...]  # (producer, shape, integer dtype)
    ints: tuple[tuple[str, int], ...]
    values: tuple[int, ...] | None = None  # a small integer output's values (positions are such tensors)


@dataclass
class OpSite:
    """One op at one line of the sources (through one library line, `via`): every call of it, in order."""
    id: int
    file: str
    line: int
    function: str
    op: str
    via: str | None
    calls: list[OpCall] = field(default_factory=list)


@dataclass(slots=True)
class _Pending:
    """A call the function mode saw start, kept until its result is there to record."""
    site: OpSite
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
    """Records ops, syncs, lines and int parameters while the harness runs; runners.evidence.analysis.analyse
    builds the evidence from them.

    Use: `with tracer.phase(PREFILL, 0): harness.prefill(...)`, then `with tracer.phase(DECODE, s)` for
    s = 1..N, then `analyse(tracer, N, ...)`.
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
        self._sites_by_key: dict[tuple[str, int, str, str | None], OpSite] = {}
        self.sites_by_id: list[OpSite] = []  # a site's id is its index here
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

    def _site(self, file: str, line: int, code: Any, op: str, via: str | None) -> OpSite:
        key = (file, line, op, via)
        site = self._sites_by_key.get(key)
        if site is None:
            site = self._sites_by_key[key] = OpSite(len(self.sites_by_id), file, line, _qualname(code), op, via)
            self.sites_by_id.append(site)
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
        site.calls.append(OpCall(self.step, len(site.calls), self._seq,
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

