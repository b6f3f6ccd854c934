"""Batch buckets: the real batch padded to each bucket size, Decode compiled once per bucket.

A server that pads every batch to the next of a few sizes (`--batch-buckets 1,2,4,8`) compiles, and
on a capture/replay backend captures, one graph per bucket. The sweep measures what each bucket
costs and checks the one property padding must keep: padded rows never change the real rows.

For each bucket b at least as large as the real batch B, in one fresh process (the graph side's
worker run with --batch-buckets):

- the prompt gets b - B padding rows of other tokens, so a leak between rows would change the real
  rows (padding with copies of the real rows could hide one);
- Prefill runs eagerly, then Decode through ONE compiled function shared by all buckets
  (`dynamic=False`): each new bucket's first step is its capture, which is expected and is not a
  recompile of the main verification;
- the real rows' logits of every call are compared with the unpadded graph run's (the reference),
  and so are their greedy tokens.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from graphmode.runners.backends import Backend
from graphmode.runners.harness import next_token_logits, require_entry_points
from graphmode.runners.measure.dynamo_watch import CompileWatch
from graphmode.runners.measure.memory import peak_device_mb, peak_rss_mb, reset_device_peak
from graphmode.runners.measure.timing import timed
from graphmode.runners.workers.common import WorkerFailure, call_user

PADDING_SEED = 1234  # padding rows are the same in every process, so runs can be compared


@dataclass
class BucketResult:
    """What one bucket cost and whether its padding left the real rows alone."""
    bucket: int
    real_rows: int
    padded_rows: int
    captures: int                # graphs compiled by the bucket's first Decode step
    graphs_after_warmup: int     # graphs compiled by its later steps (must be 0)
    warmup_s: float              # the bucket's first compiled Decode step, compile included
    decode_ms_median: float      # median of its later steps
    peak_rss_mb: float           # the process's resident peak once the bucket has run (never shrinks)
    rss_growth_mb: float         # how much this bucket raised that peak
    peak_device_mb: float | None  # device allocator peak during this bucket; None on CPU
    tokens_equal: bool           # real rows' greedy tokens == the unpadded run's, every step
    first_divergent_step: int | None
    logits_max_abs_diff: float   # real rows' logits against the unpadded run's, all calls

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BucketSweep:
    """The sweep's record (the worker writes it as JSON)."""
    batch: int                   # the real batch (the harness prompt's rows)
    buckets: list[BucketResult] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # buckets smaller than the real batch: not run
    padding: str = ""            # how padding rows were made, for the report
    # On CUDA, what CUDA graph trees captured and replayed over the whole sweep (runners.measure.cuda_graphs; {}
    # elsewhere): one capture per bucket when each stays one graph.
    cuda_graphs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BucketSweep":
        return cls(batch=data["batch"], buckets=[BucketResult(**b) for b in data["buckets"]],
                   skipped=data.get("skipped", []), padding=data.get("padding", ""),
                   cuda_graphs=data.get("cuda_graphs", {}))


PADDING_DESCRIPTION = (f"rows of random token ids in [0, the prompt's largest id], seeded ({PADDING_SEED}), "
                       "unlike the real rows")


def pad_batch(prompt: torch.Tensor, bucket: int) -> torch.Tensor:
    """The (B, T) prompt followed by bucket - B padding rows of other token ids.

    Ids come from [0, max id in the prompt], which the model's vocabulary holds since the prompt's ids
    are valid; each padding row differs, so attention mixing rows would change what real rows see.
    """
    rows, length = prompt.shape
    generator = torch.Generator().manual_seed(PADDING_SEED)
    padding = torch.randint(0, int(prompt.max()) + 1, (bucket - rows, length), generator=generator,
                            dtype=prompt.dtype)
    return torch.cat([prompt, padding.to(prompt.device)])


def _first_divergence(tokens: torch.Tensor, reference: torch.Tensor) -> int | None:
    """First step (column) where any row differs, None when all are equal."""
    differs = (tokens != reference).any(dim=0).nonzero()
    return int(differs[0]) if len(differs) else None


def run_bucket(model: torch.nn.Module, decode: Callable[..., Any], prompt: torch.Tensor, bucket: int,
               steps: int, backend: Backend, folder: Path, reference: torch.Tensor) -> BucketResult:
    """One bucket: padded Prefill (eager), then `steps` Decode steps through `decode` (compiled).

    reference: the unpadded run's (steps + 1, B, V) logits, Prefill first.
    """
    rows, prompt_len = prompt.shape
    device = prompt.device
    padded = pad_batch(prompt, bucket)
    reset_device_peak(backend.device)
    rss_before = peak_rss_mb()

    out = call_user("model.prefill (padded)", folder,
                    lambda: model.prefill(padded, torch.arange(prompt_len, device=device)))
    logits = next_token_logits(out)
    real_logits = [logits[:rows].float().cpu().clone()]
    decode_ms: list[float] = []
    warmup_s = 0.0
    captures = 0
    with CompileWatch(root=folder) as watch:
        for step in range(steps):
            # argmax makes a fresh contiguous (b, 1) token each step (a stride Dynamo guards on).
            token = logits.argmax(-1, keepdim=True)
            input_pos = torch.tensor([prompt_len + step], device=device)
            out, seconds = call_user(f"compiled model.decode (bucket {bucket})", folder,
                                     lambda: timed(lambda: decode(token, input_pos), backend.synchronize))
            if step == 0:
                warmup_s = seconds
                captures = watch.graphs
                watch.mark()  # from here on, a compiled graph is a recompile inside this bucket
            else:
                decode_ms.append(seconds * 1e3)
            # A copy: a CUDA-graph replay overwrites its output buffers on the next call.
            logits = next_token_logits(out).clone()
            real_logits.append(logits[:rows].float().cpu())
        graphs_after_warmup = watch.graphs

    ours = torch.stack(real_logits)
    if ours.shape != reference.shape:
        raise WorkerFailure(f"bucket {bucket}: the real rows' logits are {tuple(ours.shape)}, the unpadded "
                            f"run's {tuple(reference.shape)}; were both run with the same --steps?")
    # Greedy tokens fed to each Decode step, chosen exactly as the unpadded run chose them.
    tokens, reference_tokens = ours[:steps].argmax(-1).T, reference[:steps].argmax(-1).T
    first = _first_divergence(tokens, reference_tokens)
    rss_after = peak_rss_mb()
    return BucketResult(
        bucket=bucket, real_rows=rows, padded_rows=bucket - rows,
        captures=captures, graphs_after_warmup=graphs_after_warmup, warmup_s=warmup_s,
        decode_ms_median=statistics.median(decode_ms) if decode_ms else warmup_s * 1e3,
        peak_rss_mb=rss_after, rss_growth_mb=rss_after - rss_before,
        peak_device_mb=peak_device_mb(backend.device),
        tokens_equal=first is None, first_divergent_step=first,
        # nan_to_num so a NaN shows up as a huge difference instead of vanishing from max().
        logits_max_abs_diff=float((ours - reference).abs().nan_to_num(nan=float("inf")).max()),
    )


def run_sweep(model: torch.nn.Module, prompt: torch.Tensor, buckets: list[int], steps: int,
              backend: Backend, folder: Path, reference: torch.Tensor, fullgraph: bool = True) -> BucketSweep:
    """Every bucket at least as large as the real batch, smallest first, through one compiled Decode."""
    rows = prompt.shape[0]
    if rows > max(buckets):
        raise WorkerFailure(f"the harness prompt has a batch of {rows}, larger than the largest bucket "
                            f"({max(buckets)}); add a bucket of at least {rows} to --batch-buckets")
    require_entry_points(model, "batch buckets need the adapted model")
    run = [b for b in buckets if b >= rows]
    # One graph per bucket is by design here: let Dynamo keep them all rather than fall back to eager.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(run) + 1)
    decode = backend.compile(model.decode, fullgraph=fullgraph)
    sweep = BucketSweep(batch=rows, skipped=[b for b in buckets if b < rows], padding=PADDING_DESCRIPTION)
    for bucket in run:
        sweep.buckets.append(run_bucket(model, decode, prompt, bucket, steps, backend, folder, reference))
    return sweep
