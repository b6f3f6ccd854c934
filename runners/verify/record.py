"""The verification's record, one from the runs to the report: what runners.verify.verify measured, saved with the
session and read by the documents. It imports neither torch nor agent/: the workflow keeps it in its state as it came.

A record keeps every field a runner gave it (`extra="allow"`), declared or not, so nothing measured is lost on the
way to the report.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graphmode.runners.measure.timing import speedup_unstable


class Record(BaseModel):
    """A runner's record saved with the session: the fields graphmode reads are declared, the rest is kept."""

    model_config = ConfigDict(extra="allow")


class SideFigures(BaseModel):
    """One side's timings: each the median over the runs (decode_ms_min/max: over all steps of all runs; Decode
    figures leave out step 0, the warm-up)."""

    prefill_ms: float
    decode_ms_per_token: float
    decode_ms_min: float
    decode_ms_max: float
    warmup_s: float
    load_s: float


class Verification(Record):
    """Eager original against compiled adapted (runners.verify.verify.verify), or why it did not run (`ran` False and
    `problems`). It passed when it ran and found no problem."""

    ran: bool = True  # False: the adapted model could not be run at all; `problems` says why
    problems: list[str] = Field(default_factory=list)
    original_dir: str = ""
    adapted_dir: str = ""
    backend: str = ""
    backend_reason: str = ""
    steps: int = 0
    tokens_equal: bool = False
    first_divergent_step: int | None = None
    logits_max_abs_diff: float | None = None
    logits_max_abs_diff_per_step: list[float] = Field(default_factory=list)  # index 0: Prefill; k: Decode step k-1
    logits_finite: bool | None = None
    logits_atol: float | None = None
    eager: SideFigures | None = None
    graph: SideFigures | None = None
    decode_speedup: float | None = None  # eager median / graph median; > 1 means graph mode is faster
    # The worst graph run's: one run that recompiles is enough to fail.
    graph_breaks: int | None = None
    break_reasons: list[dict[str, Any]] = Field(default_factory=list)
    recompiles: int | None = None
    recompile_reasons: list[str] = Field(default_factory=list)
    recompile_limit_hit: bool = False
    # Run 1 of each side (runners.verify.results.WorkerResult as a dict): its tokens and logits are the ones compared.
    original: dict[str, Any] = Field(default_factory=dict)
    adapted: dict[str, Any] = Field(default_factory=dict)
    runs: int = 1
    figures: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)  # side -> figure -> stats
    decode_speedup_range: dict[str, float] = Field(default_factory=dict)  # {"median", "min", "max"}
    decode_ms_per_step: dict[str, list[list[float]]] = Field(default_factory=dict)  # side -> runs -> steps
    tokens_identical_across_runs: dict[str, bool] = Field(default_factory=dict)
    logits_max_abs_diff_across_runs: dict[str, float] = Field(default_factory=dict)  # vs run 1 of the side
    tokens_compared: int | None = None
    tokens_differing: int | None = None  # positions (all sequences) where graph run 1 differs from eager run 1
    similarity: float | None = None  # lowest difflib.SequenceMatcher ratio over the sequences
    similarity_threshold: float | None = None
    graphs_after_warmup: int = 0  # the most any graph run compiled after warm-up
    compile_logs: list[str] = Field(default_factory=list)  # file names in the log folder
    variables: dict[str, Any] = Field(default_factory=dict)  # what was held fixed
    unstable_figures: list[str] = Field(default_factory=list)  # "side.figure" whose runs spread > SPREAD
    # Timing runs that waited out their limit for the cores and ran beside another batch target's work
    # (runners.measure.shared_cores): their figures were not taken alone.
    timed_beside_other_targets: int = 0
    # The compile cache the graph side used, and the warm-up it saved: run 1 fills it, runs 2..N read it.
    compile_cache: dict[str, Any] = Field(default_factory=dict)
    # The batch-bucket sweep (runners.verify.batch_buckets.BucketSweep as a dict); empty without buckets.
    bucket_sweep: dict[str, Any] = Field(default_factory=dict)
    # The original harness run eagerly against the adapted sources (its own calling convention kept?):
    # {"ran", "tokens_equal", "first_divergent_step", "error"}; empty when not checked. Part of the verdict: graph
    # mode is verified through the entry points, and this says whether the model's other callers (its own generate
    # loop) still work unchanged, which a person deploying the file relies on as much.
    own_harness: dict[str, Any] = Field(default_factory=dict)
    # The equivalence battery (runners/workers/battery_worker.py): rows {"name", "path", "status", "detail"}, status
    # "held", "failed" or "n/a" (the original itself cannot run it). Part of the verdict: every row must hold or be n/a.
    battery: list[dict[str, Any]] = Field(default_factory=list)
    # How the runs had already failed where the own harness, the battery and the bucket sweep were left to the next
    # round (verify's checks_after_failed_runs), else "".
    later_checks_skipped: str = ""
    # With fusions applied: the adapted side against the same adaptation without them, and the ops each side's
    # Decode step runs ({} without fusions; the layout is runners.verify.verify.fusion_figures' docstring).
    fusion: dict[str, Any] = Field(default_factory=dict)
    # What capture/replay needs of the graph runs (runners.verify.verify.capture_figures): the held tensors' addresses
    # across the Decode steps, and on CUDA the CUDA graphs captured, replayed and declined, per run of each side.
    capture: dict[str, Any] = Field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.ran and not self.problems

    @property
    def decode_speedup_unstable(self) -> bool:
        """The reports' verdict on the Decode speed-up: too spread over the runs to quote (runners.measure.timing), or
        timed while another target of a batch worked on the same cores."""
        return (speedup_unstable(self.decode_speedup_range, self.unstable_figures)
                or self.timed_beside_other_targets > 0)
