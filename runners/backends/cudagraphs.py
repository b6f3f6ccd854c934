"""cudagraphs: Inductor with CUDA graph capture/replay (mode="reduce-overhead"), the CUDA analog of npugraph_ex."""
from __future__ import annotations

from typing import Any, Callable

from graphmode.runners.backends.base import Backend, Compiled, CompilePath, ForceEager, register


@register
class CudaGraphs(Backend):
    name = "cudagraphs"
    summary = "Inductor with CUDA graph capture/replay (mode=reduce-overhead)"
    device = "cuda"
    fused_ops = "cuda"
    listing_order = 3
    auto_preference = 1
    auto_present = "a CUDA GPU is available"
    auto_absent = "no CUDA GPU"

    def available(self) -> str | None:
        import torch

        if torch.cuda.is_available():
            return None
        return (f"the cudagraphs backend needs a CUDA GPU and a CUDA build of torch "
                f"(this torch is {torch.__version__}, torch.cuda.is_available() is False); "
                "use --backend inductor/aot_eager/eager on this machine")

    def _compile(self, fn: Callable[..., Any], fullgraph: bool, *, compile_cache: CompilePath | None,
                 **knobs: Any) -> Compiled:
        import torch

        # reduce-overhead is Inductor plus CUDA graph trees: the capture/replay path on CUDA.
        return torch.compile(fn, mode="reduce-overhead", fullgraph=fullgraph, dynamic=False)

    def force_eager(self) -> ForceEager:
        import torch

        return ForceEager("inductor (mode=default, no CUDA graphs)", self.available(),
                          lambda fn: torch.compile(fn, backend="inductor", dynamic=False), self.device)

    def compile_options(self, fullgraph: bool, compile_cache: CompilePath | None = None) -> dict[str, Any]:
        return {"backend": "inductor", "mode": "reduce-overhead", "fullgraph": fullgraph, "dynamic": False}

    @property
    def stage_label(self) -> str:
        return "cudagraphs (inductor, mode=reduce-overhead)"
