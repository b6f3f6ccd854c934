"""ge: TorchAir's GE graph engine (`torchair.get_npu_backend(compiler_config=CompilerConfig())`), static graphs only.

GE compiles static graphs only: dynamic=False always (a graph with a -1 dim is dynamic GE). Its CompilerConfig
fields are built and checked by runners/backends/_npu_config.py without torch_npu.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from graphmode.runners.backends._npu import (NPU_INSTALL_HINT, cache_dir_for, cache_report, first_line,
                                             npu_synchronize, torch_npu_problem)
from graphmode.runners.backends._npu_config import (GE_CACHE_COMPILE, apply_config_fields, ge_cache_compile_kwargs,
                                          ge_compiler_config_fields)
from graphmode.runners.backends.base import Backend, Compiled, CompilePath, ForceEager, register


@register
class Ge(Backend):
    name = "ge"
    summary = "TorchAir GE graph engine (torchair.get_npu_backend, mode max-autotune, static shapes)"
    device = "npu"
    listing_order = 5
    takes_compile_cache = True
    fused_ops = "npu"
    knobs = ("frozen_parameter", "tiling_schedule_optimize", "topology_sorting_strategy", "fields")

    def available(self) -> str | None:
        problem = torch_npu_problem(self.name)
        if problem is not None:
            return problem
        try:
            import torchair
            torchair.get_npu_backend  # noqa: B018  (torch_npu's torchair is lazy: touch it to load it)
        except Exception as error:
            return (f"ge needs TorchAir (shipped inside torch_npu as torchair); `import torchair` failed: "
                    f"{first_line(error)}; {NPU_INSTALL_HINT}")
        return None

    def _compile(self, fn: Callable[..., Any], fullgraph: bool, *, compile_cache: CompilePath | None,
                 frozen_parameter: bool | None = None, tiling_schedule_optimize: bool | None = None,
                 topology_sorting_strategy: str | None = None,
                 fields: Mapping[str, Any] | None = None) -> Compiled:
        config_fields = ge_compiler_config_fields(
            frozen_parameter=frozen_parameter, tiling_schedule_optimize=tiling_schedule_optimize,
            topology_sorting_strategy=topology_sorting_strategy, extra=fields)
        cache_dir = cache_dir_for(self.name, GE_CACHE_COMPILE, fn, fullgraph, compile_cache)
        importlib.import_module("torch_npu")  # torchair needs torch.npu
        import torch
        import torchair

        config = apply_config_fields(torchair.CompilerConfig(), config_fields)
        if cache_dir is not None:
            # The same config object: cache_compile hashes its options into the cache key
            # (_cache_compiler.py L204-206) and compiles with it (CacheBackend, L389-410).
            inference = importlib.import_module("torchair.inference")
            return inference.cache_compile(fn, config=config, **ge_cache_compile_kwargs(cache_dir))
        return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=False, fullgraph=fullgraph)

    def force_eager(self) -> ForceEager:
        # TorchAir's eager mode: the converted FX graph runs without GE.
        return ForceEager("ge debug.run_eagerly=True", self.available(),
                          lambda fn: self.compile(fn, False, fields={"debug.run_eagerly": True}), self.device)

    def compile_options(self, fullgraph: bool, compile_cache: CompilePath | None = None) -> dict[str, Any]:
        cache = cache_report(GE_CACHE_COMPILE, {"config": "<compiler_config>", **ge_cache_compile_kwargs("")},
                             fullgraph, compile_cache)
        return {"backend": "torchair.get_npu_backend(compiler_config=CompilerConfig())", "fullgraph": fullgraph,
                "dynamic": False, "compiler_config": ge_compiler_config_fields(), "cache_compile": cache}

    def synchronize(self) -> None:
        npu_synchronize()
