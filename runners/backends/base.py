"""What every compile backend is: one class per backend, registered by name.

A backend tells its whole story in its own class: its name and one help line, the device its inputs live on, whether
this machine can run it (and if not, what is missing and how to get it), how it compiles a Decode step, what the
probe's force-eager stage runs for it, which compile arguments the report shows, and how `auto` ranks it. The
package's `__init__` imports every module of the package, so a new backend is one new file with one `@register`ed
class in it; nothing else names it.

Every backend compiles with `dynamic=False` unless its own class says why not: capture/replay backends need one static
shape per capture, and the default dynamic mode would hide recompiles behind symbolic shapes. Nothing here imports
torch at module import: `graphmode scan` and `--help` list the backends without it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

Compiled = Callable[..., Any]
CompilePath = str | os.PathLike[str]


class BackendUnavailable(ValueError):
    """An unknown backend name, or one this machine cannot run; the message is one line."""


@dataclass(frozen=True)
class ForceEager:
    """The probe's stage 2 for a backend: its own pipeline without capture or code generation."""

    what: str  # what runs, as the triage table names it
    unavailable: str | None  # why it cannot run here, or None
    compile: Callable[[Callable[..., Any]], Compiled] | None  # None: the backend has no separate eager mode
    device: str


class Backend:
    name: ClassVar[str]
    summary: ClassVar[str]  # one line for --help and the report
    device: ClassVar[str] = "cpu"  # "cpu", "cuda" or "npu": where the model and inputs must live
    listing_order: ClassVar[int]  # where --help and BACKEND_NAMES list it
    # `auto` tries the backends with a preference, lowest first, and takes the first available. `auto_present` says
    # why it was chosen, `auto_absent` why it was passed over ("" where nothing needs saying).
    auto_preference: ClassVar[int | None] = None
    auto_present: ClassVar[str] = ""
    auto_absent: ClassVar[str] = ""
    knobs: ClassVar[tuple[str, ...]] = ()  # backend-specific keyword arguments compile() accepts
    # Whether Decode compiles through a compile cache of the backend's own when one is given (the NPU backends'
    # cache_compile); the CPU and CUDA backends use Inductor's on-disk cache, which the runner sets up.
    takes_compile_cache: ClassVar[bool] = False
    # The probe's stage 3 repeats an earlier stage for backends whose stage 2 already was the backend itself.
    backend_stage_same_as: ClassVar[str | None] = None
    # Which fused operators the fusions write for this backend's hardware: "cpu", "cuda" (portable torch ops, less
    # on CPU those that measure slower than Inductor's own fusion) or "npu" (torch_npu's).
    fused_ops: ClassVar[str] = "cpu"

    # -- what a subclass gives -----------------------------------------------------------------------
    def available(self) -> str | None:
        """None when usable here, else a human reason naming what is missing and how to get it."""
        return None

    def _compile(self, fn: Callable[..., Any], fullgraph: bool, *, compile_cache: CompilePath | None,
                 **knobs: Any) -> Compiled:
        import torch

        return torch.compile(fn, backend=self.name, fullgraph=fullgraph, dynamic=False)

    def force_eager(self) -> ForceEager:
        return ForceEager(self.name, "the backend has no separate eager mode", None, self.device)

    def compile_options(self, fullgraph: bool, compile_cache: CompilePath | None = None) -> dict[str, Any]:
        """The compile arguments `compile(fn, fullgraph)` uses (no knobs), for reports."""
        return {"backend": self.name, "fullgraph": fullgraph, "dynamic": False}

    def env_advice(self) -> str | None:
        """Environment advice for running this backend well (never applied automatically)."""
        return None

    @property
    def stage_label(self) -> str:
        """How the probe's triage names a run of this backend itself."""
        return self.name

    # -- shared ----------------------------------------------------------------------------------------
    def compile(self, fn: Callable[..., Any], fullgraph: bool, *, compile_cache: CompilePath | None = None,
                **knobs: Any) -> Compiled:
        """torch.compile (or the backend's own compile call) for `fn`; `knobs` are backend-specific, all optional.
        `compile_cache` is a folder for the backend's own compile cache (see `takes_compile_cache`), else unused."""
        unknown = sorted(set(knobs) - set(self.knobs))
        if unknown:
            valid = ", ".join(self.knobs) or "none"
            raise TypeError(f"backend {self.name!r} takes no knob {', '.join(map(repr, unknown))}; "
                            f"its knobs: {valid}")
        return self._compile(fn, fullgraph, compile_cache=compile_cache, **knobs)

    def compile_decode(self, fn: Callable[..., Any], *, fullgraph: bool = True, **knobs: Any) -> Compiled:
        """Compiles a Decode step: one whole graph (fullgraph=True) unless told otherwise."""
        return self.compile(fn, fullgraph, **knobs)

    def synchronize(self) -> None:
        """Waits for queued device work, so a timer read after it measures the work itself."""
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        # CPU work is synchronous.

    def __repr__(self) -> str:
        return f"<backend {self.name} on {self.device}>"


_REGISTERED: dict[str, Backend] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: makes the backend known under its name (one instance; backends hold no state)."""
    if cls.name in _REGISTERED:
        raise ValueError(f"two backends are named {cls.name!r}")
    _REGISTERED[cls.name] = cls()
    return cls


def registered() -> list[Backend]:
    return sorted(_REGISTERED.values(), key=lambda backend: backend.listing_order)
