"""verify(): the original model eagerly vs the adapted model with compiled Decode.

Each side runs in `runs` fresh processes (runners.workers.verify_worker), one at a time so they do not
compete for cores, alternating adapted / original so that a drift of the machine (heat, other
load) touches both sides alike. Every figure is reported as the median of the runs with their
[min, max]; tokens must be identical across the runs of a side, and run 1 of each side is the
one compared step by step. Tokens are compared for every step, logits step by step (tiny
random models repeat tokens, so equal tokens alone prove little: lesson 7), and the
compiled side must show no graph break, no recompile after warm-up and no hit limit.

With fusions applied (codemods with FUSION = True), a third side runs in the same alternation: the adapted
sources without the fusions, Decode compiled the same way. Its Decode time, set against the adapted side's, is the
fusions' gain measured in the same run; run 1 of each side also counts the ops of one captured Decode step
(the worker's --count-ops). The verdict stays the adapted side's against eager (Verification.fusion says more).

With batch buckets, one more graph-side process (runners/verify/batch_buckets.py) pads the prompt to each
bucket and checks the real rows against graph run 1; its per-bucket captures are expected and are
kept apart from the recompiles above.
"""
from __future__ import annotations

import difflib
import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from graphmode.runners.backends import resolve
from graphmode.runners.measure.dynamo_watch import short_path
from graphmode.runners.measure.shared_cores import waits_given_up
from graphmode.runners.measure.timing import SPREAD, STEADY_FIGURES, speedup_unstable
from graphmode.runners.measure.traffic import estimates
from graphmode.runners.run_settings import MIN_STEPS, default
from graphmode.runners.subprocess_run import WorkerError, run_worker
from graphmode.runners.verify.batch_buckets import BucketSweep
from graphmode.runners.verify.record import SideFigures, Verification
from graphmode.runners.verify.results import DEFAULT_LOGITS_ATOL, WorkerResult
from graphmode.runners.verify.static_addresses import moved_problem

# A model computing in half precision: a few units of its rounding, relative to the largest logit (bf16 keeps 8 bits
# of mantissa, fp16 11): a fused kernel's other order of additions moves bf16 logits of magnitude 300 by about 1,
# which a fixed 1e-2 would call a change in behaviour.
HALF_PRECISION_RTOL = {"bfloat16": 2.0 ** -5, "float16": 2.0 ** -8}


def logits_tolerance(atol: float, dtype: str, eager_logits: torch.Tensor) -> float:
    """The tolerance the logits are held to: `atol`, or for a model in half precision its rounding at the scale of
    the eager logits, whichever is larger. Identical tokens are asked of every model alike."""
    rtol = HALF_PRECISION_RTOL.get(dtype)
    if rtol is None or not eager_logits.numel():
        return atol
    return max(atol, rtol * float(eager_logits.abs().max().nan_to_num(nan=0.0, posinf=0.0)))
DEFAULT_RUNS = default("runs")
# Greedy sequences must match exactly to pass; below this difflib ratio they are also called dissimilar.
DEFAULT_SIMILARITY = default("similarity")
# What the graph side's worker logs to logs/<name>.compile.log (and to its stderr log).
COMPILE_TORCH_LOGS = "graph_breaks,recompiles"


class VerificationError(WorkerError):
    """A worker failed or timed out; the message is the worker's one-line error."""


class AdaptedNotRunnable(VerificationError):
    """The adapted side could not run at all (no entry points, a rewrite that raises): the verification has
    no result, but this is a finding about the adaptation, not bad input."""


def _steady(result: WorkerResult) -> list[float]:
    return result.decode_ms[1:] or result.decode_ms


def _timings(results: list[WorkerResult]) -> SideFigures:
    steps = [ms for r in results for ms in _steady(r)]
    return SideFigures(
        prefill_ms=statistics.median(r.prefill_ms for r in results),
        decode_ms_per_token=statistics.median(statistics.median(_steady(r)) for r in results),
        decode_ms_min=min(steps),
        decode_ms_max=max(steps),
        warmup_s=statistics.median(r.warmup_s for r in results),
        load_s=statistics.median(r.load_s for r in results),
    )


def _stats(values: list[float | None]) -> dict[str, Any]:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None, "runs": values}
    return {"median": statistics.median(known), "min": min(known), "max": max(known), "runs": values}


def run_figures(result: WorkerResult, outer_s: float) -> dict[str, float | None]:
    """One process's figures. tpot: median Decode ms over steps 2..N (step 1 is the warm-up)."""
    tpot = statistics.median(_steady(result))
    batch = result.batch or len(result.tokens)
    return {
        "prefill_ms": result.prefill_ms,
        "tpot_ms": tpot,
        "forward_tokens_per_s": batch * 1e3 / tpot,
        "generation_tokens_per_s": (batch * result.new_tokens / result.generation_s
                                    if result.generation_s else None),
        "generation_s": result.generation_s or None,
        "load_s": result.load_s,
        "warmup_s": result.warmup_s,
        "load_warmup_s": result.load_s + result.warmup_s,
        "process_s": result.process_s if result.process_s is not None else result.worker_s,
        "process_outer_s": outer_s,
        "peak_rss_mb": result.peak_rss_mb,
        "peak_device_mb": result.peak_device_mb,
        "load_avg_1m": result.load_avg_1m,  # a condition, not a result: above cpu_count, others competed
    }


def _figures(results: list[WorkerResult], outer: list[float]) -> dict[str, dict[str, Any]]:
    per_run = [run_figures(r, s) for r, s in zip(results, outer)]
    return {name: _stats([run[name] for run in per_run]) for name in per_run[0]}


def _similarity(a: list[list[int]], b: list[list[int]]) -> tuple[int, int, float]:
    """(positions compared, positions differing, lowest SequenceMatcher ratio) over the sequences."""
    compared = differing = 0
    ratios = []
    for ra, rb in zip(a, b):
        compared += max(len(ra), len(rb))
        differing += sum(x != y for x, y in zip(ra, rb)) + abs(len(ra) - len(rb))
        ratios.append(difflib.SequenceMatcher(None, ra, rb, autojunk=False).ratio())
    return compared, differing, min(ratios, default=0.0)


def _variables(original: WorkerResult, adapted: WorkerResult, backend: str, runs: int) -> dict[str, Any]:
    env = adapted.env
    return {
        "model": {"eager": original.model, "graph": adapted.model},
        "dtype": adapted.dtype,
        "device": env.get("device"),
        "torch": env.get("torch"),
        "torch_npu": env.get("torch_npu"),
        "transformers": env.get("transformers"),
        # Where each side ran: the interpreter (a target's own venv, or graphmode's), its Python and transformers.
        "interpreters": {"eager": _interpreter(original.env), "graph": _interpreter(env)},
        "cann": env.get("cann"),
        "python": env.get("python"),
        "threads": env.get("threads"),
        "cpu_count": adapted.cpu_count,
        "batch": adapted.batch,
        "prompt_len": adapted.prompt_len,
        "decode_steps": adapted.steps,
        "new_tokens": adapted.new_tokens,
        "max_seq_len": adapted.max_seq_len,
        "backend": backend,
        "backend_options": adapted.compile_options,
        "runs": runs,
    }


def _interpreter(env: dict[str, Any]) -> dict[str, Any]:
    return {"executable": env.get("executable"), "python": env.get("python"), "transformers": env.get("transformers")}


def _first_divergence(a: list[list[int]], b: list[list[int]]) -> int | None:
    steps = max(len(row) for row in a + b)
    for step in range(steps):
        if any(step >= len(ra) or step >= len(rb) or ra[step] != rb[step] for ra, rb in zip(a, b)):
            return step
    return None if len(a) == len(b) else 0


def _problems(result: Verification) -> list[str]:
    problems = []
    if not result.tokens_equal:
        problems.append(f"tokens differ from eager from Decode step {result.first_divergent_step}")
    if not result.logits_finite:
        problems.append("logits contain NaN or inf (uninitialised weights? lesson 7)")
    if result.logits_max_abs_diff > result.logits_atol:
        problems.append(f"logits differ from eager by up to {result.logits_max_abs_diff:.3g} "
                        f"(tolerance {result.logits_atol:g})")
    if result.graph_breaks:
        problems.append(_breaks_problem(result.graph_breaks, result.break_reasons))
    if result.recompiles:
        first = result.recompile_reasons[0] if result.recompile_reasons else "reason unknown"
        problems.append(f"{result.recompiles} recompile(s) after warm-up, first: {first}")
    new_graphs = result.graphs_after_warmup
    if new_graphs and not result.recompiles:
        # No guard failed, yet something compiled: a code path first reached after warm-up
        # (e.g. a length threshold, lesson 4) — a fresh capture on a capture/replay backend.
        problems.append(f"{new_graphs} new graph(s) compiled after warm-up without a recompile")
    if result.recompile_limit_hit:
        problems.append("Dynamo hit recompile_limit: Decode fell back to eager")
    for side, same in result.tokens_identical_across_runs.items():
        if not same:
            problems.append(f"the {side} side chose different tokens in different runs: not deterministic")
    if result.similarity < result.similarity_threshold:
        problems.append(f"token sequences only {result.similarity:.3f} similar to eager "
                        f"(threshold {result.similarity_threshold:g})")
    problems += _own_harness_problems(result.own_harness)
    problems += [f"equivalence battery: {row['name']}: {row['detail']}" for row in result.battery
                 if row["status"] == "failed"]
    problems += _capture_problems(result.capture)
    return problems + _bucket_problems(result.bucket_sweep.get("buckets", []), result.logits_atol)


def _breaks_problem(count: int, reasons: list[dict[str, Any]]) -> str:
    """"N graph break(s) in Decode at FILE:LINE (`its code`): what Dynamo said, inside LIBRARY:LINE; also at ...":
    the first break named by the model's own line and construct (an installed package's file from its package folder
    on), so that a break inside torch or transformers helper code reads as the model line that reached it."""
    located = [r for r in reasons if r.get("file")]
    if not located:
        return f"{count} graph break(s) in Decode"
    places = list(dict.fromkeys(f"{short_path(r['file'])}:{r['line']}" for r in located[:3]))
    first = located[0]
    said = f": {first.get('reason') or 'reason unknown'}"
    inside = f", inside {first['inside']}" if first.get("inside") else ""
    also = f"; also at {', '.join(places[1:])}" if len(places) > 1 else ""
    detail = _break_detail(first, located[:3])
    return (f"{count} graph break(s) in Decode at {places[0]}" + (f" ({detail})" if detail else "")
            + said + inside + also)


def _break_detail(first: dict[str, Any], located: list[dict[str, Any]]) -> str:
    """The first break's code, and whether the breaks are on lines of the adapted sources: relative paths are the
    adapted sources' own, absolute ones library code (transformers' own file)."""
    code = f"`{first['code']}`" if first.get("code") else ""
    whose = "lines of the adapted sources" if not any(Path(r["file"]).is_absolute() for r in located) else ""
    return ", ".join(part for part in (code, whose) if part)


def _own_harness_problems(own: dict[str, Any]) -> list[str]:
    """The model's own harness (its prefill/decode loop, eager) on the adapted sources is part of the verdict: a
    caller of the model that the entries leave alone must keep working and choose the same tokens."""
    if not own:
        return []
    if not own["ran"]:
        return [f"the model's own harness fails on the adapted sources: {own['error']}"]
    if not own["tokens_equal"]:
        return [f"the model's own harness, run eagerly on the adapted sources, chose other tokens than on the "
                f"original from Decode step {own['first_divergent_step']}"]
    return []


def capture_figures(adapted_runs: list[WorkerResult], unfused_runs: list[WorkerResult],
                    sweep: BucketSweep | None) -> dict[str, Any]:
    """Verification.capture: {"static_addresses": {"graph": [each run's record], "unfused": [...]},
    "cuda_graphs": {"graph": [...], "unfused": [...], "buckets": the sweep's} ({} off CUDA)."""
    sides = {"graph": adapted_runs, "unfused": unfused_runs}
    capture: dict[str, Any] = {"static_addresses": {side: [r.static_addresses for r in runs]
                                                    for side, runs in sides.items() if runs}}
    graphs = {side: [r.cuda_graphs for r in runs] for side, runs in sides.items() if any(r.cuda_graphs for r in runs)}
    if sweep is not None and sweep.cuda_graphs:
        graphs["buckets"] = sweep.cuda_graphs
    capture["cuda_graphs"] = graphs
    return capture


def _capture_problems(capture: dict[str, Any]) -> list[str]:
    """The verified side's: a held tensor that moved after warm-up (any run), Decode that Inductor would not capture
    as a CUDA graph, and one captured again after it had replayed."""
    problems = []
    for run, record in enumerate(capture.get("static_addresses", {}).get("graph", []), start=1):
        problem = moved_problem(record.get("moved", []))
        if problem:
            problems.append(f"graph run {run}: {problem}")
            break
    for run, record in enumerate(capture.get("cuda_graphs", {}).get("graph", []), start=1):
        if record.get("skips"):
            reasons = "; ".join(r["reason"] for r in record.get("skip_reasons", [])) or "reason not logged"
            problems.append(f"graph run {run}: Inductor declined to capture Decode as a CUDA graph "
                            f"({record['skips']} time(s)): {reasons}")
        if record.get("captures_after_first_replay"):
            problems.append(f"graph run {run}: Decode was captured again after it had replayed "
                            f"({record['captures_after_first_replay']} re-recording(s)): a static input moved or "
                            "the path through the CUDA graph tree changed")
    return problems


def _bucket_problems(buckets: list[dict[str, Any]], atol: float) -> list[str]:
    """Padding must leave the real rows alone, and each bucket must stay one capture once warm."""
    problems = []
    for b in buckets:
        name = f"batch bucket {b['bucket']} ({b['padded_rows']} padded row(s))"
        if not b["tokens_equal"]:
            problems.append(f"{name}: the real rows' tokens differ from the unpadded run from Decode step "
                            f"{b['first_divergent_step']}")
        if not b["logits_max_abs_diff"] <= atol:  # `not <=` so that NaN fails too
            problems.append(f"{name}: the real rows' logits differ from the unpadded run by up to "
                            f"{b['logits_max_abs_diff']:.3g} (tolerance {atol:g})")
        if b["graphs_after_warmup"]:
            problems.append(f"{name}: {b['graphs_after_warmup']} graph(s) compiled after its warm-up")
    return problems


def run_name(side: str, run: int) -> str:
    """Run 1 keeps the plain side name (its files are where they always were)."""
    return side if run == 0 else f"{side}.run{run + 1}"


def _torch_logs() -> str:
    asked = [part for part in os.environ.get("TORCH_LOGS", "").split(",") if part.strip()]
    return ",".join(dict.fromkeys(asked + COMPILE_TORCH_LOGS.split(",")))


def _graph_env(inductor_cache: Path) -> dict[str, str]:
    """A graph-side worker's environment: the compile logs and inductor's on-disk cache (torch reads both from the
    environment; the NPU backends' own compile cache is the worker's --npu-compile-cache argument)."""
    return {"TORCH_LOGS": _torch_logs(), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}


BUCKETS_RUN = "adapted.buckets"


def _run_buckets(folder: Path, backend: str, steps: int, buckets: list[int], work: Path, timeout_s: float,
                 log_dir: Path | None, partial_graph: bool, static_length: int | None = None) -> BucketSweep:
    """The bucket sweep in one more fresh graph-side process, against graph run 1's logits."""
    out = work / f"{BUCKETS_RUN}.json"
    args = ["--side", "adapted", "--folder", str(folder), "--steps", str(steps), "--backend", backend,
            "--out", str(out), "--batch-buckets", ",".join(map(str, buckets)),
            "--reference", str(work / f"{run_name('adapted', 0)}.logits.pt"),
            "--compile-log", str(work / f"{BUCKETS_RUN}.compile.log"), "--npu-compile-cache", "off"]
    if partial_graph:
        args.append("--partial-graph")
    args += _length_args(static_length)
    # Its own empty inductor cache and no NPU compile cache: every bucket compiles cold, so their warm-ups compare.
    run_worker("graphmode.runners.workers.verify_worker", args, name=BUCKETS_RUN, timeout_s=timeout_s, log_dir=log_dir,
               error=VerificationError, env=_graph_env(work / f"{BUCKETS_RUN}.compile-cache"), cores_alone=True)
    return BucketSweep.from_dict(json.loads(out.read_text()))


def _length_args(static_length: int | None) -> list[str]:
    """The workers' argument for the static path's length, where verify was given one."""
    return [] if static_length is None else ["--static-length", str(static_length)]


def _run_side(side: str, run: int, folder: Path, backend: str, steps: int, work: Path,
              timeout_s: float, log_dir: Path | None,
              compile_cache: Path | None, name: str | None = None,
              count_ops: bool = False, static_length: int | None = None) -> tuple[WorkerResult, torch.Tensor, float]:
    name = name or run_name(side, run)
    out, logits = work / f"{name}.json", work / f"{name}.logits.pt"
    args = ["--side", side, "--folder", str(folder), "--steps", str(steps),
            "--backend", backend, "--out", str(out), "--logits", str(logits), *_length_args(static_length)]
    if count_ops:
        args.append("--count-ops")
    env = None
    if side == "adapted":
        args += ["--compile-log", str(work / f"{name}.compile.log"),
                 "--npu-compile-cache", str(compile_cache) if compile_cache is not None else "off"]
        # Inductor's on-disk caches: shared by the graph runs, or one empty folder per run (always cold).
        env = _graph_env(compile_cache if compile_cache is not None else work / f"{name}.compile-cache")
    # The runs whose figures the report quotes: no other target of a batch works on the cores meanwhile.
    seconds = run_worker("graphmode.runners.workers.verify_worker", args, name=name, timeout_s=timeout_s,
                         log_dir=log_dir,
                         error=AdaptedNotRunnable if side == "adapted" else VerificationError, env=env,
                         cores_alone=True)
    return WorkerResult.from_dict(json.loads(out.read_text())), torch.load(logits), seconds


def matches_original(folder: Path, backend: str, steps: int, reference_tokens: list[list[int]],
                     reference_logits: torch.Tensor | None, work: Path, name: str, timeout_s: float,
                     log_dir: Path | None, atol: float = DEFAULT_LOGITS_ATOL,
                     static_length: int | None = None) -> tuple[bool | None, str]:
    """One graph run of the adaptation in `folder` (a bisection's trial) against the original's tokens and logits:
    whether it gives them (None: it did not run), and a one-line detail."""
    try:
        result, logits, _ = _run_side("adapted", 0, Path(folder).resolve(), backend, steps, work, timeout_s, log_dir,
                                      None, name=name, static_length=static_length)
    except VerificationError as error:
        return None, f"did not run: {error}"
    first = _first_divergence(reference_tokens, result.tokens)
    if first is not None:
        return False, f"tokens differ from Decode step {first}"
    if reference_logits is not None and logits.shape == reference_logits.shape:
        worst = float((logits - reference_logits).abs().max().nan_to_num(nan=float("inf")))
        if worst > atol:
            return False, f"logits differ by up to {worst:.3g} (tolerance {atol:g})"
    return True, "the original's tokens"


OWN_HARNESS_RUN = "own-harness"
BATTERY_RUN = "battery"


def _run_battery(original_dir: Path, adapted_dir: Path, backend: str, work: Path, timeout_s: float,
                 log_dir: Path | None, atol: float, static_length: int | None = None) -> list[dict[str, Any]]:
    """The equivalence battery (runners/workers/battery_worker.py) in a process of its own: its rows, or one failed row
    saying why the battery could not run."""
    out = work / f"{BATTERY_RUN}.json"
    args = ["--original", str(original_dir), "--adapted", str(adapted_dir), "--backend", backend,
            "--atol", repr(atol), "--out", str(out), *_length_args(static_length)]
    try:
        run_worker("graphmode.runners.workers.battery_worker", args, name=BATTERY_RUN, timeout_s=timeout_s,
                   log_dir=log_dir, error=VerificationError, env=_graph_env(work / f"{BATTERY_RUN}.compile-cache"))
    except VerificationError as error:
        return [{"name": "the battery", "path": "-", "status": "failed", "detail": str(error)}]
    return json.loads(out.read_text())


def _check_own_harness(adapted_dir: Path, backend: str, steps: int, work: Path, timeout_s: float,
                       log_dir: Path | None, reference: list[list[int]],
                       static_length: int | None = None) -> dict[str, Any]:
    """The original side's worker (the harness's own prefill/decode, eagerly) on the adapted folder: the model's
    callers keep working and choose the same tokens."""
    try:
        result, _, _ = _run_side("original", 0, adapted_dir, backend, steps, work, timeout_s, log_dir, None,
                                 name=OWN_HARNESS_RUN, static_length=static_length)
    except VerificationError as error:
        return {"ran": False, "tokens_equal": False, "first_divergent_step": None, "error": str(error)}
    first = _first_divergence(reference, result.tokens)
    return {"ran": True, "tokens_equal": first is None, "first_divergent_step": first, "error": None}


def verify(original_dir: Path, adapted_dir: Path, backend_name: str, steps: int = MIN_STEPS,
           timeout_s: float = default("timeout"), log_dir: Path | None = None,
           logits_atol: float = DEFAULT_LOGITS_ATOL, runs: int = DEFAULT_RUNS,
           similarity: float = DEFAULT_SIMILARITY, compile_cache: Path | None = None,
           batch_buckets: list[int] | None = None,
           progress: Callable[[str], None] | None = None,
           unfused_dir: Path | None = None, fusions: list[str] | None = None,
           full_config: dict[str, Any] | None = None, static_length: int | None = None,
           checks_after_failed_runs: bool = True) -> Verification:
    """Runs both sides `runs` times (each process under `timeout_s`) and compares them; see
    Verification.problems. `compile_cache`: a folder the graph runs share for inductor's on-disk
    caches (run 1 fills it when it starts empty); None gives every run its own empty one.
    `batch_buckets`: batch sizes to pad the prompt to after the runs (see runners/verify/batch_buckets.py).
    `unfused_dir`: the same adaptation without the fusion codemods `fusions` (their names): a third side in
    every run, timed against the adapted one (Verification.fusion); it does not enter the verdict. `full_config`: the
    model's full-size config (a config.json's values), for the bytes-per-layer estimate at the sizes it names.
    `static_length`: the positions the adapted side's static path is set up for (`setup_caches`), where a person
    revised it; else the harness's MAX_SEQ_LEN.
    `checks_after_failed_runs`: False where another round follows a failure (agent.workflow.repair): once the runs
    themselves failed (other tokens, a graph break, a recompile), the own harness, the battery and the bucket sweep are
    left to the round that verifies the repaired code, and Verification.later_checks_skipped says so.
    `progress` hears which run starts and how long each took, one line each."""
    say = progress or (lambda _: None)
    _check_counts(steps, runs, similarity)
    backend, reason = resolve(backend_name)  # fails fast, before any process starts
    original_dir, adapted_dir = Path(original_dir).resolve(), Path(adapted_dir).resolve()
    unfused_dir = Path(unfused_dir).resolve() if unfused_dir is not None else None
    log_dir = Path(log_dir).resolve() if log_dir is not None else None
    setting = _Setting(backend.name, steps, timeout_s, log_dir, compile_cache, static_length, say)
    with tempfile.TemporaryDirectory(prefix="graphmode-verify-") as tmp:
        work = log_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        done = _alternate_runs(setting, work, runs, original_dir, adapted_dir, unfused_dir)
        original_run, eager_logits = done.sides["original"][0][0], done.sides["original"][0][1]
        logits_atol = logits_tolerance(logits_atol, original_run.dtype, eager_logits)
        skipped = "" if checks_after_failed_runs else _failed_runs(done)
        own_harness, battery, sweep = {}, [], None
        if skipped:
            say(f"{skipped}: the own harness and the battery wait for the next round")
        else:
            say("the original harness against the adapted sources: running")
            own_harness = _check_own_harness(adapted_dir, backend.name, steps, work, timeout_s, log_dir,
                                             original_run.tokens, static_length)
            say("the equivalence battery (padding, the model's own loops, two conversations, the sized length): "
                "running")
            battery = _run_battery(original_dir, adapted_dir, backend.name, work, timeout_s, log_dir, logits_atol,
                                   static_length)
            # After the runs, so it disturbs neither their alternation nor their figures.
            sweep = _run_buckets(adapted_dir, backend.name, steps, batch_buckets, work, timeout_s, log_dir,
                                 partial_graph=done.sides["adapted"][0][0].graph_breaks > 0,
                                 static_length=static_length) if batch_buckets else None
    result = _compared(done, original_dir, adapted_dir, backend.name, reason, steps, logits_atol, similarity)
    result.compile_logs = ([f"{run_name('adapted', run)}.compile.log" for run in range(runs)]
                           + [f"{run_name(UNFUSED, run)}.compile.log" for run in range(len(done.unfused))]
                           + ([f"{BUCKETS_RUN}.compile.log"] if sweep else [])) if log_dir else []
    result.timed_beside_other_targets = done.timed_beside_others
    result.unstable_figures = [
        f"{side}.{name}" for side, figures in result.figures.items() for name in STEADY_FIGURES
        if figures[name]["min"] and figures[name]["max"] > SPREAD * figures[name]["min"]]
    result.compile_cache = _compile_cache_figures([r for r, _, _ in done.sides["adapted"]], compile_cache)
    result.bucket_sweep = sweep.to_dict() if sweep else {}
    result.own_harness = own_harness
    result.battery = battery
    result.later_checks_skipped = skipped
    result.capture = capture_figures([r for r, _, _ in done.sides["adapted"]], [r for r, _, _ in done.unfused], sweep)
    result.problems = _problems(result)
    if unfused_dir is not None:
        result.fusion = fusion_figures(result, list(fusions or []), done.unfused, eager_logits,
                                       done.sides["adapted"][0][1], done.unfused_error, done.timed_beside_others)
        # The analytic estimate (runners/measure/traffic.py) at the sizes run and at the full config's.
        result.fusion["estimate"] = estimates(done.sides["adapted"][0][0].decode_graph.get("config_traffic"),
                                              full_config, list(fusions or []))
    return result


def _failed_runs(done: _Runs) -> str:
    """How the runs themselves failed, in a few words (\"\" when they did not): the graph side broke its graph,
    recompiled, or chose other tokens than the eager side."""
    reference = done.sides["original"][0][0].tokens
    adapted = [run for run, _, _ in done.sides["adapted"]]
    if any(run.graph_breaks for run in adapted):
        return "the adapted Decode broke its graph"
    if any(run.recompiles for run in adapted):
        return "the adapted Decode recompiled"
    if any(run.tokens != reference for run in adapted):
        return "the adapted side chose other tokens"
    return ""


def _check_counts(steps: int, runs: int, similarity: float) -> None:
    if steps < MIN_STEPS:
        raise ValueError(f"verify needs at least {MIN_STEPS} Decode steps (got {steps}): "
                         "some hazards only fire past a length (lesson 4)")
    if runs < 1:
        raise ValueError(f"verify needs at least 1 run per side (got {runs})")
    if not 0.0 <= similarity <= 1.0:
        raise ValueError(f"the similarity threshold is a ratio in [0, 1] (got {similarity:g})")


@dataclass(frozen=True)
class _Setting:
    """What every run of one verification shares."""

    backend: str
    steps: int
    timeout_s: float
    log_dir: Path | None
    compile_cache: Path | None
    static_length: int | None
    say: Callable[[str], None]


# Each run of a side: its record, its logits and the seconds its process took.
_Run = tuple[WorkerResult, torch.Tensor, float]


@dataclass
class _Runs:
    """Every run of the sides, in the order they ran, and what happened beside them."""

    sides: dict[str, list[_Run]]
    unfused: list[_Run]
    unfused_error: str | None
    timed_beside_others: int


def _alternate_runs(setting: _Setting, work: Path, runs: int, original_dir: Path, adapted_dir: Path,
                    unfused_dir: Path | None) -> _Runs:
    """`runs` rounds of the graph side then the eager side (and the side without the fusions, where there is one),
    each in a fresh process."""
    done = _Runs({"adapted": [], "original": []}, [], None, 0)
    given_up = waits_given_up()
    for run in range(runs):
        # Adapted first: rewritten code is the likelier one to fail, so fail before the baseline.
        for side, folder in (("adapted", adapted_dir), ("original", original_dir)):
            label = f"{'graph (adapted)' if side == 'adapted' else 'eager (original)'} run {run + 1} of {runs}"
            setting.say(f"{label}: running")
            # Ops are counted once per side, in run 1.
            done.sides[side].append(_run_side(side, run, folder, setting.backend, setting.steps, work,
                                              setting.timeout_s, setting.log_dir, setting.compile_cache,
                                              count_ops=run == 0 and unfused_dir is not None,
                                              static_length=setting.static_length))
            setting.say(f"{label}: done in {done.sides[side][-1][2]:.1f} s")
            if side == "adapted" and unfused_dir is not None and done.unfused_error is None:
                done.unfused_error = _run_unfused(done.unfused, run, runs, unfused_dir, setting.backend,
                                                  setting.steps, work, setting.timeout_s, setting.log_dir,
                                                  setting.compile_cache, setting.say, setting.static_length)
    done.timed_beside_others = waits_given_up() - given_up
    return done


def _compared(done: _Runs, original_dir: Path, adapted_dir: Path, backend: str, reason: str, steps: int,
              logits_atol: float, similarity: float) -> Verification:
    """The record of the sides' runs compared: run 1 of each for the tokens and logits, every run for the figures."""
    adapted_runs = [r for r, _, _ in done.sides["adapted"]]
    original_runs = [r for r, _, _ in done.sides["original"]]
    adapted, graph_logits = adapted_runs[0], done.sides["adapted"][0][1]
    original, eager_logits = original_runs[0], done.sides["original"][0][1]
    if eager_logits.shape != graph_logits.shape:
        raise VerificationError(f"the sides' logits have different shapes: original "
                                f"{tuple(eager_logits.shape)}, adapted {tuple(graph_logits.shape)}")
    # nan_to_num so a NaN shows up as a huge difference instead of vanishing from max().
    per_step = (eager_logits - graph_logits).abs().flatten(1).amax(dim=1).nan_to_num(nan=float("inf"))
    first = _first_divergence(original.tokens, adapted.tokens)
    eager, graph = _timings(original_runs), _timings(adapted_runs)
    compared, differing, ratio = _similarity(original.tokens, adapted.tokens)
    tpots = {key: [statistics.median(_steady(r)) for r in results]
             for key, results in (("eager", original_runs), ("graph", adapted_runs))}
    worst = max(adapted_runs, key=lambda r: (r.graph_breaks, r.recompiles))
    return Verification(
        original_dir=str(original_dir), adapted_dir=str(adapted_dir),
        backend=backend, backend_reason=reason, steps=steps,
        tokens_equal=first is None, first_divergent_step=first,
        logits_max_abs_diff=float(per_step.max()),
        logits_max_abs_diff_per_step=[float(x) for x in per_step],
        logits_finite=bool(torch.isfinite(eager_logits).all() and torch.isfinite(graph_logits).all()),
        logits_atol=logits_atol,
        eager=eager, graph=graph,
        decode_speedup=eager.decode_ms_per_token / graph.decode_ms_per_token,
        # The worst run's: one run that recompiles is enough to fail.
        graph_breaks=worst.graph_breaks, break_reasons=worst.break_reasons,
        recompiles=worst.recompiles, recompile_reasons=worst.recompile_reasons,
        recompile_limit_hit=any(r.recompile_limit_hit for r in adapted_runs),
        original=original.to_dict(), adapted=adapted.to_dict(),
        runs=len(adapted_runs),
        figures={"eager": _figures(original_runs, [s for _, _, s in done.sides["original"]]),
                 "graph": _figures(adapted_runs, [s for _, _, s in done.sides["adapted"]])},
        decode_speedup_range={
            "median": eager.decode_ms_per_token / graph.decode_ms_per_token,
            # Bounds from the extreme runs: the slowest graph run against the fastest eager one, and back.
            "min": min(tpots["eager"]) / max(tpots["graph"]),
            "max": max(tpots["eager"]) / min(tpots["graph"]),
        },
        decode_ms_per_step={"eager": [r.decode_ms for r in original_runs],
                            "graph": [r.decode_ms for r in adapted_runs]},
        tokens_identical_across_runs={"eager": all(r.tokens == original.tokens for r in original_runs),
                                      "graph": all(r.tokens == adapted.tokens for r in adapted_runs)},
        logits_max_abs_diff_across_runs={key: _spread_across_runs(done.sides[side])
                                         for side, key in (("original", "eager"), ("adapted", "graph"))},
        tokens_compared=compared, tokens_differing=differing,
        similarity=ratio, similarity_threshold=similarity,
        graphs_after_warmup=max(r.graphs_after_warmup for r in adapted_runs),
        variables=_variables(original, adapted, backend, len(adapted_runs)),
    )


def _spread_across_runs(runs: list[_Run]) -> float:
    """The largest logits difference of a later run against run 1 of the same side (0.0 with one run)."""
    first_logits = runs[0][1]
    return max((float((step_logits - first_logits).abs().max().nan_to_num(nan=float("inf")))
                for _, step_logits, _ in runs[1:] if step_logits.shape == first_logits.shape), default=0.0)


def _compile_cache_figures(adapted_runs: list[WorkerResult], compile_cache: Path | None) -> dict[str, Any]:
    """The compile cache the graph runs shared, and the warm-up it saved: run 1 fills it, the later runs read it."""
    warmups = [r.warmup_s for r in adapted_runs]
    later = statistics.median(warmups[1:]) if len(warmups) > 1 else None
    return {
        "dir": str(compile_cache) if compile_cache is not None else None,
        "first_run_warmup_s": warmups[0],
        "later_runs_warmup_s": later,
        "saved_s": warmups[0] - later if later is not None and compile_cache is not None else None,
    }

UNFUSED = "unfused"
# The backends whose Decode Inductor compiles (the worker counts their kernels).
INDUCTOR_BASED = ("inductor", "inductor_cuda", "cudagraphs")


def _run_unfused(done: list[tuple[WorkerResult, torch.Tensor, float]], run: int, runs: int, folder: Path,
                 backend: str, steps: int, work: Path, timeout_s: float, log_dir: Path | None,
                 compile_cache: Path | None, say: Callable[[str], None],
                 static_length: int | None = None) -> str | None:
    """One run of the third side, the adaptation without the fusions, appended to `done`; its error instead
    (then no later run tries again). Its own compile cache: a sibling of the adapted side's would hold the same
    model's caches under another hash, and the NPU backends' caches are per function."""
    label = f"graph without the fusions (unfused) run {run + 1} of {runs}"
    say(f"{label}: running")
    cache = compile_cache / UNFUSED if compile_cache is not None else None
    try:
        done.append(_run_side("adapted", run, folder, backend, steps, work, timeout_s, log_dir, cache,
                              name=run_name(UNFUSED, run), count_ops=run == 0, static_length=static_length))
    except VerificationError as error:
        say(f"{label}: failed")
        return str(error)
    say(f"{label}: done in {done[-1][2]:.1f} s")
    return None


# decode_graph keys of each WorkerResult: the original side's, and the adapted side's without and with the fusions.
_COUNTED = ("ops", "ops_per_layer", "layers", "inductor_kernels")


def fusion_figures(result: Verification, fusions: list[str], unfused: list[tuple[WorkerResult, torch.Tensor, float]],
                   eager_logits: torch.Tensor, graph_logits: torch.Tensor, error: str | None,
                   timed_beside_others: int) -> dict[str, Any]:
    """Verification.fusion: "before" is the adaptation without the fusions, "after" with them (the verified one),
    "original" the eager original; a figure nobody counted is None, and `missing` says why.

    {"applied": [names], "ops_per_step" / "ops_per_layer" / "layers" / "bytes_per_layer":
    {"original", "before", "after"}, "inductor_kernels": {"before", "after"},
    "decode_ms": {"with", "without", "with_range": [min, max], "without_range": [min, max]} (median TPOT of each
    side's runs, and their extremes), "speedup": {"median", "min", "max"} (without / with), "unstable",
    "runs", "tokens": {"unfused_equal_eager", "fused_equal_unfused", "first_divergent_step"} (fused against
    unfused), "logits_max_abs_diff": {"fused_vs_unfused", "unfused_vs_eager"}, "unfused": its Dynamo counts,
    "missing": {figure: why}, "problems": what the fusions themselves broke (also failing the verdict already),
    "error": why the side without fusions did not run (None when it did)}.
    """
    runs = [r for r, _, _ in unfused]
    graphs = {"original": result.original["decode_graph"], "before": runs[0].decode_graph if runs else {},
              "after": result.adapted["decode_graph"]}
    fusion: dict[str, Any] = {"applied": fusions, **_fusion_counts(graphs)}
    fusion.update(_fusion_timing(result, runs, timed_beside_others))
    fusion["runs"] = len(runs)
    fusion.update(_unfused_against_sides(result, unfused, eager_logits, graph_logits))
    fusion["missing"] = _fusion_missing(fusion, graphs, result.backend, error, result.runs)
    fusion["error"] = error
    return fusion


def _fusion_counts(graphs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fusion table's counted figures, per side: ops per step and per layer, layers, bytes per layer, and
    Inductor's kernels (adapted sides only)."""
    counts = {key: {side: graph.get(name) for side, graph in graphs.items()}
              for key, name in (("ops_per_step", "ops"), ("ops_per_layer", "ops_per_layer"), ("layers", "layers"))}
    counts["bytes_per_layer"] = {side: (graph.get("bytes_per_layer") or {}).get("total")
                                 for side, graph in graphs.items()}
    counts["inductor_kernels"] = {side: graphs[side].get("inductor_kernels") for side in ("before", "after")}
    return counts


def _fusion_timing(result: Verification, runs: list[WorkerResult], timed_beside_others: int) -> dict[str, Any]:
    """Decode's time per token with the fusions and without them (None without a run of that side), the speed-up
    they give, and whether it is too spread to quote."""
    with_tpots = result.figures["graph"]["tpot_ms"]["runs"]
    decode_ms = {"with": statistics.median(with_tpots), "without": None,
                 "with_range": [min(with_tpots), max(with_tpots)], "without_range": None}
    if not runs:
        return {"decode_ms": decode_ms, "speedup": {}, "unstable": False}
    without_tpots = [statistics.median(_steady(r)) for r in runs]
    decode_ms.update(without=statistics.median(without_tpots), without_range=[min(without_tpots), max(without_tpots)])
    speedup = {"median": decode_ms["without"] / decode_ms["with"], "min": min(without_tpots) / max(with_tpots),
               "max": max(without_tpots) / min(with_tpots)}
    spread = [f for f in result.unstable_figures if f == "graph.tpot_ms"]
    if max(without_tpots) > SPREAD * min(without_tpots):
        spread.append(f"{UNFUSED}.tpot_ms")
    unstable = speedup_unstable(speedup, spread) or timed_beside_others > 0
    return {"decode_ms": decode_ms, "speedup": speedup, "unstable": unstable}


def _unfused_against_sides(result: Verification, unfused: list[tuple[WorkerResult, torch.Tensor, float]],
                           eager_logits: torch.Tensor, graph_logits: torch.Tensor) -> dict[str, Any]:
    """The side without the fusions against eager and against the fused side: tokens, logits, its Dynamo counts,
    and the problems that lays at the fusions' door (all empty without a run of it)."""
    if not unfused:
        return {"tokens": {}, "logits_max_abs_diff": {}, "unfused": {}, "problems": []}
    runs = [r for r, _, _ in unfused]
    first, unfused_logits = runs[0], unfused[0][1]
    fused_vs_unfused = _first_divergence(first.tokens, result.adapted["tokens"])
    unfused_vs_eager = _first_divergence(result.original["tokens"], first.tokens)
    problems = []
    # The verdict is the fused side's: only when it already fails is a difference laid at the fusions' door.
    if not result.tokens_equal and unfused_vs_eager is None:
        problems.append(f"the fusions change the tokens: without them the tokens equal eager's, with them they differ "
                        f"from Decode step {result.first_divergent_step}")
    return {"tokens": {"unfused_equal_eager": unfused_vs_eager is None, "fused_equal_unfused": fused_vs_unfused is None,
                       "first_divergent_step": fused_vs_unfused},
            "logits_max_abs_diff": {"fused_vs_unfused": _max_diff(graph_logits, unfused_logits),
                                    "unfused_vs_eager": _max_diff(eager_logits, unfused_logits)},
            "unfused": {"graph_breaks": max(r.graph_breaks for r in runs),
                        "recompiles": max(r.recompiles for r in runs),
                        "graphs_after_warmup": max(r.graphs_after_warmup for r in runs),
                        "warmup_s": statistics.median(r.warmup_s for r in runs)},
            "problems": problems}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Largest absolute difference (NaN as inf); None when the shapes differ."""
    if a.shape != b.shape:
        return None
    return float((a - b).abs().max().nan_to_num(nan=float("inf")))


def _fusion_missing(fusion: dict[str, Any], graphs: dict[str, dict[str, Any]], backend: str,
                    error: str | None, runs: int) -> dict[str, str]:
    """Why a figure of the fusion table is missing, in a sentence per figure (only those with a gap)."""
    missing = {}
    if error is not None:
        done = fusion["runs"]
        missing["decode_ms"] = (f"measured without the fusions in {done} of {runs} run(s) only" if done else
                                "not measured without the fusions") + f": that side failed: {error}"
    if not any(graphs.values()):
        missing["decode_graph"] = ("not counted: no worker recorded a Decode graph (a worker that does not count "
                                   "ops, --count-ops)")
        return missing
    for figure in ("ops_per_step", "ops_per_layer", "layers", "bytes_per_layer", "inductor_kernels"):
        gaps = [side for side, value in fusion[figure].items() if value is None]
        if not gaps:
            continue
        uncounted = [side for side in gaps if not graphs[side]]
        if uncounted:
            why = ("that side failed" if error is not None and uncounted == ["before"]
                   else "its worker recorded no Decode graph")
            missing[figure] = f"not counted ({', '.join(uncounted)}): {why}"
        elif figure == "inductor_kernels":
            missing[figure] = (f"not counted: `{backend}` exposes no kernel count" if backend not in INDUCTOR_BASED
                               else "not counted: inductor reported no kernel count for the Decode graph")
        elif figure == "bytes_per_layer":
            missing[figure] = "not measured: the Decode graph gave no bytes per layer"
        else:
            missing[figure] = "not counted per layer: no repeated layer was recognised in the Decode graph"
    return missing
