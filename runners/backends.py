"""The compile backends graphmode can verify with, and how `auto` chooses one.

Every backend compiles with `dynamic=False`: capture/replay backends (CUDA graphs,
npugraph_ex) need one static shape per capture, and the default dynamic mode would hide
recompiles behind symbolic shapes (lessons-from-real-code.md, lesson 2). The one exception is
npugraph_ex with `seq_lengths_as_list=True`: fused-attention sequence lengths passed as list[int]
must become SymInts that npugraph_ex patches at replay, so that backend compiles with dynamic=True.

Each Backend has a name, the device its inputs live on, an availability check (None or a reason
naming what is missing and how to get it), its synchronisation, and `compile(fn, fullgraph,
**knobs)` / `compile_decode(fn, **knobs)`. The NPU backends' configuration is built and checked by
runners/npu_config.py without torch_npu; torch_npu itself is imported only inside their
availability checks and compile functions, never when this module is imported.

Compile caches: given a `--compile-cache` folder (knob `compile_cache`, else $GRAPHMODE_COMPILE_CACHE,
which runners/verify.py sets for the graph runs), npugraph_ex and ge compile Decode through
torch_npu's own `cache_compile` (npu_config.py names the real functions) instead of torch.compile;
where it cannot apply they warn (CompileCacheUnused) and compile without it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from graphmode.runners.npu_config import (
    CACHE_COMPILE_SUBDIR,
    GE_CACHE_COMPILE,
    NPUGRAPH_EX_CACHE_COMPILE,
    TORCH_NPU_VERSION,
    apply_config_fields,
    compile_cache_setting,
    ge_cache_compile_kwargs,
    ge_compiler_config_fields,
    npugraph_ex_cache_compile_kwargs,
    npugraph_ex_dynamic,
    npugraph_ex_options,
    task_queue_advice,
)

Compiled = Callable[..., Any]


class BackendUnavailable(ValueError):
    """An unknown backend name, or one this machine cannot run; the message is one line."""


@dataclass(frozen=True)
class Backend:
    name: str
    device: str  # "cpu", "cuda" or "npu": where the model and inputs must live
    summary: str
    _available: Callable[[], str | None] = field(repr=False)
    _compile: Callable[..., Compiled] = field(repr=False)  # (fn, fullgraph, **knobs)
    knobs: tuple[str, ...] = ()  # keyword arguments compile()/compile_decode() accept
    _synchronize: Callable[[], None] | None = field(default=None, repr=False)
    _env_advice: Callable[[], str | None] | None = field(default=None, repr=False)

    def available(self) -> str | None:
        """None when usable here, else a human reason naming what is missing and how to get it."""
        return self._available()

    def compile(self, fn: Callable[..., Any], fullgraph: bool, **knobs: Any) -> Compiled:
        """torch.compile for this backend; `knobs` are backend-specific (see `knobs`), all optional."""
        unknown = sorted(set(knobs) - set(self.knobs))
        if unknown:
            valid = ", ".join(self.knobs) or "none"
            raise TypeError(f"backend {self.name!r} takes no knob {', '.join(map(repr, unknown))}; "
                            f"its knobs: {valid}")
        return self._compile(fn, fullgraph, **knobs)

    def compile_decode(self, fn: Callable[..., Any], *, fullgraph: bool = True, **knobs: Any) -> Compiled:
        """Compiles a Decode step: one whole graph (fullgraph=True) unless told otherwise."""
        return self.compile(fn, fullgraph, **knobs)

    def synchronize(self) -> None:
        """Waits for queued device work, so a timer read after it measures the work itself."""
        if self._synchronize is not None:
            self._synchronize()
        elif self.device == "cuda":
            torch.cuda.synchronize()
        # CPU work is synchronous.

    def env_advice(self) -> str | None:
        """Environment advice for running this backend well (never applied automatically)."""
        return self._env_advice() if self._env_advice is not None else None


def _torch_compile(backend: str) -> Callable[..., Compiled]:
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


# --- Ascend NPU -------------------------------------------------------------------------------
# torch_npu is imported only inside these checks and compile functions, never at module import:
# installed without CANN it breaks `import torch`, and graphmode must import everywhere.

NPU_INSTALL_HINT = "install graphmode[npu] there (pip install -e \".[npu]\")"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _torch_npu_problem(name: str) -> str | None:
    """None when torch_npu imports and an NPU is visible; else what is missing, how to get it."""
    needs = f"{name} needs torch_npu with CANN on an Ascend host: {NPU_INSTALL_HINT}"
    if importlib.util.find_spec("torch_npu") is None:
        return f"{needs} (torch_npu is not installed here)"
    try:
        importlib.import_module("torch_npu")  # registers torch.npu and the npu/npugraph_ex Dynamo backends
    except Exception as error:  # a broken CANN setup raises anything from OSError to RuntimeError
        return (f"{needs} (torch_npu is installed but `import torch_npu` failed: {_first_line(error)}; "
                "is CANN installed and its set_env.sh sourced?)")
    try:
        visible = bool(torch.npu.is_available())
    except Exception as error:
        return f"{needs} (torch.npu.is_available() raised {_first_line(error)})"
    if not visible:
        return f"{needs} (torch_npu imports, but torch.npu.is_available() is False: no Ascend NPU is visible)"
    return None


def _npugraph_ex_problem() -> str | None:
    problem = _torch_npu_problem("npugraph_ex")
    if problem is not None:
        return problem
    if "npugraph_ex" not in torch._dynamo.list_backends(exclude_tags=()):
        return (f"npugraph_ex needs torch_npu >= {TORCH_NPU_VERSION} (this torch_npu registers no "
                f"'npugraph_ex' Dynamo backend); {NPU_INSTALL_HINT} with a newer torch_npu")
    return None


def _ge_problem() -> str | None:
    problem = _torch_npu_problem("ge")
    if problem is not None:
        return problem
    try:
        import torchair
        torchair.get_npu_backend  # noqa: B018  (torch_npu's torchair is lazy: touch it to load it)
    except Exception as error:
        return (f"ge needs TorchAir (shipped inside torch_npu as torchair); `import torchair` failed: "
                f"{_first_line(error)}; {NPU_INSTALL_HINT}")
    return None


def _npu_synchronize() -> None:
    # Nothing can be queued on an NPU unless torch_npu was imported (by a check or a compile).
    if "torch_npu" in sys.modules:
        torch.npu.synchronize()


class CompileCacheUnused(UserWarning):
    """A compile-cache folder was given but cache_compile cannot compile this function."""


# It always traces with fullgraph=True (torch.compile(func, backend=cache_backend, fullgraph=True,
# ...), _cache_compiler.py L498): a Decode with graph breaks would fail there.
_NEEDS_FULLGRAPH = "always compiles with fullgraph=True, and this Decode has graph breaks"


def cache_compile_problem(fn: Callable[..., Any], fullgraph: bool) -> str | None:
    """None when torch_npu's cache_compile can compile `fn`, else why not (both variants share these
    checks: dynamo/torchair/inference/_cache_compiler.py L699-703 and L498, npugraph_ex's L663-667)."""
    if not fullgraph:
        return _NEEDS_FULLGRAPH
    if not isinstance(fn, types.MethodType):
        return f"caches only a bound method of a torch.nn.Module (model.decode), got {type(fn).__name__} {fn!r}"
    if not isinstance(fn.__self__, torch.nn.Module):
        return f"caches only a method of a torch.nn.Module, got a method of {type(fn.__self__).__name__}"
    return None


def model_cache_dir(base: str, fn: Callable[..., Any]) -> str:
    """base/cache_compile/<key>: one folder per model code, Python and torch.

    cache_compile's own key is the module's repr, the config and the deterministic level
    (get_cache_bin, torchair/inference/_cache_compiler.py L203-235), not the code: a Decode edited
    between two runs of the same layers would load the old compiled code, and guards are skipped
    once loaded. Keying the folder on the source files of the model's classes rules that out.
    """
    digest = hashlib.sha256(f"{sys.version}|{torch.__version__}".encode())
    files = {getattr(sys.modules.get(type(m).__module__), "__file__", None)
             for m in fn.__self__.modules()} - {None}
    for name in sorted(files):
        digest.update(name.encode())
        try:
            digest.update(Path(name).read_bytes())
        except OSError:  # a frozen or vanished module: its name still keys the folder
            pass
    return os.path.join(base, CACHE_COMPILE_SUBDIR, digest.hexdigest()[:16])


def _cache_dir_for(name: str, api: str, fn: Callable[..., Any], fullgraph: bool,
                   compile_cache: str | os.PathLike[str] | None) -> str | None:
    """The folder to hand `api`, or None: no cache asked for, or (with a warning) one that
    cannot apply here, so the flag is never dropped silently."""
    base = compile_cache_setting(compile_cache)
    if base is None:
        return None
    problem = cache_compile_problem(fn, fullgraph)
    if problem is not None:
        warnings.warn(f"{name}: the compile cache {base} is not used for this Decode: {api} {problem}; "
                      "compiling with torch.compile, without an NPU compile cache", CompileCacheUnused,
                      stacklevel=4)
        return None
    return model_cache_dir(base, fn)


NPUGRAPH_EX_KNOBS = ("frozen_parameter", "capture_limit", "static_kernel_compile", "force_eager",
                     "seq_lengths_as_list", "options", "compile_cache")


def npugraph_ex_compile_kwargs(*, frozen_parameter: bool | None = None, capture_limit: int | None = None,
                               static_kernel_compile: bool | None = None, force_eager: bool | None = None,
                               seq_lengths_as_list: bool = False,
                               options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The torch.compile keyword arguments (besides fn and fullgraph) for npugraph_ex, checked:
    raises NpuConfigError naming a bad option before anything is compiled. None: not given (see
    npu_config.npugraph_ex_options); seq_lengths_as_list=True compiles with dynamic=True."""
    return {
        "backend": "npugraph_ex",
        "dynamic": npugraph_ex_dynamic(seq_lengths_as_list),
        "options": npugraph_ex_options(frozen_parameter=frozen_parameter, capture_limit=capture_limit,
                                       static_kernel_compile=static_kernel_compile,
                                       force_eager=force_eager, extra=options),
    }


def _npugraph_ex_compile(fn: Callable[..., Any], fullgraph: bool, *,
                         compile_cache: str | os.PathLike[str] | None = None, **knobs: Any) -> Compiled:
    kwargs = npugraph_ex_compile_kwargs(**knobs)  # checked before torch_npu is touched
    cache_dir = _cache_dir_for("npugraph_ex", NPUGRAPH_EX_CACHE_COMPILE, fn, fullgraph, compile_cache)
    importlib.import_module("torch_npu")  # registers the "npugraph_ex" Dynamo backend
    if cache_dir is not None:
        # torch.npu.npugraph_ex is torch_npu.npu.npugraph_ex (torch_npu/npu/__init__.py L200); its
        # cache_compile builds the npugraph_ex CompilerConfig from the same options= dict.
        inference = importlib.import_module("torch_npu.npu.npugraph_ex.inference")
        return inference.cache_compile(fn, **npugraph_ex_cache_compile_kwargs(cache_dir, kwargs))
    return torch.compile(fn, fullgraph=fullgraph, **kwargs)


GE_KNOBS = ("frozen_parameter", "tiling_schedule_optimize", "topology_sorting_strategy", "fields",
            "compile_cache")


def _ge_compile(fn: Callable[..., Any], fullgraph: bool, *, frozen_parameter: bool | None = None,
                tiling_schedule_optimize: bool | None = None, topology_sorting_strategy: str | None = None,
                fields: Mapping[str, Any] | None = None,
                compile_cache: str | os.PathLike[str] | None = None) -> Compiled:
    # GE compiles static graphs only: dynamic=False always (a graph with a -1 dim is dynamic GE).
    config_fields = ge_compiler_config_fields(
        frozen_parameter=frozen_parameter, tiling_schedule_optimize=tiling_schedule_optimize,
        topology_sorting_strategy=topology_sorting_strategy, extra=fields)
    cache_dir = _cache_dir_for("ge", GE_CACHE_COMPILE, fn, fullgraph, compile_cache)
    importlib.import_module("torch_npu")  # torchair needs torch.npu
    import torchair

    config = apply_config_fields(torchair.CompilerConfig(), config_fields)
    if cache_dir is not None:
        # The same config object: cache_compile hashes its options into the cache key
        # (_cache_compiler.py L204-206) and compiles with it (CacheBackend, L389-410).
        inference = importlib.import_module("torchair.inference")
        return inference.cache_compile(fn, config=config, **ge_cache_compile_kwargs(cache_dir))
    return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config),
                         dynamic=False, fullgraph=fullgraph)


NPUGRAPH_EX = Backend(
    "npugraph_ex", "npu", "torch_npu aclgraph capture/replay (torch.compile backend=\"npugraph_ex\")",
    _npugraph_ex_problem, _npugraph_ex_compile, NPUGRAPH_EX_KNOBS, _npu_synchronize, task_queue_advice)
GE = Backend(
    "ge", "npu", "TorchAir GE graph engine (torchair.get_npu_backend, mode max-autotune, static shapes)",
    _ge_problem, _ge_compile, GE_KNOBS, _npu_synchronize)

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
        NPUGRAPH_EX,
        GE,
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
        npu_problem = _REGISTRY["npugraph_ex"].available()
        if npu_problem is None:
            return _REGISTRY["npugraph_ex"], "auto chose npugraph_ex because an Ascend NPU is available."
        no_npu = "there is no usable Ascend NPU (torch_npu is not installed)" \
            if importlib.util.find_spec("torch_npu") is None else "there is no usable Ascend NPU"
        if _needs_cuda() is None:
            return _REGISTRY["cudagraphs"], f"auto chose cudagraphs because {no_npu} and a CUDA GPU is available."
        if _needs_cxx() is None:
            return _REGISTRY["inductor"], f"auto chose inductor because {no_npu} and no CUDA GPU is available."
        return (_REGISTRY["aot_eager"],
                f"auto chose aot_eager because {no_npu}, no CUDA GPU and no C++ compiler for inductor.")
    backend = get(name)
    reason = backend.available()
    if reason is not None:
        raise BackendUnavailable(
            f"backend {name!r} is unavailable: {reason}; valid names: {', '.join(BACKEND_NAMES)}")
    return backend, f"{name} was asked for by name and is available here."


def _cache_report(api: str, cache_kwargs: dict[str, Any], fullgraph: bool,
                  compile_cache: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The "cache_compile" entry of compile_options: None when no cache was asked for."""
    base = compile_cache_setting(compile_cache)
    if base is None:
        return None
    report: dict[str, Any] = {"api": api, "cache_dir": os.path.join(base, CACHE_COMPILE_SUBDIR, "<model key>")}
    # The worker compiles model.decode, a bound nn.Module method: only fullgraph can rule it out.
    if not fullgraph:
        return {**report, "used": False, "why": f"{api} {_NEEDS_FULLGRAPH}"}
    return {**report, "used": True, **{k: v for k, v in cache_kwargs.items() if k != "cache_dir"}}


def compile_options(backend: Backend, fullgraph: bool,
                    compile_cache: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The compile arguments `backend.compile(fn, fullgraph)` uses (no knobs), for reports. The NPU
    backends add "cache_compile": None without a compile cache (`compile_cache`, else
    $GRAPHMODE_COMPILE_CACHE), else the cache_compile call used instead of torch.compile."""
    if backend.name == "cudagraphs":
        return {"backend": "inductor", "mode": "reduce-overhead", "fullgraph": fullgraph, "dynamic": False}
    if backend.name == "npugraph_ex":
        kwargs = npugraph_ex_compile_kwargs()
        cache = _cache_report(NPUGRAPH_EX_CACHE_COMPILE, npugraph_ex_cache_compile_kwargs("", kwargs),
                              fullgraph, compile_cache)
        return {**kwargs, "fullgraph": fullgraph, "cache_compile": cache}
    if backend.name == "ge":
        cache = _cache_report(GE_CACHE_COMPILE, {"config": "<compiler_config>", **ge_cache_compile_kwargs("")},
                              fullgraph, compile_cache)
        return {"backend": "torchair.get_npu_backend(compiler_config=CompilerConfig())", "fullgraph": fullgraph,
                "dynamic": False, "compiler_config": ge_compiler_config_fields(), "cache_compile": cache}
    return {"backend": backend.name, "fullgraph": fullgraph, "dynamic": False}
