"""The compile backends graphmode can verify with, and how `auto` chooses one.

Each backend is one class in one module of this package (base.py says what a backend is). Importing the package
imports every module in it, so each registers itself: adding a backend is adding one file, and `--help`, `auto`, the
probe's triage and the report read it from here. Nothing is compiled, and torch is not imported, until a backend's
methods are called.
"""
from __future__ import annotations

import importlib
import pkgutil

from graphmode.runners.backends._npu import CompileCacheUnused, cache_compile_problem, model_cache_dir
from graphmode.runners.backends.base import Backend, BackendUnavailable, Compiled, ForceEager, register, registered
from graphmode.runners.backends.npugraph_ex import npugraph_ex_compile_kwargs

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

BACKEND_NAMES: tuple[str, ...] = ("auto", *(backend.name for backend in registered()))

__all__ = ["BACKEND_NAMES", "Backend", "BackendUnavailable", "CompileCacheUnused", "Compiled", "ForceEager", "get",
           "help_text", "model_cache_dir", "cache_compile_problem", "npugraph_ex_compile_kwargs", "register",
           "resolve"]


def get(name: str) -> Backend:
    """The registered backend, available or not (for listing and help texts)."""
    for backend in registered():
        if backend.name == name:
            return backend
    raise BackendUnavailable(f"unknown backend {name!r}; valid names: {', '.join(BACKEND_NAMES)}")


def _auto_ranked() -> list[Backend]:
    """The backends `auto` may choose, in its order of preference."""
    return sorted((b for b in registered() if b.auto_preference is not None), key=lambda b: b.auto_preference)


def _auto() -> tuple[Backend, str]:
    """The first available backend in `auto`'s preference, and why: what the better ones lacked, what it has."""
    ranked = _auto_ranked()
    passed_over: list[str] = []
    for backend in ranked:
        if backend.available() is None:
            reasons = [*passed_over, backend.auto_present] if backend.auto_present else passed_over
            said = reasons[0] if len(reasons) == 1 else f"{', '.join(reasons[:-1])} and {reasons[-1]}"
            return backend, f"auto chose {backend.name} because {said}."
        passed_over.append(backend.auto_absent)
    raise BackendUnavailable("no backend is available here: " + "; ".join(b.available() or "" for b in ranked))


def resolve(name: str) -> tuple[Backend, str]:
    """The backend to use for `name`, and one sentence saying why it was chosen."""
    if name == "auto":
        return _auto()
    backend = get(name)
    reason = backend.available()
    if reason is not None:
        raise BackendUnavailable(
            f"backend {name!r} is unavailable: {reason}; valid names: {', '.join(BACKEND_NAMES)}")
    return backend, f"{name} was asked for by name and is available here."


def help_text() -> str:
    """The --backend help: `auto`'s order, then each backend's one line."""
    ranked = _auto_ranked()
    lines = [f"where Decode is compiled: auto (the first available of {', '.join(b.name for b in ranked)})"]
    lines += [f"{backend.name} = {backend.summary}" for backend in registered()]
    return "; ".join(lines)
