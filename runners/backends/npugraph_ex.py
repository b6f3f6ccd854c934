"""npugraph_ex: torch_npu's ACL graph capture/replay (`torch.compile(..., backend="npugraph_ex")`), the default on an
Ascend host.

It compiles with dynamic=False like the others, except with `seq_lengths_as_list=True`: fused-attention sequence
lengths passed as list[int] must become SymInts that npugraph_ex patches at replay, so then it compiles with
dynamic=True. Its options are built and checked by runners/backends/_npu_config.py without torch_npu.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from graphmode.runners.backends._npu import (NPU_INSTALL_HINT, cache_dir_for, cache_report, no_npu_reason,
                                             npu_synchronize, torch_npu_problem)
from graphmode.runners.backends._npu_config import (NPUGRAPH_EX_CACHE_COMPILE, TORCH_NPU_VERSION,
                                          npugraph_ex_cache_compile_kwargs, npugraph_ex_dynamic, npugraph_ex_options,
                                          task_queue_advice)
from graphmode.runners.backends.base import Backend, Compiled, CompilePath, ForceEager, register


def npugraph_ex_compile_kwargs(*, frozen_parameter: bool | None = None, capture_limit: int | None = None,
                               static_kernel_compile: bool | None = None, force_eager: bool | None = None,
                               seq_lengths_as_list: bool = False,
                               options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The torch.compile keyword arguments (besides fn and fullgraph) for npugraph_ex, checked:
    raises NpuConfigError naming a bad option before anything is compiled. None: not given (see
    _npu_config.npugraph_ex_options); seq_lengths_as_list=True compiles with dynamic=True."""
    return {
        "backend": "npugraph_ex",
        "dynamic": npugraph_ex_dynamic(seq_lengths_as_list),
        "options": npugraph_ex_options(frozen_parameter=frozen_parameter, capture_limit=capture_limit,
                                       static_kernel_compile=static_kernel_compile,
                                       force_eager=force_eager, extra=options),
    }


@register
class NpugraphEx(Backend):
    name = "npugraph_ex"
    summary = "torch_npu aclgraph capture/replay (torch.compile backend=\"npugraph_ex\")"
    device = "npu"
    listing_order = 4
    auto_preference = 0
    auto_present = "an Ascend NPU is available"
    takes_compile_cache = True
    fused_ops = "npu"
    knobs = ("frozen_parameter", "capture_limit", "static_kernel_compile", "force_eager", "seq_lengths_as_list",
             "options")

    @property
    def auto_absent(self) -> str:  # type: ignore[override]
        return no_npu_reason()

    def available(self) -> str | None:
        problem = torch_npu_problem(self.name)
        if problem is not None:
            return problem
        import torch

        if "npugraph_ex" not in torch._dynamo.list_backends(exclude_tags=()):
            return (f"npugraph_ex needs torch_npu >= {TORCH_NPU_VERSION} (this torch_npu registers no "
                    f"'npugraph_ex' Dynamo backend); {NPU_INSTALL_HINT} with a newer torch_npu")
        return None

    def _compile(self, fn: Callable[..., Any], fullgraph: bool, *, compile_cache: CompilePath | None,
                 **knobs: Any) -> Compiled:
        kwargs = npugraph_ex_compile_kwargs(**knobs)  # checked before torch_npu is touched
        cache_dir = cache_dir_for(self.name, NPUGRAPH_EX_CACHE_COMPILE, fn, fullgraph, compile_cache)
        importlib.import_module("torch_npu")  # registers the "npugraph_ex" Dynamo backend
        if cache_dir is not None:
            # torch.npu.npugraph_ex is torch_npu.npu.npugraph_ex (torch_npu/npu/__init__.py L200); its
            # cache_compile builds the npugraph_ex CompilerConfig from the same options= dict.
            inference = importlib.import_module("torch_npu.npu.npugraph_ex.inference")
            return inference.cache_compile(fn, **npugraph_ex_cache_compile_kwargs(cache_dir, kwargs))
        import torch

        return torch.compile(fn, fullgraph=fullgraph, **kwargs)

    def force_eager(self) -> ForceEager:
        # npugraph_ex's own pipeline without capture: its availability check imports torch_npu only when installed.
        return ForceEager('npugraph_ex options={"force_eager": True}', self.available(),
                          lambda fn: self.compile(fn, False, force_eager=True), self.device)

    def compile_options(self, fullgraph: bool, compile_cache: CompilePath | None = None) -> dict[str, Any]:
        """The NPU backends add "cache_compile": None without a compile cache, else the cache_compile call used
        instead of torch.compile."""
        kwargs = npugraph_ex_compile_kwargs()
        cache = cache_report(NPUGRAPH_EX_CACHE_COMPILE, npugraph_ex_cache_compile_kwargs("", kwargs),
                             fullgraph, compile_cache)
        return {**kwargs, "fullgraph": fullgraph, "cache_compile": cache}

    def synchronize(self) -> None:
        npu_synchronize()

    def env_advice(self) -> str | None:
        return task_queue_advice()
