"""One side of a verification, in a fresh process.

    python -m runners.workers.verify_worker --side {original,adapted} --folder DIR --steps N \
        --backend NAME --out RESULT.json [--logits LOGITS.pt]
    python -m runners.workers.verify_worker --side adapted --folder DIR --steps N --backend NAME \
        --out SWEEP.json --batch-buckets 1,2,4 --reference LOGITS.pt [--partial-graph]

A fresh process per side gives each side a freshly, identically seeded model (forward may
have first-call side effects, lesson 6) and empty Dynamo caches and counters.

- original: the harness's own prefill/decode, eagerly; the baseline.
- adapted:  model.prefill eagerly, then Decode through backend.compile(model.decode).
  Step 0 is the warm-up (compile); every later step runs under the "fail_on_recompile"
  stance so a recompile is an event we see, not a silent slowdown (lesson 2).
- adapted with --batch-buckets: the batch-bucket sweep instead (runners/verify/batch_buckets.py): the
  prompt padded to each bucket, its real rows checked against the unpadded run's logits.

On the adapted side the addresses of the tensors the model holds are watched from the warm-up on
(runners/verify/static_addresses.py), and on CUDA what CUDA graph trees capture, replay and decline
(runners/measure/cuda_graphs.py): what a capture/replay backend needs that the tokens do not show.

Greedy choice and logits copies happen outside the timed regions. Every Decode step gets
a fresh (B, 1) token tensor from argmax: a (1, 1) slice of a growing tensor changes stride
every step and makes Dynamo recompile (lesson 3).
"""
from __future__ import annotations

import time

STARTED = time.perf_counter()  # at this module's import, before torch's: the worker's own clock

import argparse
import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from graphmode.runners.backends import Backend, resolve
from graphmode.runners.evidence.line_trace import lines_run
from graphmode.runners.harness import describe_exception, load_harness, max_seq_len, next_token_logits, \
    require_entry_points, size_static_path, static_length
from graphmode.runners.measure.cuda_graphs import CudaGraphWatch
from graphmode.runners.measure.decode_graph import capture_decode, inductor_kernels_after, inductor_kernels_before
from graphmode.runners.measure.dynamo_watch import CompileWatch, SourceReason, explain_breaks, model_files, \
    short_path
from graphmode.runners.measure.env_info import environment
from graphmode.runners.measure.memory import peak_memory
from graphmode.runners.measure.timing import timed
from graphmode.runners.measure.traffic import config_traffic, read_config
from graphmode.runners.run_settings import parse_buckets
from graphmode.runners.verify.batch_buckets import run_sweep
from graphmode.runners.verify.results import WorkerResult
from graphmode.runners.verify.static_addresses import AddressWatch
from graphmode.runners.workers.common import WorkerFailure, call_user, run_main

SIDES = ("original", "adapted")


@dataclass
class Trace:
    """What one side produced, before it is written out."""
    logits: list[torch.Tensor] = field(default_factory=list)  # (B, V) per call: Prefill, then each step
    tokens: list[torch.Tensor] = field(default_factory=list)  # (B, 1) fed to each Decode step
    decode_ms: list[float] = field(default_factory=list)
    prefill_ms: float = 0.0
    generation: "Generation | None" = None
    last_decode: tuple[torch.Tensor, Any] | None = None  # original side: the last step's (token, state), to count it

    def keep_logits(self, logits: torch.Tensor) -> torch.Tensor:
        # A copy: a CUDA-graph replay overwrites its output buffers on the next call.
        kept = logits.detach().float().cpu().clone()
        self.logits.append(kept)
        return kept

    def next_token(self, device: torch.device | str) -> torch.Tensor:
        # argmax allocates a new contiguous (B, 1) tensor: a stride Dynamo sees every step.
        token = self.logits[-1].argmax(-1, keepdim=True).to(device)
        self.tokens.append(token.cpu())
        return token


def run_original(harness: ModuleType, model: torch.nn.Module, prompt: torch.Tensor,
                 steps: int, backend: Backend, folder: Path) -> Trace:
    trace = Trace()
    (logits, state), seconds = call_user("harness.prefill", folder, lambda: timed(
        lambda: harness.prefill(model, prompt), backend.synchronize))
    trace.prefill_ms = seconds * 1e3
    trace.keep_logits(logits)
    for _ in range(steps):
        token = trace.next_token(prompt.device)
        trace.last_decode = (token, state)
        (logits, state), seconds = call_user("harness.decode", folder, lambda: timed(
            lambda: harness.decode(model, token, state), backend.synchronize))
        trace.decode_ms.append(seconds * 1e3)
        trace.keep_logits(logits)
    trace.generation = call_user("harness.prefill/decode (timed generation)", folder, lambda: timed_generation(
        lambda: harness.prefill(model, prompt),
        lambda token, state, step: harness.decode(model, token, state), prompt, steps, backend))
    return trace


@dataclass
class Generation:
    """One whole greedy generation, warm, timed end to end by one wall clock."""
    seconds: float           # Prefill + every Decode step + the greedy choices between them
    new_tokens: int          # per sequence: one from Prefill, one from each Decode step
    tokens: list[list[int]]  # (B, new_tokens) greedy tokens; the first `steps` must equal the trace's


def timed_generation(prefill: Callable[[], tuple[torch.Tensor, Any]],
                     decode: Callable[[torch.Tensor, Any, int], tuple[torch.Tensor, Any]],
                     prompt: torch.Tensor, steps: int, backend: Backend) -> Generation:
    """Prefill then `steps` Decode steps, as a user's loop runs them, after the first pass has
    warmed everything up (graph side: compiled). prefill() -> (logits, state); decode(token, state,
    step) -> (logits, state); logits are (B, V) next-token logits."""
    chosen: list[torch.Tensor] = []

    def loop() -> None:
        logits, state = prefill()
        for step in range(steps):
            token = logits.argmax(-1, keepdim=True)
            chosen.append(token)
            # .clone(): a CUDA-graph replay overwrites its outputs on the next call.
            logits, state = decode(token.clone(), state, step)
        chosen.append(logits.argmax(-1, keepdim=True))

    _, seconds = timed(loop, backend.synchronize)
    return Generation(seconds=seconds, new_tokens=steps + 1, tokens=torch.cat(chosen, dim=1).cpu().tolist())


def _is_stance_recompile(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and "fail_on_recompile" in str(exc)


@dataclass
class AdaptedRun:
    trace: Trace
    graph_breaks: int
    break_reasons: list[SourceReason]
    fullgraph: bool
    explain_s: float
    warmup_s: float
    graphs_at_warmup: int
    graphs_after_warmup: int
    recompiles: list[SourceReason]
    recompile_limit_hit: bool
    stance_failures: list[str]
    decode_lines: dict[str, list[int]] = field(default_factory=dict)  # lines of the sources one Decode runs
    inductor_kernels: int | None = None  # kernels Inductor generated compiling Decode (counted when asked)
    # runners.verify.static_addresses.AddressWatch.record(), and runners.measure.cuda_graphs.CudaGraphWatch.record() ({}
    # on CPU).
    static_addresses: dict[str, Any] = field(default_factory=dict)
    cuda_graphs: dict[str, Any] = field(default_factory=dict)


def run_adapted(model: torch.nn.Module, prompt: torch.Tensor, steps: int,
                backend: Backend, folder: Path, compile_cache: str | None = None,
                count_kernels: bool = False) -> AdaptedRun:
    require_entry_points(model, f"is {folder} an adapted folder?")
    device = prompt.device
    prompt_len = prompt.shape[1]
    prefill_pos = torch.arange(prompt_len, device=device)
    trace = Trace()
    out, seconds = call_user("model.prefill", folder, lambda: timed(
        lambda: model.prefill(prompt, prefill_pos), backend.synchronize))
    trace.prefill_ms = seconds * 1e3
    trace.keep_logits(next_token_logits(out))
    first_token = trace.logits[-1].argmax(-1, keepdim=True).to(device)

    # The line trace and explain() each really run Decode once at position T, writing the cache
    # at T. That is harmless: Decode at T reads positions 0..T only, 0..T-1 hold Prefill's values,
    # and T is rewritten (before it is read) by the real step 0, which has the same token and
    # position. Prefill is re-run anyway so models with extra Prefill-written state start
    # step 0 from exactly what Prefill left; it rewrites the same values, so the logits
    # recorded above stay valid.
    probe_pos = torch.tensor([prompt_len], device=device)
    # One eager step under a line tracer: which lines of the sources Decode runs, for sorting the
    # findings left for a person.
    _, decode_lines = call_user("model.decode (line trace)", folder, lambda: lines_run(
        lambda: model.decode(first_token.clone(), probe_pos), folder))
    started = time.perf_counter()
    # Where the model's code lies outside the folder (transformers' modeling file), a break inside library code is
    # named at the model's own line that reached it.
    own = model_files(model)
    graph_breaks, break_reasons = call_user("torch._dynamo.explain(model.decode)", folder, lambda: explain_breaks(
        model.decode, first_token.clone(), probe_pos, root=folder, own=own))
    explain_s = time.perf_counter() - started
    call_user("model.prefill", folder, lambda: model.prefill(prompt, prefill_pos))

    fullgraph = graph_breaks == 0
    compiled = backend.compile(model.decode, fullgraph=fullgraph, compile_cache=compile_cache)
    step_fn: Callable[..., Any] = compiled
    stance = "fail_on_recompile"
    stance_failures: list[str] = []
    limit_hit_raised = False
    warmup_s = 0.0
    graphs_at_warmup = 0
    inductor_kernels = None
    # The tensors the model holds must stay where the warm-up left them (runners.verify.static_addresses); on CUDA, what
    # CUDA graph trees captured and replayed (runners.measure.cuda_graphs).
    addresses = AddressWatch(model)
    graphs = CudaGraphWatch() if device.type == "cuda" else None
    with CompileWatch(root=folder, own=own) as watch, graphs or contextlib.nullcontext():
        for step in range(steps):
            token = trace.next_token(device)
            input_pos = torch.tensor([prompt_len + step], device=device)

            def call() -> tuple[Any, float]:
                return timed(lambda: step_fn(token, input_pos), backend.synchronize)

            if step == 0:
                if count_kernels:
                    inductor_kernels_before()
                out, seconds = call_user("compiled model.decode (warm-up)", folder, call)
                inductor_kernels = inductor_kernels_after() if count_kernels else None
                warmup_s = seconds
                graphs_at_warmup = watch.graphs
                watch.mark()  # from here on, every compiled graph is a recompile
                addresses.start()
            else:
                try:
                    with torch.compiler.set_stance(stance):
                        out, seconds = call()
                except torch._dynamo.exc.FailOnRecompileLimitHit:
                    # fullgraph=True turns the limit into an error on every later call:
                    # finish eagerly so the tokens can still be compared.
                    limit_hit_raised = True
                    step_fn = model.decode
                    out, seconds = call_user("model.decode", folder, call)
                except RuntimeError as exc:
                    if not _is_stance_recompile(exc):
                        raise WorkerFailure(
                            f"compiled model.decode raised {describe_exception(exc, folder)}") from exc
                    # The stance refuses before the frame runs, so the step can be retried;
                    # the retry compiles, and the watch logs the guard that failed. (With
                    # graph breaks, earlier frames of this step did run; re-running them
                    # rewrites the same cache positions with the same values.)
                    stance_failures.append(" ".join(str(exc).split()))
                    stance = "default"
                    out, seconds = call_user("compiled model.decode", folder, call)
            trace.decode_ms.append(seconds * 1e3)
            trace.keep_logits(next_token_logits(out))
            if step:
                addresses.check(f"Decode step {step}")

        def generation_step(token: torch.Tensor, state: None, step: int) -> tuple[torch.Tensor, None]:
            input_pos = torch.tensor([prompt_len + step], device=device)
            with torch.compiler.set_stance(stance):
                return next_token_logits(step_fn(token, input_pos)), None

        trace.generation = call_user("model.prefill/compiled model.decode (timed generation)", folder,
                                     lambda: timed_generation(
                                         lambda: (next_token_logits(model.prefill(prompt, prefill_pos)), None),
                                         generation_step, prompt, steps, backend))
        addresses.check("the timed generation (Prefill again, then every Decode step)")
    return AdaptedRun(
        trace=trace, graph_breaks=graph_breaks, break_reasons=break_reasons,
        fullgraph=fullgraph, explain_s=explain_s, warmup_s=warmup_s,
        graphs_at_warmup=graphs_at_warmup, graphs_after_warmup=watch.graphs,
        recompiles=watch.recompiles, recompile_limit_hit=watch.limit_hit or limit_hit_raised,
        stance_failures=stance_failures, decode_lines=decode_lines, inductor_kernels=inductor_kernels,
        static_addresses=addresses.record(), cuda_graphs=graphs.record() if graphs else {})


def _reason_text(reason: SourceReason) -> str:
    """"guard (file:line `its code`, inside library:line)": the construct behind the guard, where the log names it."""
    where = f"{short_path(reason.file)}:{reason.line}" if reason.line is not None else reason.file
    where += f" `{reason.code}`" if where and reason.code else ""
    where += f", inside {reason.inside}" if where and reason.inside else ""
    return f"{reason.reason} ({where})" if where else reason.reason


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m graphmode.runners.workers.verify_worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--backend", default="auto",
                        help="the adapted side compiles with it; the original side only takes its device")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--logits", type=Path)
    parser.add_argument("--compile-log", type=Path,
                        help="write Dynamo's graph_breaks and recompiles log records here (enable them with "
                             "TORCH_LOGS=graph_breaks,recompiles)")
    parser.add_argument("--batch-buckets", type=_buckets_arg, metavar="1,2,4",
                        help="adapted side: run the batch-bucket sweep instead, writing its record to --out")
    parser.add_argument("--reference", type=Path,
                        help="with --batch-buckets: the unpadded graph run's logits (its --logits file)")
    parser.add_argument("--npu-compile-cache", metavar="DIR|off",
                        help="adapted side: the folder for the backend's own compile cache (torch_npu's cache_compile "
                             "on the NPU backends; the others ignore it)")
    parser.add_argument("--count-ops", action="store_true",
                        help="count what one Decode step does on its captured graph(s), after the timed steps: "
                             "ops, ops per layer, bytes moved, Inductor's kernels (the record's decode_graph)")
    parser.add_argument("--static-length", type=int, metavar="N",
                        help="positions the adapted model's static path is set up for (default: the harness's "
                             "MAX_SEQ_LEN)")
    parser.add_argument("--partial-graph", action="store_true",
                        help="with --batch-buckets: compile with fullgraph=False (Decode has graph breaks)")
    return parser.parse_args(argv)


def _buckets_arg(text: str) -> list[int]:
    try:
        return parse_buckets(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def bucket_sweep(args: argparse.Namespace, backend: Backend, folder: Path, model: torch.nn.Module,
                 prompt: torch.Tensor) -> None:
    """The batch-bucket sweep in this fresh process; its record goes to --out."""
    if args.side != "adapted":
        raise WorkerFailure("--batch-buckets runs on the adapted side only")
    if args.reference is None:
        raise WorkerFailure("--batch-buckets needs --reference LOGITS.pt, the unpadded graph run's logits")
    reference = torch.load(args.reference)
    graphs = CudaGraphWatch() if backend.device == "cuda" else None
    with torch.inference_mode(), graphs or contextlib.nullcontext():
        sweep = run_sweep(model, prompt, args.batch_buckets, args.steps, backend, folder, reference,
                          fullgraph=not args.partial_graph)
    if graphs:
        sweep.cuda_graphs = graphs.record()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(sweep.to_dict(), indent=2))


# The artifact loggers behind TORCH_LOGS=graph_breaks,recompiles (torch 2.13), plus the
# recompile_limit warning. A handler on each sees its records even where propagation is off
# (CompileWatch turns it off for recompiles so they are not printed twice).
COMPILE_LOGGERS = ("torch._dynamo.symbolic_convert.__graph_breaks", "torch._dynamo.exc.__graph_breaks",
                   "torch._dynamo.convert_frame.__graph_breaks", "torch._dynamo.guards.__recompiles",
                   "torch._dynamo.convert_frame")


def _log_compiles_to(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s"))
    handler.setLevel(logging.DEBUG)
    with path.open("w", encoding="utf-8") as header:
        header.write(f"# TORCH_LOGS={os.environ.get('TORCH_LOGS', '')!r}; loggers: {', '.join(COMPILE_LOGGERS)}\n")
    handler.stream.close()
    handler.stream = path.open("a", encoding="utf-8")
    for name in COMPILE_LOGGERS:
        logging.getLogger(name).addHandler(handler)


def _inductor_based(backend: Backend) -> bool:
    return backend.compile_options(True).get("backend") == "inductor"


def model_config(model: torch.nn.Module) -> Any:
    """The model's config object where it keeps one the traffic estimate can read (Hugging Face's `config`, Meta's
    `params`, the `args` of ModelArgs-style code), else None."""
    for name in ("config", "args", "params"):
        config = getattr(model, name, None)
        if config is not None and read_config(config) is not None:
            return config
    return None


def count_decode(side: str, harness: ModuleType, model: torch.nn.Module, prompt: torch.Tensor, trace: Trace,
                 limit: int, folder: Path) -> dict[str, Any]:
    """The record's `decode_graph`: the last Decode step run again under the capture and counted. The original side
    runs the harness's own decode on the state the last step got; the adapted side, model.decode at the last
    step's position (rewriting the cache entry it wrote). A failure is recorded, not raised: the count is extra."""
    device = prompt.device
    last_position = prompt.shape[1] + len(trace.tokens) - 1
    try:
        with torch.inference_mode():
            if side == "original":
                token, state = trace.last_decode
                count = capture_decode(lambda t, s: harness.decode(model, t, s), (token, state), model)
            else:
                token = trace.tokens[-1].to(device)
                count = capture_decode(model.decode, (token, torch.tensor([last_position], device=device)), model)
    except Exception as exc:  # noqa: BLE001 - any failure of user code or of the capture; the run itself stands
        return {"error": describe_exception(exc, folder)}
    result = count.to_dict()
    result["inductor_kernels"] = None
    parameter = next(model.parameters(), None)
    # The KV length attention reads at the last step: the positions so far on the original side (its cache grows),
    # the whole static cache on the adapted side (the length `setup_caches` was given).
    kv_len = last_position + 1 if side == "original" else limit
    result["config_traffic"] = config_traffic(model_config(model), batch=prompt.shape[0], kv_len=kv_len,
                                              dtype_bytes=parameter.element_size() if parameter is not None else None)
    return result


def process_seconds() -> float | None:
    """Wall time since the OS started this process (interpreter start-up and imports included),
    from /proc (10 ms resolution); None where /proc is not there."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _checked_length(harness, prompt: torch.Tensor, steps: int) -> int:
    """The harness's MAX_SEQ_LEN, which the prompt and the steps must fit."""
    limit = max_seq_len(harness)
    if prompt.shape[1] + steps > limit:
        raise WorkerFailure(f"prompt ({prompt.shape[1]}) + steps ({steps}) exceeds the harness "
                            f"MAX_SEQ_LEN ({limit}); lower --steps or raise MAX_SEQ_LEN")
    return limit


def _check_generation(trace, steps: int) -> None:
    """The timed generation pass must choose the first pass's tokens."""
    generation = trace.generation
    if generation.tokens and [row[:steps] for row in generation.tokens] != torch.cat(trace.tokens, dim=1).tolist():
        raise WorkerFailure("the timed generation pass chose other tokens than the first pass of the same process "
                            "(state left over from the first pass?)")


def _record_compiled(result: WorkerResult, adapted) -> None:
    """What compiling the adapted Decode showed: breaks, recompiles, graphs, stance failures, static addresses."""
    result.graph_breaks = adapted.graph_breaks
    result.decode_lines = adapted.decode_lines
    result.break_reasons = [{"reason": r.reason, "file": r.file, "line": r.line, "function": r.function,
                              "code": r.code, "inside": r.inside} for r in adapted.break_reasons]
    result.recompiles = len(adapted.recompiles)
    result.recompile_reasons = [_reason_text(r) for r in adapted.recompiles]
    result.recompile_details = [r.to_dict() for r in adapted.recompiles]
    result.recompile_limit_hit = adapted.recompile_limit_hit
    result.fullgraph = adapted.fullgraph
    result.explain_s = adapted.explain_s
    result.graphs_at_warmup = adapted.graphs_at_warmup
    result.graphs_after_warmup = adapted.graphs_after_warmup
    result.stance_failures = adapted.stance_failures
    result.static_addresses = adapted.static_addresses
    result.cuda_graphs = adapted.cuda_graphs


def _run_side(args, harness, model, prompt: torch.Tensor, backend, folder):
    """(trace, compiled run or None): the original side runs eagerly; the adapted side compiles its Decode."""
    # inference_mode works with torch.compile on torch 2.13 (the tests compile under it).
    with torch.inference_mode():
        if args.side == "original":
            return run_original(harness, model, prompt, args.steps, backend, folder), None
        adapted = run_adapted(model, prompt, args.steps, backend, folder, args.npu_compile_cache,
                              count_kernels=args.count_ops and _inductor_based(backend))
        return adapted.trace, adapted


def _result(args, backend, model, prompt: torch.Tensor, limit: int, load_s: float, trace, adapted, memory: dict,
            decode_graph: dict) -> WorkerResult:
    """The side's record, without what only compiling shows (_record_compiled)."""
    parameter = next(model.parameters(), None)
    generation = trace.generation
    return WorkerResult(
        side=args.side,
        backend=backend.name if adapted else "eager",
        tokens=torch.cat(trace.tokens, dim=1).tolist(),
        prefill_ms=trace.prefill_ms,
        decode_ms=trace.decode_ms,
        warmup_s=adapted.warmup_s if adapted else trace.decode_ms[0] / 1e3,
        load_s=load_s,
        env=environment(backend.device),
        steps=args.steps,
        prompt_len=prompt.shape[1],
        max_seq_len=limit,
        recompile_limit=torch._dynamo.config.recompile_limit,
        batch=prompt.shape[0],
        model=f"{type(model).__module__}.{type(model).__qualname__}",
        dtype=str(parameter.dtype).removeprefix("torch.") if parameter is not None else "",
        generation_s=generation.seconds,
        new_tokens=generation.new_tokens,
        peak_rss_mb=memory["peak_rss_mb"],
        peak_device_mb=memory["peak_device_mb"],
        compile_options=backend.compile_options(adapted.fullgraph, args.npu_compile_cache) if adapted else {},
        decode_graph=decode_graph,
    )


def _decode_graph(args, harness, model, prompt: torch.Tensor, trace, adapted, folder) -> dict:
    """The Decode graph's ops (and inductor's kernels, counted while compiling)."""
    # After every timed step, every logit and the peak memory are recorded: the capture resets Dynamo and runs a
    # step again.
    found = count_decode(args.side, harness, model, prompt, trace, static_length(harness, args.static_length), folder)
    if adapted and "inductor_kernels" in found:
        found["inductor_kernels"] = adapted.inductor_kernels
    return found


def _record_process(result: WorkerResult) -> None:
    """The worker's own time, CPU time and the machine's load."""
    result.worker_s = time.perf_counter() - STARTED
    result.process_s = process_seconds()
    result.load_avg_1m = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result.cpu_count = os.cpu_count() or 0


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.steps < 1:
        raise WorkerFailure(f"--steps must be at least 1, got {args.steps}")
    backend, _ = resolve(args.backend)
    folder = args.folder.resolve()
    if args.compile_log:
        _log_compiles_to(args.compile_log)

    started = time.perf_counter()
    harness = load_harness(folder)
    model = call_user("harness.build_model", folder, harness.build_model).to(backend.device)
    load_s = time.perf_counter() - started
    prompt = call_user("harness.make_prompt", folder, harness.make_prompt).to(backend.device)
    limit = _checked_length(harness, prompt, args.steps)

    if args.side == "adapted":
        batch = max([prompt.shape[0], *(args.batch_buckets or [])])
        call_user("model.setup_caches", folder, lambda: size_static_path(model, harness, batch, args.static_length))
    if args.batch_buckets:
        bucket_sweep(args, backend, folder, model, prompt)
        return

    trace, adapted = _run_side(args, harness, model, prompt, backend, folder)
    _check_generation(trace, args.steps)
    memory = peak_memory(backend.device)
    decode_graph = _decode_graph(args, harness, model, prompt, trace, adapted, folder) if args.count_ops else {}
    result = _result(args, backend, model, prompt, limit, load_s, trace, adapted, memory, decode_graph)
    if adapted:
        _record_compiled(result, adapted)

    if args.logits:
        args.logits.parent.mkdir(parents=True, exist_ok=True)
        torch.save(torch.stack(trace.logits), args.logits)
    _record_process(result)  # last, so that it covers everything this process did but exit
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result.to_dict(), indent=2))


if __name__ == "__main__":
    raise SystemExit(run_main(main))
