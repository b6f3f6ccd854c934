"""What the two Ascend backends (npugraph_ex, ge) share: the torch_npu availability check, device synchronisation and
torch_npu's own compile cache (`cache_compile`).

torch_npu is imported only inside these functions, never at module import: installed without CANN it breaks
`import torch`, and graphmode must import everywhere.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Callable

from graphmode.runners.backends._npu_config import CACHE_COMPILE_SUBDIR, compile_cache_setting
from graphmode.runners.backends.base import CompilePath

NPU_INSTALL_HINT = "install graphmode[npu] there (pip install -e \".[npu]\")"


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def torch_npu_problem(name: str) -> str | None:
    """None when torch_npu imports and an NPU is visible; else what is missing, how to get it."""
    needs = f"{name} needs torch_npu with CANN on an Ascend host: {NPU_INSTALL_HINT}"
    if importlib.util.find_spec("torch_npu") is None:
        return f"{needs} (torch_npu is not installed here)"
    try:
        importlib.import_module("torch_npu")  # registers torch.npu and the npu/npugraph_ex Dynamo backends
    except Exception as error:  # a broken CANN setup raises anything from OSError to RuntimeError
        return (f"{needs} (torch_npu is installed but `import torch_npu` failed: {first_line(error)}; "
                "is CANN installed and its set_env.sh sourced?)")
    import torch

    try:
        visible = bool(torch.npu.is_available())
    except Exception as error:
        return f"{needs} (torch.npu.is_available() raised {first_line(error)})"
    if not visible:
        return f"{needs} (torch_npu imports, but torch.npu.is_available() is False: no Ascend NPU is visible)"
    return None


def no_npu_reason() -> str:
    """Why `auto` passed the Ascend backends over."""
    if importlib.util.find_spec("torch_npu") is None:
        return "there is no usable Ascend NPU (torch_npu is not installed)"
    return "there is no usable Ascend NPU"


def npu_synchronize() -> None:
    # Nothing can be queued on an NPU unless torch_npu was imported (by a check or a compile).
    if "torch_npu" in sys.modules:
        import torch

        torch.npu.synchronize()


class CompileCacheUnused(UserWarning):
    """A compile-cache folder was given but cache_compile cannot compile this function."""


# It always traces with fullgraph=True (torch.compile(func, backend=cache_backend, fullgraph=True,
# ...), _cache_compiler.py L498): a Decode with graph breaks would fail there.
NEEDS_FULLGRAPH = "always compiles with fullgraph=True, and this Decode has graph breaks"


def cache_compile_problem(fn: Callable[..., Any], fullgraph: bool) -> str | None:
    """None when torch_npu's cache_compile can compile `fn`, else why not (both variants share these
    checks: dynamo/torchair/inference/_cache_compiler.py L699-703 and L498, npugraph_ex's L663-667)."""
    import torch

    if not fullgraph:
        return NEEDS_FULLGRAPH
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
    import torch

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


def cache_dir_for(name: str, api: str, fn: Callable[..., Any], fullgraph: bool,
                  compile_cache: CompilePath | None) -> str | None:
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


def cache_report(api: str, cache_kwargs: dict[str, Any], fullgraph: bool,
                 compile_cache: CompilePath | None) -> dict[str, Any] | None:
    """The "cache_compile" entry of compile_options: None when no cache was asked for."""
    base = compile_cache_setting(compile_cache)
    if base is None:
        return None
    report: dict[str, Any] = {"api": api, "cache_dir": os.path.join(base, CACHE_COMPILE_SUBDIR, "<model key>")}
    # The worker compiles model.decode, a bound nn.Module method: only fullgraph can rule it out.
    if not fullgraph:
        return {**report, "used": False, "why": f"{api} {NEEDS_FULLGRAPH}"}
    return {**report, "used": True, **{k: v for k, v in cache_kwargs.items() if k != "cache_dir"}}
