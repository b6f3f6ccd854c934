"""What CUDA graph trees (Inductor's mode="reduce-overhead", the cudagraphs backend) did in one process.

Capture/replay adds what no CPU backend checks: each compiled graph is captured once and then replayed against the
same memory, and Inductor declines to capture a graph it cannot replay safely (mutated inputs, CPU tensors, dynamic
shapes), running it without CUDA graphs instead. Nothing of that reaches Dynamo's counters, so it is counted here:

- captures: `CUDAGraphTreeManager.record_function` (one CUDA graph recorded), replays: `execute_node`, and
  warm-up runs: `run_eager` (a graph's first call, and a fallback after too many re-recordings). With one
  compiled Decode graph, a capture after the first replay is a re-recording: a static input moved, or a new path
  through the tree (a second batch bucket is a second graph, and rightly captured after the first one's replays).
- skips: `counters["inductor"]["cudagraph_skips"]`, and the reason of each, as Inductor logs it
  ("skipping cudagraphs due to mutated inputs (...)") on the `cudagraphs` artifact logger at WARNING, which
  reaches a handler whether TORCH_LOGS asks for it or not.

Measured against torch 2.13's sources (torch/_inductor/cudagraph_trees.py, cudagraph_utils.py). A torch without
these names gives a record saying which count it could not take, never an error: the count is extra.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from torch._dynamo.utils import counters

_COUNTED = {"record_function": "captures", "execute_node": "replays", "run_eager": "warmup_runs"}


class _Reasons(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(level=logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(" ".join(record.getMessage().split()))


@dataclass
class CudaGraphWatch:
    """Counts captures, replays and skips while open; `record()` says what it counted."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTED.values(), 0))
    captures_after_first_replay: int = 0
    skips: int = 0
    skip_reasons: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    _skips_before: int = 0
    _undo: list[Any] = field(default_factory=list)

    def __enter__(self) -> "CudaGraphWatch":
        self._skips_before = counters["inductor"]["cudagraph_skips"]
        try:
            from torch._inductor import cudagraph_trees, cudagraph_utils
        except ImportError as error:  # a torch without Inductor's CUDA graph trees
            self.unavailable.append(f"torch._inductor.cudagraph_trees: {error}")
            return self
        manager = getattr(cudagraph_trees, "CUDAGraphTreeManager", None)
        for method, name in _COUNTED.items():
            original = getattr(manager, method, None)
            if original is None:
                self.unavailable.append(f"CUDAGraphTreeManager.{method} ({name})")
                continue
            setattr(manager, method, self._counting(original, name))
            self._undo.append(lambda method=method, original=original: setattr(manager, method, original))
        logger = getattr(cudagraph_utils, "cudagraphs_log", None)
        if logger is None:
            self.unavailable.append("cudagraph_utils.cudagraphs_log (skip reasons)")
        else:
            handler = _Reasons(self.skip_reasons)
            logger.addHandler(handler)
            self._undo.append(lambda: logger.removeHandler(handler))
        return self

    def _counting(self, original: Any, name: str) -> Any:
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            if name == "captures" and self.counts["replays"]:
                self.captures_after_first_replay += 1
            return original(*args, **kwargs)
        return counted

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self.skips = counters["inductor"]["cudagraph_skips"] - self._skips_before

    def record(self) -> dict[str, Any]:
        """{"captures", "replays", "warmup_runs", "captures_after_first_replay", "skips",
        "skip_reasons": [{"reason", "count"}], "unavailable": [what could not be counted]}; read after the watch
        closed."""
        reasons: dict[str, int] = {}
        for reason in self.skip_reasons:
            reasons[reason] = reasons.get(reason, 0) + 1
        return {**self.counts, "captures_after_first_replay": self.captures_after_first_replay, "skips": self.skips,
                "skip_reasons": [{"reason": r, "count": n} for r, n in reasons.items()],
                "unavailable": list(self.unavailable)}
