"""inductor_cuda: Inductor's Triton kernels on a CUDA GPU, without CUDA graphs: the control for cudagraphs."""
from __future__ import annotations

from typing import Any, Callable

from graphmode.runners.backends.base import Backend, Compiled, CompilePath, ForceEager, register


@register
class InductorCuda(Backend):
    name = "inductor_cuda"
    summary = "Dynamo + Inductor generated Triton kernels on a CUDA GPU, no CUDA graphs (the control for cudagraphs)"
    device = "cuda"
    # The same fusions as cudagraphs, so the two backends time the same adaptation: what one gains over the other is
    # what capture/replay gives, not what Inductor's kernels give.
    fused_ops = "cuda"
    listing_order = 6
    # Stage 2 (Inductor without capture) is the backend itself.
    backend_stage_same_as = "force_eager"

    def available(self) -> str | None:
        import torch

        if torch.cuda.is_available():
            return None
        return (f"the inductor_cuda backend needs a CUDA GPU and a CUDA build of torch "
                f"(this torch is {torch.__version__}, torch.cuda.is_available() is False); "
                "use --backend inductor (on the CPU) on this machine")

    def _compile(self, fn: Callable[..., Any], fullgraph: bool, *, compile_cache: CompilePath | None,
                 **knobs: Any) -> Compiled:
        import torch

        # mode=None: Inductor's default, which never captures CUDA graphs (triton.cudagraphs is off).
        return torch.compile(fn, backend="inductor", fullgraph=fullgraph, dynamic=False)

    def compile_options(self, fullgraph: bool, compile_cache: CompilePath | None = None) -> dict[str, Any]:
        return {"backend": "inductor", "mode": "default", "fullgraph": fullgraph, "dynamic": False}

    def force_eager(self) -> ForceEager:
        return ForceEager("inductor (mode=default, no CUDA graphs)", self.available(),
                          lambda fn: self.compile(fn, fullgraph=False), self.device)
