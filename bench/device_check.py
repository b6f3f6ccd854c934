"""Capture and replay on a real accelerator: graphmode adapt under cudagraphs, with inductor_cuda as the control.

    python bench/device_check.py --out DIR [--budget-s 450] [--only MODEL,...] [--jobs N]
    python bench/device_check.py --out DIR --dry-run [--dry-backend aot_eager]   # the same on the CPU, tiny sizes

Runs `graphmode adapt --yes --backend cudagraphs` (one round, so a failure is reported, not repaired) on:

1. one model at a real shape, first and alone: examples/meta_llama's model.py at Llama-3.2-1B's sizes (dim 2048,
   16 layers, 32 heads, 8 key/value heads, FFN 8192, vocabulary 128256, rope theta 500000), bf16, random weights
   from one seed, prompt 128, 128 Decode steps, 3 runs, batch buckets 1,8. Decode is memory-bound at that size, so its
   times mean something. It is a harness folder this script writes: --hf reads weights from files or shrinks the
   config with --tiny, and neither gives full-size random weights; and its model is the Meta-reference file
   graphmode rewrites, so the capture runs graphmode's own rewrites, not transformers' static cache.
2. the three bundled examples (examples/legacy_llm, hf_cache_api, meta_llama) and `--hf llama --tiny`,
   `--hf qwen3 --tiny`: one run each, side by side (their times mean little; what they check is capture).

After each, the control: verify's graph-side worker under `inductor_cuda` (the same Inductor kernels, no CUDA graphs)
on the sources that adapt wrote, as many fresh processes as its runs, against its eager tokens. What cudagraphs gains
over the control is what capture/replay gives; what the control gains over eager is what Inductor's kernels give.

From each report.json it keeps the verdict, tokens, graph breaks, recompiles, the CUDA graphs captured, replayed and
declined (with Inductor's reasons), the held tensors whose address moved, Decode ms/token eager and graph (median
[min, max] over the fresh processes), peak device memory per side, the fusions' effect (the unfused third side) and the
batch buckets. It writes DIR/device_check.json after every target, DIR/device_check.md and DIR/device_check.log, with
the GPU, driver, CUDA, torch, transformers, triton and Python versions. Each target runs under its own time limit
within --budget-s (a model's control may use what its adapt left); one cut short keeps the figures of the verify
workers that finished (`workers`). The adapt runs' folders go to --work (default: a temporary folder outside DIR).

On a GPU machine without a network (Python 3.12, torch preinstalled), the packages graphmode needs travel as
wheels, listed in bench/device_wheels.txt. Here, in the repository's root (`.whl/` ignored through
.git/info/exclude):

    grep -v '^#' bench/device_wheels.txt | xargs python3 -m pip download --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl

and there, with `.whl` carried along:

    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && \
    export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-index --no-deps --no-build-isolation \
        --target /tmp/site . && PYTHONUNBUFFERED=1 python3 bench/device_check.py --out "$OUT/device-check"
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MIN_STEPS = 32  # the fewest Decode steps graphmode verifies (runners/run_settings.py)
GRAPH_BACKEND, CONTROL_BACKEND, DRY_BACKEND = "cudagraphs", "inductor_cuda", "inductor"
SHAPE = "llama-3.2-1b-shape"
# Llama-3.2-1B's sizes under examples/meta_llama's ModelArgs names. Its FeedForward rounds 2/3 of 4 * dim up to a
# multiple of `multiple_of`: 4096 gives Llama-3.2-1B's 8192 (its own config says ffn_dim_multiplier 1.5).
FULL_SIZES = {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256,
              "multiple_of": 4096, "norm_eps": 1e-5, "rope_theta": 500000.0}
DRY_SIZES = {"dim": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "multiple_of": 32,
             "norm_eps": 1e-5, "rope_theta": 10000.0}

SHAPE_HARNESS = '''"""examples/meta_llama's model at {what}, random weights, written by bench/device_check.py."""
import torch

from model import ModelArgs, Transformer

SOURCES = ["model.py"]
SIZES = {sizes!r}
DTYPE = torch.{dtype}
PROMPT_LEN = {prompt_len}
# Prompt plus every Decode step.
MAX_SEQ_LEN = {max_seq_len}


def build_model() -> torch.nn.Module:
    """On the CPU, as every harness hands its model over (graphmode's analysis runs it there; the workers move it),
    but drawn on a GPU where there is one: a full-size model's weights take a moment there and half a minute on a
    CPU, for each of the dozen processes that build it. Built in DTYPE from the start: tensors the model makes itself
    (its rotary table in float32 and complex64) keep their own dtypes, which a later .to(DTYPE) would cast."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    try:
        with torch.device(device):
            model = Transformer(ModelArgs(**SIZES, max_seq_len=MAX_SEQ_LEN, max_batch_size=1))
    finally:
        torch.set_default_dtype(default)
    generator = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:  # unit-scale activations: with 0.02 a random model's logits are nearly flat, and greedy tokens
                # would turn on bf16 rounding alone
                param.normal_(0.0, 1.0 if "embeddings" in name else param.shape[-1] ** -0.5, generator=generator)
    return model.cpu().eval()


def make_prompt() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, SIZES["vocab_size"], (1, PROMPT_LEN), generator=generator)


def prefill(model, tokens):
    logits = model(tokens, 0)
    return logits[:, -1, :], {{"pos": tokens.shape[1]}}


def decode(model, token, state):
    logits = model(token, state["pos"])
    return logits[:, -1, :], {{"pos": state["pos"] + 1}}
'''


@dataclass
class Target:
    id: str
    args: list[str]           # what names the model to `graphmode adapt`
    backend: str
    runs: int
    steps: int
    limit_s: float            # its own time limit (the budget left may cut it shorter)
    buckets: str | None = None
    # A control: no adapt of its own, but the verify worker's graph side under `backend`, `runs` fresh processes, on
    # the sources this other target adapted (the same code, so only the backend differs); eager is that target's.
    control_of: "Target | None" = None
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def run_folder(self) -> Path | None:
        return Path(self.record["run_folder"]) if self.record.get("run_folder") else None


def write_shape_target(work: Path, dry_run: bool) -> Path:
    """The real-shape target: examples/meta_llama/model.py beside a harness at Llama-3.2-1B's sizes (tiny and
    float32 in a dry run)."""
    folder = work / SHAPE
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(EXAMPLES / "meta_llama" / "model.py", folder / "model.py")
    prompt_len, steps = (16, MIN_STEPS) if dry_run else (128, 128)
    (folder / "harness.py").write_text(SHAPE_HARNESS.format(
        what="tiny sizes, float32 (the dry run)" if dry_run else "Llama-3.2-1B's sizes, bf16",
        sizes=DRY_SIZES if dry_run else FULL_SIZES, dtype="float32" if dry_run else "bfloat16",
        prompt_len=prompt_len, max_seq_len=prompt_len + steps))
    return folder


def stages(work: Path, dry_run: bool, dry_backend: str = DRY_BACKEND) -> list[list[list[Target]]]:
    """What runs, in order: stages one after another, each a list of chains run side by side, each chain a list of
    targets run one after another (a graph target, then its control)."""
    shape = write_shape_target(work, dry_run)
    tiny = [("legacy_llm", [str(EXAMPLES / "legacy_llm")]), ("hf_cache_api", [str(EXAMPLES / "hf_cache_api")]),
            ("meta_llama", [str(EXAMPLES / "meta_llama")]), ("hf-llama-tiny", ["--hf", "llama", "--tiny"]),
            ("hf-qwen3-tiny", ["--hf", "qwen3", "--tiny"])]
    if dry_run:
        # One backend for both sides and no time that matters: the same targets, one after another on the CPU.
        graph, control = dry_backend, dry_backend
        chains = [_pair(SHAPE, [str(shape)], graph, control, 1, MIN_STEPS, 1200, 1200, buckets="1,2")]
        chains += [_pair(name, args, graph, control, 1, MIN_STEPS, 1200, 1200) for name, args in tiny]
        return [[chain] for chain in chains]
    # The limits add up to the default budget (450 s): the real shape and its control first and alone (their times
    # are what the check is for), then the tiny models side by side.
    return [[_pair(SHAPE, [str(shape)], GRAPH_BACKEND, CONTROL_BACKEND, 3, 128, 260, 70, buckets="1,8")],
            [_pair(name, args, GRAPH_BACKEND, CONTROL_BACKEND, 1, MIN_STEPS, 90, 30) for name, args in tiny]]


def _pair(name: str, args: list[str], graph: str, control: str, runs: int, steps: int, graph_s: float,
          control_s: float, buckets: str | None = None) -> list[Target]:
    """A model's graph target (graphmode adapt) and its control; a chain's limits are shared: the control may use
    what the adapt left."""
    adapted = Target(f"{name}/{graph}", args, graph, runs, steps, graph_s, buckets)
    adapted.record.update(model=name, role="graph")
    check = Target(f"{name}/control-{control}", [], control, runs, steps, control_s, control_of=adapted)
    check.record.update(model=name, role="control")
    return [adapted, check]


# --- running ------------------------------------------------------------------------------------------------------

class Log:
    """Progress lines to stdout and to DIR/device_check.log, one writer at a time."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("w", encoding="utf-8")
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def __call__(self, line: str) -> None:
        text = f"[{time.monotonic() - self.started:6.1f}s] {line}"
        with self.lock:
            print(text, flush=True)
            self.file.write(text + "\n")
            self.file.flush()


def adapt_command(target: Target, out: Path, timeout_s: float) -> list[str]:
    command = [sys.executable, "-m", "graphmode.agent.cli", "adapt", *target.args, "--yes", "--backend", target.backend,
               "--runs", str(target.runs), "--steps", str(target.steps), "--rounds", "1", "--out", str(out),
               "--timeout", str(int(max(timeout_s, 30)))]
    return command + (["--batch-buckets", target.buckets] if target.buckets else [])


def run_target(target: Target, work: Path, limit: float, log: Log, compile_threads: int | None) -> None:
    record = target.record
    record.update(id=target.id, backend=target.backend, runs=target.runs, steps=target.steps,
                  buckets_asked=target.buckets, limit_s=round(limit, 1))
    if limit < 30:
        record.update(status="not run", error=f"{limit:.0f} s of the budget were left")
        log(f"{target.id}: not run, {limit:.0f} s of the budget left")
        return
    env = {key: value for key, value in os.environ.items() if key != "GRAPHMODE_CORES_LOCK"}
    env.update(PYTHONUNBUFFERED="1", GRAPHMODE_HOME=str(work / "home" / _slug(target.id)), COLUMNS="200")
    if compile_threads:
        # Side by side, each process's pool of compile workers gets its share of the cores.
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(compile_threads)
    log(f"{target.id}: started (limit {limit:.0f} s)")
    if target.control_of is not None:
        run_control(target, work, limit, log, env)
    else:
        run_adapt(target, work, limit, log, env)
    log(f"{target.id}: {record['status']} in {record.get('elapsed_s', 0):.0f} s")


def _slug(target_id: str) -> str:
    return target_id.replace("/", "-")


def _run(command: list[str], env: dict[str, str], limit: float, target: Target, log: Log,
         cwd: Path) -> tuple[int, list[str], bool]:
    """The command in a process group of its own, its lines logged; (exit status, lines, whether it was stopped at
    the limit)."""
    lines: list[str] = []
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    stopped = threading.Event()
    timer = threading.Timer(limit, _stop, (process, stopped))
    timer.start()
    try:
        for line in process.stdout:
            lines.append(line.rstrip())
            if line.strip():
                log(f"{target.id}: {line.rstrip()}")
        process.wait()
    finally:
        timer.cancel()
    return process.returncode, lines, stopped.is_set()


def run_adapt(target: Target, work: Path, limit: float, log: Log, env: dict[str, str]) -> None:
    record = target.record
    out = work / "runs" / _slug(target.id)
    shutil.rmtree(out, ignore_errors=True)
    command = adapt_command(target, out, limit)
    record["command"] = " ".join(command[1:])
    started = time.monotonic()
    status, lines, timed_out = _run(command, env, limit, target, log, work)
    record.update(elapsed_s=round(time.monotonic() - started, 1), exit_status=status)
    run_folder = next((p.parent for p in out.glob("*/design.md")), None)
    record["run_folder"] = str(run_folder) if run_folder else None
    report = next(out.glob("*/report.json"), None)
    if report is not None:
        record.update(summarise(json.loads(report.read_text())))
    else:
        # Cut short: what the verify workers that finished wrote (runners.verify.results.WorkerResult, in logs/).
        record["workers"] = summarise_workers(out)
    record["status"] = ("timed out" if timed_out else "verified" if status == 0 else
                        "failed" if report is not None else "error")
    if record["status"] != "verified":
        record["output_tail"] = lines[-15:]


def run_control(target: Target, work: Path, limit: float, log: Log, env: dict[str, str]) -> None:
    """The graph side of verify under the control backend, `runs` fresh processes, on the sources the graph target
    adapted (its adapted/), sharing one compile cache: Decode ms/token, tokens against the graph target's eager run,
    breaks, recompiles, peak memory, moved addresses and (none expected) CUDA graphs."""
    record, source = target.record, target.control_of
    folder = source.run_folder / "adapted" if source.run_folder else None
    eager = next(iter(sorted(source.run_folder.glob("logs/original.json"))), None) if source.run_folder else None
    if folder is None or not (folder / "harness.py").is_file() or eager is None:
        record.update(status="not run", error=f"{source.id} left no adapted sources and eager run to time against")
        return
    reference = json.loads(eager.read_text())
    out = work / "runs" / _slug(target.id)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(out / "compile-cache"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    started, runs, problems = time.monotonic(), [], []
    record["command"] = (f"-m graphmode.runners.workers.verify_worker --side adapted --folder {folder} "
                         f"--steps {target.steps} --backend {target.backend} (x{target.runs})")
    for run in range(target.runs):
        left = limit - (time.monotonic() - started)
        if left < 10:
            problems.append(f"run {run + 1} not started: the limit was reached")
            break
        result = out / f"adapted.run{run + 1}.json"
        command = [sys.executable, "-m", "graphmode.runners.workers.verify_worker", "--side", "adapted",
                   "--folder", str(folder), "--steps", str(target.steps), "--backend", target.backend,
                   "--out", str(result), "--npu-compile-cache", "off"]
        status, lines, timed_out = _run(command, env, left, target, log, work)
        if status != 0 or not result.is_file():
            problems.append(f"run {run + 1}: " + ("timed out" if timed_out else " / ".join(lines[-3:])))
            break
        runs.append(json.loads(result.read_text()))
    record.update(elapsed_s=round(time.monotonic() - started, 1), run_folder=str(out))
    figures = [_worker_figures(r) for r in runs]
    tpots = [f["tpot_ms"] for f in figures]
    eager_tpot = source.record.get("tpot_ms", {}).get("eager") or [_worker_figures(reference)["tpot_ms"]] * 3
    record.update(
        runs_done=len(runs),
        tokens_equal=all(r["tokens"] == reference["tokens"] for r in runs) if runs else None,
        graph_breaks=max((r.get("graph_breaks", 0) for r in runs), default=None),
        recompiles=max((r.get("recompiles", 0) for r in runs), default=None),
        tpot_ms={"eager": eager_tpot, "graph": [statistics.median(tpots), min(tpots), max(tpots)] if tpots else None},
        peak_device_mb={"eager": (source.record.get("peak_device_mb") or {}).get("eager"),
                        "graph": _spread([f["peak_device_mb"] for f in figures])},
        warmup_s=_spread([f["warmup_s"] for f in figures]),
        addresses_moved={"graph": [f["addresses_moved"] or [] for f in figures]},
        cuda_graphs={"graph": [f["cuda_graphs"] for f in figures]} if any(f["cuda_graphs"] for f in figures) else {},
        problems=problems)
    if runs and not record["tokens_equal"]:
        problems.append("tokens differ from the graph target's eager run")
    if any(record["addresses_moved"]["graph"]):
        problems.append("held tensors changed address after warm-up")
    ok = runs and len(runs) == target.runs and not problems and not record["graph_breaks"] and not record["recompiles"]
    record["status"] = "verified" if ok else "failed" if runs else "error"


def _spread(values: list[float | None]) -> list[float] | None:
    known = [v for v in values if v is not None]
    return [statistics.median(known), min(known), max(known)] if known else None


def _stop(process: subprocess.Popen, stopped: threading.Event) -> None:
    """The target's time is up: its whole process group (adapt and its workers) is ended."""
    stopped.set()
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait or None)
            return
        except subprocess.TimeoutExpired:
            continue


# --- what report.json says ----------------------------------------------------------------------------------------

def _stats(figure: dict[str, Any] | None) -> list[float] | None:
    """[median, min, max] of a report figure, or None."""
    if not figure or figure.get("median") is None:
        return None
    return [figure["median"], figure["min"], figure["max"]]


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the device check compares, from one report.json (docs/workflow.md names every field)."""
    figures = report.get("figures", {})
    capture = report.get("capture", {})
    graphs = capture.get("cuda_graphs", {})
    fusion = report.get("fusion") or {}
    variables = report.get("variables", {})
    return {
        "passed": report.get("passed"),
        "tokens_equal": report.get("tokens_equal"),
        "tokens_differing": report.get("tokens_differing"),
        "logits_max_abs_diff": report.get("logits_max_abs_diff"),
        "graph_breaks": report.get("graph_breaks"),
        "recompiles": report.get("recompiles"),
        "problems": report.get("problems", []),
        "tpot_ms": {side: _stats(figures.get(side, {}).get("tpot_ms")) for side in ("eager", "graph")},
        "decode_speedup": _stats(report.get("decode_speedup_range")),
        "decode_speedup_unstable": report.get("decode_speedup_unstable"),
        "warmup_s": _stats(figures.get("graph", {}).get("warmup_s")),
        "peak_device_mb": {side: _stats(figures.get(side, {}).get("peak_device_mb")) for side in ("eager", "graph")},
        "fusion": {"applied": fusion.get("applied"), "decode_ms": fusion.get("decode_ms"),
                   "speedup": fusion.get("speedup"), "ops_per_step": fusion.get("ops_per_step"),
                   "inductor_kernels": fusion.get("inductor_kernels")} if fusion else {},
        "cuda_graphs": {side: [_graph_counts(r) for r in runs] if isinstance(runs, list) else _graph_counts(runs)
                        for side, runs in graphs.items()},
        "addresses_moved": {side: [r.get("moved", []) for r in runs]
                            for side, runs in capture.get("static_addresses", {}).items()},
        "addresses_watched": max((r.get("tensors", 0) for runs in capture.get("static_addresses", {}).values()
                                  for r in runs), default=None),
        "batch_buckets": [{key: b.get(key) for key in ("bucket", "captures", "graphs_after_warmup", "decode_ms_median",
                                                       "peak_device_mb", "tokens_equal", "logits_max_abs_diff")}
                          for b in report.get("batch_buckets", [])],
        "variables": {key: variables.get(key) for key in ("model_classes", "dtype", "device", "batch", "prompt_len",
                                                          "decode_steps", "max_seq_len", "backend_options")},
    }


def summarise_workers(out: Path) -> dict[str, Any]:
    """Per side ("adapted", "original", "unfused"), each finished run's own figures (_worker_figures), and whether
    graph run 1 chose eager run 1's tokens."""
    sides: dict[str, Any] = {}
    tokens: dict[str, Any] = {}
    for path in sorted(out.glob("*/logs/*.json")):
        side = path.name.split(".")[0]
        if side not in ("adapted", "original", "unfused") or path.name.count(".") > 2:
            continue
        try:
            worker = json.loads(path.read_text())
            figures = _worker_figures(worker)
        except (OSError, ValueError, KeyError, statistics.StatisticsError):
            continue
        tokens.setdefault(side, worker.get("tokens"))
        sides.setdefault(side, []).append({"run": path.name, **figures})
    if "adapted" in tokens and "original" in tokens:
        sides["tokens_equal"] = tokens["adapted"] == tokens["original"]
    return sides


def _worker_figures(worker: dict[str, Any]) -> dict[str, Any]:
    """One verify worker's record: Decode ms/token (median of the steps after warm-up), warm-up, graph breaks,
    recompiles, peak device memory, CUDA graphs and moved addresses."""
    steady = worker["decode_ms"][1:] or worker["decode_ms"]
    return {"tpot_ms": statistics.median(steady), "warmup_s": worker.get("warmup_s"),
            "graph_breaks": worker.get("graph_breaks"), "recompiles": worker.get("recompiles"),
            "peak_device_mb": worker.get("peak_device_mb"), "dtype": worker.get("dtype"),
            "cuda_graphs": _graph_counts(worker["cuda_graphs"]) if worker.get("cuda_graphs") else {},
            "addresses_moved": (worker.get("static_addresses") or {}).get("moved")}


def _graph_counts(record: dict[str, Any]) -> dict[str, Any]:
    return {key: record.get(key) for key in ("captures", "replays", "warmup_runs", "captures_after_first_replay",
                                             "skips", "skip_reasons", "unavailable")}


def comparisons(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model: eager, the control's Decode (Inductor's kernels alone) and the graph target's (with capture/replay),
    ms/token medians, and what each step gives."""
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for record in records:
        if (record.get("tpot_ms") or {}).get("graph") and record.get("role"):
            by_model.setdefault(record["model"], {})[record["role"]] = record
    rows = []
    for model, sides in by_model.items():
        if set(sides) != {"graph", "control"} or not sides["graph"]["tpot_ms"].get("eager"):
            continue
        eager = sides["graph"]["tpot_ms"]["eager"][0]
        kernels, graphs = sides["control"]["tpot_ms"]["graph"][0], sides["graph"]["tpot_ms"]["graph"][0]
        rows.append({"model": model, "backends": {role: sides[role]["backend"] for role in sides},
                     "eager_ms": eager, "control_ms": kernels, "graph_ms": graphs,
                     "inductor_kernels_speedup": eager / kernels, "capture_replay_speedup": kernels / graphs,
                     "total_speedup": eager / graphs, "runs": {role: sides[role]["runs"] for role in sides}})
    return rows


# --- the environment ----------------------------------------------------------------------------------------------

def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "cpu_count": os.cpu_count(), "torch": torch.__version__, "cuda_runtime": torch.version.cuda}
    for package in ("transformers", "triton"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   gpu_capability=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count())
    env["driver"] = _nvidia_smi("driver_version")
    env["graphmode_commit"] = _git("rev-parse", "HEAD")
    return env


def _nvidia_smi(field_name: str) -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={field_name}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


# --- writing ------------------------------------------------------------------------------------------------------

def write(out: Path, summary: dict[str, Any]) -> None:
    try:
        text = markdown(summary)
    except Exception as error:  # noqa: BLE001 - the JSON is written whatever the summary's drawing does
        text = f"# Device check\n\nThe summary could not be drawn ({type(error).__name__}: {error}); see the JSON.\n"
    for name, text in (("device_check.json", json.dumps(summary, indent=2) + "\n"), ("device_check.md", text)):
        partial = out / f".{name}.partial"
        partial.write_text(text, encoding="utf-8")
        partial.replace(out / name)


def _ms(stats: list[float] | None, digits: int = 3) -> str:
    if not stats:
        return "n/a"
    median, low, high = stats
    return f"{median:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _graphs_cell(record: dict[str, Any]) -> str:
    runs = record.get("cuda_graphs", {}).get("graph")
    if not runs:
        return "-"
    return ", ".join(f"{r['captures']}/{r['replays']}/{r['skips']}" for r in runs)


def markdown(summary: dict[str, Any]) -> str:
    env = summary["environment"]
    lines = [f"# Device check ({summary['mode']})", "",
             f"{env.get('gpu') or 'no GPU'}, driver {env.get('driver') or 'n/a'}, CUDA {env.get('cuda_runtime')}; "
             f"torch {env['torch']}, transformers {env['transformers']}, triton {env['triton']}, "
             f"Python {env['python']}; "
             f"{env['cpu_count']} CPUs; graphmode {env.get('graphmode_commit') or 'n/a'}.",
             f"Started {summary['started']}, {summary['elapsed_s']:.0f} s of a {summary['budget_s']:.0f} s budget.", "",
             "Captures/replays/skips: CUDA graphs per graph run (cudagraphs only). Moved: held tensors whose address "
             "changed after warm-up. Decode ms/token: median [min, max] over the runs.", "",
             "| Target | Status | Tokens equal | Breaks | Recompiles | Captures/replays/skips | Moved | "
             "Eager ms/token | Graph ms/token | Speed-up | Fusions with / without (ms) | Peak MiB eager / graph |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["targets"]:
        moved = sum(len(m) for runs in r.get("addresses_moved", {}).values() for m in runs)
        fusion = r.get("fusion") or {}
        fused = (f"{fusion['decode_ms']['with']:.3f} / {fusion['decode_ms']['without']:.3f}"
                 if fusion.get("decode_ms") and fusion["decode_ms"].get("without") else "-")
        peak = r.get("peak_device_mb") or {}
        peaks = " / ".join(f"{p[0]:.0f}" if p else "n/a" for p in (peak.get("eager"), peak.get("graph")))
        speed = _ms(r.get("decode_speedup"), 2) + (" (unstable)" if r.get("decode_speedup_unstable") else "")
        lines.append(f"| {r['id']} | {r.get('status', 'not run')} | {r.get('tokens_equal', 'n/a')} | "
                     f"{r.get('graph_breaks', 'n/a')} | {r.get('recompiles', 'n/a')} | {_graphs_cell(r)} | "
                     f"{moved if 'addresses_moved' in r else 'n/a'} | {_ms((r.get('tpot_ms') or {}).get('eager'))} | "
                     f"{_ms((r.get('tpot_ms') or {}).get('graph'))} | {speed} | {fused} | {peaks} |")
    if summary["comparisons"]:
        lines += ["", "## What capture/replay gives, apart from Inductor's kernels", "",
                  "| Model | Eager ms | control ms | graph ms | "
                  "Inductor's kernels (eager / control) | Capture/replay (control / graph) |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {c['model']} | {c['eager_ms']:.3f} | {c['control_ms']:.3f} | {c['graph_ms']:.3f} | "
                  f"{c['inductor_kernels_speedup']:.2f}x | {c['capture_replay_speedup']:.2f}x |"
                  for c in summary["comparisons"]]
    buckets = [(r["id"], b) for r in summary["targets"] for b in r.get("batch_buckets", [])]
    if buckets:
        lines += ["", "## Batch buckets", "", "| Target | Bucket | Captures | Decode ms | Peak MiB | Tokens equal |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {target} | {b['bucket']} | {b['captures']} | {b['decode_ms_median']:.3f} | "
                  f"{'n/a' if b['peak_device_mb'] is None else round(b['peak_device_mb'])} | "
                  f"{b['tokens_equal']} |" for target, b in buckets]
    cut = [r for r in summary["targets"] if r.get("workers")]
    if cut:
        lines += ["", "## Cut short: the verify workers that finished", ""]
        for r in cut:
            sides = "; ".join(f"{side} " + ", ".join(f"{w['tpot_ms']:.3f}" for w in runs) + " ms/token"
                              for side, runs in r["workers"].items() if isinstance(runs, list))
            if "tokens_equal" in r["workers"]:
                sides += f"; graph run 1's tokens equal eager run 1's: {r['workers']['tokens_equal']}"
            graphs = [w["cuda_graphs"] for w in r["workers"].get("adapted", []) if w["cuda_graphs"]]
            counted = (" (captures/replays/skips " + ", ".join(f"{g['captures']}/{g['replays']}/{g['skips']}"
                                                               for g in graphs) + ")") if graphs else ""
            lines.append(f"- {r['id']} ({r.get('status')}): {sides}{counted}")
    said = [(r["id"], r) for r in summary["targets"] if r.get("problems") or r.get("error") or r.get("output_tail")]
    if said:
        lines += ["", "## Problems", ""]
        for target, r in said:
            for problem in r.get("problems", [])[:5] or [r.get("error") or " / ".join(r.get("output_tail", [])[-3:])]:
                lines.append(f"- {target}: {problem}")
    skips = {reason["reason"] for r in summary["targets"] for runs in r.get("cuda_graphs", {}).values()
             for run in (runs if isinstance(runs, list) else [runs]) for reason in run.get("skip_reasons") or []}
    if skips:
        lines += ["", "## Why Inductor declined to capture", ""] + [f"- {reason}" for reason in sorted(skips)]
    return "\n".join(lines) + "\n"


# --- main ---------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where device_check.json, .md and .log go (flat)")
    parser.add_argument("--work", type=Path, help="the adapt runs' folders (default: a temporary folder)")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU: --backend inductor, tiny sizes, one run each")
    parser.add_argument("--dry-backend", default=DRY_BACKEND,
                        help="the dry run's backend (default inductor; aot_eager skips code generation: the test of "
                             "this script uses it to stay within CI's time)")
    parser.add_argument("--budget-s", type=float,
                        help="all targets together (default: 450 s on a GPU, 3600 s in a dry run)")
    parser.add_argument("--only", help="comma-separated models (legacy_llm, llama-3.2-1b-shape, ...) or target ids; "
                                       "a model's control comes with its graph target")
    parser.add_argument("--jobs", type=int, help="models run side by side in a stage (the real shape's stages hold "
                                                   "one); default: 10 on a GPU, 1 in a dry run")
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (1 if args.dry_run else 10)
    args.budget_s = args.budget_s or (3600.0 if args.dry_run else 450.0)
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "device_check.log")
    work = args.work or Path(tempfile.mkdtemp(prefix="graphmode-device-check-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = stages(work, args.dry_run, args.dry_backend)
    if args.only:
        wanted = set(args.only.split(","))
        plan = [[chain for chain in stage if any(t.id in wanted or t.record["model"] in wanted for t in chain)]
                for stage in plan]
        plan = [stage for stage in plan if stage]
    chosen = [t for stage in plan for chain in stage for t in chain]
    summary: dict[str, Any] = {"mode": f"dry run (CPU, {args.dry_backend}, tiny sizes)" if args.dry_run else "GPU",
                               "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "budget_s": args.budget_s, "elapsed_s": 0.0, "work": str(work),
                               "environment": environment(), "targets": [t.record for t in chosen], "comparisons": []}
    for t in chosen:
        t.record.update(id=t.id, status="not run")
    lock = threading.Lock()
    started = time.monotonic()

    def finished() -> None:
        with lock:
            summary["elapsed_s"] = time.monotonic() - started
            summary["comparisons"] = comparisons([t.record for t in chosen])
            write(args.out, summary)

    def chain_of(targets: list[Target], compile_threads: int | None) -> None:
        # A chain's targets share its limits: each may use its own and what the ones before it left.
        chain_deadline = min(deadline, time.monotonic() + sum(t.limit_s for t in targets))
        for i, target in enumerate(targets):
            later = sum(t.limit_s for t in targets[i + 1:])
            limit = min(chain_deadline - later, deadline) - time.monotonic()
            try:
                run_target(target, work, limit, log, compile_threads)
            except Exception as error:  # noqa: BLE001 - one target's failure never stops the others
                target.record.update(status="error", error=f"{type(error).__name__}: {error}")
                log(f"{target.id}: error: {error}")
            finished()

    log(f"{len(chosen)} target(s), work folder {work}, budget {args.budget_s:.0f} s")
    finished()
    for stage in plan:
        side_by_side = min(len(stage), args.jobs)
        threads = max(1, (os.cpu_count() or 1) // side_by_side) if side_by_side > 1 else None
        with ThreadPoolExecutor(max_workers=side_by_side) as pool:
            list(pool.map(lambda chain: chain_of(chain, threads), stage))
    finished()
    log(f"done in {time.monotonic() - started:.0f} s: "
        + ", ".join(f"{t.id} {t.record.get('status')}" for t in chosen))
    return 0 if all(t.record.get("status") == "verified" for t in chosen) else 1


if __name__ == "__main__":
    raise SystemExit(main())
