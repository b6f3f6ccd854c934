"""The compile backends graphmode can verify with, and how `auto` chooses one.

Every backend compiles with `dynamic=False`: capture/replay backends (CUDA graphs,
npugraph_ex) need one static shape per capture, and the default dynamic mode would hide
recompiles behind symbolic shapes (lessons-from-real-code.md, lesson 2).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

Compiled = Callable[..., Any]


class BackendUnavailable(ValueError):
    """An unknown backend name, or one this machine cannot run; the message is one line."""


@dataclass(frozen=True)
class Backend:
    name: str
    device: str  # "cpu", "cuda" or "npu": where the model and inputs must live
    summary: str
    _available: Callable[[], str | None] = field(repr=False)
    _compile: Callable[[Callable[..., Any], bool], Compiled] = field(repr=False)

    def available(self) -> str | None:
        """None when usable here, else a human reason naming what is missing and how to get it."""
        return self._available()

    def compile(self, fn: Callable[..., Any], fullgraph: bool) -> Compiled:
        return self._compile(fn, fullgraph)

    def synchronize(self) -> None:
        """Waits for queued device work, so a timer read after it measures the work itself."""
        if self.device == "cuda":
            torch.cuda.synchronize()
        # CPU work is synchronous; NPU is never imported here (see runners/__init__.py).


def _torch_compile(backend: str) -> Callable[[Callable[..., Any], bool], Compiled]:
    def compile_(fn: Callable[..., Any], fullgraph: bool) -> Compiled:
        return torch.compile(fn, backend=backend, fullgraph=fullgraph, dynamic=False)

    return compile_


def _cudagraphs_compile(fn: Callable[..., Any], fullgraph: bool) -> Compiled:
    # reduce-overhead is Inductor plus CUDA graph trees: the capture/replay path on CUDA.
    return torch.compile(fn, mode="reduce-overhead", fullgraph=fullgraph, dynamic=False)


def _always() -> str | None:
    return None


def _needs_cxx() -> str | None:
    # Inductor's CPU code generation shells out to a C++ compiler.
    if any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        return None
    return ("inductor on CPU needs a C++ compiler (g++ or clang++), none is on PATH; "
            "install one (e.g. apt-get install g++) or use --backend aot_eager")


def _needs_cuda() -> str | None:
    if torch.cuda.is_available():
        return None
    return (f"the cudagraphs backend needs a CUDA GPU and a CUDA build of torch "
            f"(this torch is {torch.__version__}, torch.cuda.is_available() is False); "
            "use --backend inductor/aot_eager/eager on this machine")


def _not_implemented(name: str) -> Callable[[], str | None]:
    def reason() -> str | None:
        return (f"the {name} backend is not implemented in this graphmode release yet "
                "(it comes with NPU support); graphmode will not fake it — "
                "use --backend inductor/aot_eager/eager/cudagraphs")

    return reason


def _refuse(fn: Callable[..., Any], fullgraph: bool) -> Compiled:
    raise BackendUnavailable("this backend is not implemented; resolve() should have refused it")


_REGISTRY: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("eager", "cpu", "Dynamo capture, graphs run eagerly: checks tracing only",
                _always, _torch_compile("eager")),
        Backend("aot_eager", "cpu", "Dynamo + AOTAutograd, run eagerly: checks functionalisation",
                _always, _torch_compile("aot_eager")),
        Backend("inductor", "cpu", "Dynamo + Inductor generated C++/OpenMP kernels",
                _needs_cxx, _torch_compile("inductor")),
        Backend("cudagraphs", "cuda", "Inductor with CUDA graph capture/replay (mode=reduce-overhead)",
                _needs_cuda, _cudagraphs_compile),
        Backend("npugraph_ex", "npu", "torch_npu aclgraph capture/replay (not implemented yet)",
                _not_implemented("npugraph_ex"), _refuse),
        Backend("ge", "npu", "TorchAir GE graph engine (not implemented yet)",
                _not_implemented("ge"), _refuse),
    )
}

BACKEND_NAMES: tuple[str, ...] = ("auto", *_REGISTRY)


def get(name: str) -> Backend:
    """The registered backend, available or not (for listing and help texts)."""
    if name not in _REGISTRY:
        raise BackendUnavailable(f"unknown backend {name!r}; valid names: {', '.join(BACKEND_NAMES)}")
    return _REGISTRY[name]


def resolve(name: str) -> tuple[Backend, str]:
    """The backend to use for `name`, and one sentence saying why it was chosen."""
    if name == "auto":
        if _needs_cuda() is None:
            return _REGISTRY["cudagraphs"], "auto chose cudagraphs because a CUDA GPU is available."
        if _needs_cxx() is None:
            return _REGISTRY["inductor"], "auto chose inductor because no CUDA GPU is available."
        return (_REGISTRY["aot_eager"],
                "auto chose aot_eager because there is no CUDA GPU and no C++ compiler for inductor.")
    backend = get(name)
    reason = backend.available()
    if reason is not None:
        raise BackendUnavailable(
            f"backend {name!r} is unavailable: {reason}; valid names: {', '.join(BACKEND_NAMES)}")
    return backend, f"{name} was asked for by name and is available here."
