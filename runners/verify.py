"""verify(): the original model eagerly vs the adapted model with compiled Decode.

Each side runs in its own fresh process (runners.worker), one after the other so they do
not compete for cores; the order does not matter for the figures. Tokens are compared for every step, logits step by step (tiny
random models repeat tokens, so equal tokens alone prove little: lesson 7), and the
compiled side must show no graph break, no recompile after warm-up and no hit limit.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from runners.backends import resolve
from runners.results import WorkerResult
from runners.subprocess_run import WorkerError, run_worker

MIN_STEPS = 32
# Far above float reordering noise (1e-6..1e-4 for fp32 here), far below a real change in
# behaviour such as a dropped mask (0.76 in lesson 5).
DEFAULT_LOGITS_ATOL = 1e-2


class VerificationError(WorkerError):
    """A worker failed or timed out; the message is the worker's one-line error."""


@dataclass
class SideTimings:
    prefill_ms: float
    decode_ms_per_token: float  # median over steps 1..N-1 (step 0 is warm-up on both sides)
    decode_ms_min: float
    decode_ms_max: float
    warmup_s: float
    load_s: float


@dataclass
class VerifyResult:
    original_dir: str
    adapted_dir: str
    backend: str
    backend_reason: str
    steps: int
    tokens_equal: bool
    first_divergent_step: int | None
    logits_max_abs_diff: float
    logits_max_abs_diff_per_step: list[float]  # index 0: Prefill; index k: Decode step k-1
    logits_finite: bool
    logits_atol: float
    eager: SideTimings
    graph: SideTimings
    decode_speedup: float  # eager median / graph median; > 1 means graph mode is faster
    graph_breaks: int
    break_reasons: list[dict[str, Any]]
    recompiles: int
    recompile_reasons: list[str]
    recompile_limit_hit: bool
    original: WorkerResult
    adapted: WorkerResult
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data


def _timings(result: WorkerResult) -> SideTimings:
    steady = result.decode_ms[1:] or result.decode_ms
    return SideTimings(
        prefill_ms=result.prefill_ms,
        decode_ms_per_token=statistics.median(steady),
        decode_ms_min=min(steady),
        decode_ms_max=max(steady),
        warmup_s=result.warmup_s,
        load_s=result.load_s,
    )


def _first_divergence(a: list[list[int]], b: list[list[int]]) -> int | None:
    steps = max(len(row) for row in a + b)
    for step in range(steps):
        if any(step >= len(ra) or step >= len(rb) or ra[step] != rb[step] for ra, rb in zip(a, b)):
            return step
    return None if len(a) == len(b) else 0


def _problems(result: VerifyResult) -> list[str]:
    problems = []
    if not result.tokens_equal:
        problems.append(f"tokens differ from eager from Decode step {result.first_divergent_step}")
    if not result.logits_finite:
        problems.append("logits contain NaN or inf (uninitialised weights? lesson 7)")
    if result.logits_max_abs_diff > result.logits_atol:
        problems.append(f"logits differ from eager by up to {result.logits_max_abs_diff:.3g} "
                        f"(tolerance {result.logits_atol:g})")
    if result.graph_breaks:
        where = ", ".join(f"{r['file']}:{r['line']}" for r in result.break_reasons[:3])
        problems.append(f"{result.graph_breaks} graph break(s) in Decode" + (f" at {where}" if where else ""))
    if result.recompiles:
        first = result.recompile_reasons[0] if result.recompile_reasons else "reason unknown"
        problems.append(f"{result.recompiles} recompile(s) after warm-up, first: {first}")
    new_graphs = result.adapted.graphs_after_warmup
    if new_graphs and not result.recompiles:
        # No guard failed, yet something compiled: a code path first reached after warm-up
        # (e.g. a length threshold, lesson 4) — a fresh capture on a capture/replay backend.
        problems.append(f"{new_graphs} new graph(s) compiled after warm-up without a recompile")
    if result.recompile_limit_hit:
        problems.append("Dynamo hit recompile_limit: Decode fell back to eager")
    return problems


def _run_side(side: str, folder: Path, backend: str, steps: int, work: Path,
              timeout_s: float, log_dir: Path | None) -> tuple[WorkerResult, torch.Tensor]:
    out, logits = work / f"{side}.json", work / f"{side}.logits.pt"
    run_worker("runners.worker",
               ["--side", side, "--folder", str(folder), "--steps", str(steps),
                "--backend", backend, "--out", str(out), "--logits", str(logits)],
               name=side, timeout_s=timeout_s, log_dir=log_dir, error=VerificationError)
    return WorkerResult.from_dict(json.loads(out.read_text())), torch.load(logits)


def verify(original_dir: Path, adapted_dir: Path, backend_name: str, steps: int = MIN_STEPS,
           timeout_s: float = 600, log_dir: Path | None = None,
           logits_atol: float = DEFAULT_LOGITS_ATOL) -> VerifyResult:
    """Runs both sides (each under `timeout_s`) and compares them; see VerifyResult.problems."""
    if steps < MIN_STEPS:
        raise ValueError(f"verify needs at least {MIN_STEPS} Decode steps (got {steps}): "
                         "some hazards only fire past a length (lesson 4)")
    backend, reason = resolve(backend_name)  # fails fast, before any process starts
    original_dir, adapted_dir = Path(original_dir).resolve(), Path(adapted_dir).resolve()
    log_dir = Path(log_dir).resolve() if log_dir is not None else None
    with tempfile.TemporaryDirectory(prefix="graphmode-verify-") as tmp:
        work = log_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        # Adapted first: rewritten code is the likelier one to fail, so fail before the baseline.
        adapted, graph_logits = _run_side("adapted", adapted_dir, backend.name, steps, work, timeout_s, log_dir)
        original, eager_logits = _run_side("original", original_dir, backend.name, steps, work, timeout_s, log_dir)

    if eager_logits.shape != graph_logits.shape:
        raise VerificationError(f"the sides' logits have different shapes: original "
                                f"{tuple(eager_logits.shape)}, adapted {tuple(graph_logits.shape)}")
    per_step = (eager_logits - graph_logits).abs().flatten(1).amax(dim=1)
    finite = bool(torch.isfinite(eager_logits).all() and torch.isfinite(graph_logits).all())
    first = _first_divergence(original.tokens, adapted.tokens)
    eager, graph = _timings(original), _timings(adapted)
    result = VerifyResult(
        original_dir=str(original_dir), adapted_dir=str(adapted_dir),
        backend=backend.name, backend_reason=reason, steps=steps,
        tokens_equal=first is None, first_divergent_step=first,
        # nan_to_num so a NaN shows up as a huge difference instead of vanishing from max().
        logits_max_abs_diff=float(per_step.nan_to_num(nan=float("inf")).max()),
        logits_max_abs_diff_per_step=[float(x) for x in per_step.nan_to_num(nan=float("inf"))],
        logits_finite=finite, logits_atol=logits_atol,
        eager=eager, graph=graph,
        decode_speedup=eager.decode_ms_per_token / graph.decode_ms_per_token,
        graph_breaks=adapted.graph_breaks, break_reasons=adapted.break_reasons,
        recompiles=adapted.recompiles, recompile_reasons=adapted.recompile_reasons,
        recompile_limit_hit=adapted.recompile_limit_hit,
        original=original, adapted=adapted,
    )
    result.problems = _problems(result)
    return result
