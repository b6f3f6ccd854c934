"""The record one worker writes for one side (original or adapted) of a verification."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Far above float reordering noise (1e-6..1e-4 for fp32 here), far below a real change in behaviour such as a
# dropped mask (0.76 in lesson 5). Here, not in verify.py, because the battery worker holds logits to it too, and a
# worker imports only what a target's interpreter has (torch, not pydantic).
DEFAULT_LOGITS_ATOL = 1e-2


@dataclass
class WorkerResult:
    side: str                      # "original" (eager) or "adapted" (compiled Decode)
    backend: str                   # the concrete backend name ("eager" run for the original)
    tokens: list[list[int]]        # B lists of N greedy tokens, the ones fed to the N Decode steps
    prefill_ms: float              # one Prefill call, eager on both sides
    decode_ms: list[float]         # every Decode step; step 0 is the warm-up (compile) step
    warmup_s: float                # step 0 alone, in seconds
    load_s: float                  # harness import + build_model (+ move to the device)
    graph_breaks: int = 0
    break_reasons: list[dict[str, Any]] = field(default_factory=list)  # {"reason","file","line"}
    recompiles: int = 0            # guard failures after warm-up that made Dynamo recompile
    recompile_reasons: list[str] = field(default_factory=list)
    recompile_limit_hit: bool = False
    env: dict[str, Any] = field(default_factory=dict)
    # Detail beyond the contract, kept for reports and diagnosis.
    steps: int = 0
    prompt_len: int = 0
    max_seq_len: int = 0
    fullgraph: bool = False
    explain_s: float = 0.0
    graphs_at_warmup: int = 0      # FX graphs compiled by the warm-up step
    graphs_after_warmup: int = 0   # FX graphs compiled by every later step (should be 0)
    recompile_details: list[dict[str, Any]] = field(default_factory=list)
    stance_failures: list[str] = field(default_factory=list)
    recompile_limit: int = 0
    # The fixed variables and the figures beyond the contract (added: older records lack them).
    batch: int = 0                 # sequences per forward (prompt.shape[0])
    model: str = ""                # module.qualname of the model the harness built
    dtype: str = ""                # of its first parameter
    generation_s: float = 0.0      # a second, warm greedy generation: Prefill + all Decode steps, one clock
    new_tokens: int = 0            # per sequence in that generation: steps + 1
    peak_rss_mb: float = 0.0       # peak resident memory of the process (ru_maxrss)
    peak_device_mb: float | None = None  # peak allocator memory on CUDA/NPU; None on CPU
    compile_options: dict[str, Any] = field(default_factory=dict)  # how Decode was compiled (graph side)
    worker_s: float = 0.0          # from the worker module's import (torch import included) to its record
    process_s: float | None = None  # from the OS process start (interpreter start-up included); None w/o /proc
    load_avg_1m: float | None = None  # the machine's 1-minute load average as the record is written
    cpu_count: int = 0
    # Adapted side: {source path relative to the folder: line numbers} one eager Decode step runs.
    decode_lines: dict[str, list[int]] = field(default_factory=dict)
    # With --count-ops: what one Decode step does, counted on its captured graph(s) (runners/measure/decode_graph.py)
    # and estimated from the model's config (runners/measure/traffic.py); empty when not counted.
    decode_graph: dict[str, Any] = field(default_factory=dict)
    # Adapted side: the addresses of the tensors the model holds, watched from warm-up on
    # (runners.verify.static_addresses: {"tensors", "checks", "moved"}), and on CUDA what CUDA graph trees captured,
    # replayed and declined (runners.measure.cuda_graphs: {"captures", "replays", "skips", "skip_reasons", ...}; {}
    # elsewhere).
    static_addresses: dict[str, Any] = field(default_factory=dict)
    cuda_graphs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WorkerResult":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
