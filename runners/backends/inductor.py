"""inductor on CPU: Dynamo and Inductor's generated C++/OpenMP kernels."""
from __future__ import annotations

import shutil

from graphmode.runners.backends.base import Backend, ForceEager, register


@register
class Inductor(Backend):
    name = "inductor"
    summary = "Dynamo + Inductor generated C++/OpenMP kernels"
    listing_order = 2
    auto_preference = 2
    auto_present = "a C++ compiler is available for inductor"
    auto_absent = "no C++ compiler for inductor"
    # Stage 2 (Inductor without capture) is the backend itself on a CPU.
    backend_stage_same_as = "force_eager"

    def available(self) -> str | None:
        # Inductor's CPU code generation shells out to a C++ compiler.
        if any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
            return None
        return ("inductor on CPU needs a C++ compiler (g++ or clang++), none is on PATH; "
                "install one (e.g. apt-get install g++) or use --backend aot_eager")

    def force_eager(self) -> ForceEager:
        return ForceEager("inductor", self.available(), lambda fn: self.compile(fn, fullgraph=False), self.device)
