"""Capture and replay on a real accelerator: graphmode adapt under cudagraphs, with inductor_cuda as the control.

    python bench/device_check.py --out DIR [--budget-s 440] [--only ID,...] [--jobs N]
    python bench/device_check.py --out DIR --dry-run    # the same steps on the CPU, inductor, tiny sizes (CI)

Runs `graphmode adapt --yes` (one round, so a failure is reported, not repaired) on:

1. the three bundled examples (examples/legacy_llm, hf_cache_api, meta_llama) and `--hf llama --tiny`,
   `--hf qwen3 --tiny`: one run each, side by side (their timings mean little; what they check is capture);
2. one model at a real shape, alone: examples/meta_llama's model.py at Llama-3.2-1B's sizes (dim 2048, 16 layers,
   32 heads, 8 key/value heads, FFN 8192, vocabulary 128256, rope theta 500000), bf16, random weights drawn on the
   device from one seed, prompt 128, 128 Decode steps, 3 runs, batch buckets 1,8 under cudagraphs. Decode is
   memory-bound at that size, so its times mean something. It is a harness folder this script writes (--hf reads
   weights from files or shrinks the config with --tiny; neither gives full-size random weights), and its model is the
   Meta-reference file graphmode rewrites, so the capture runs graphmode's own rewrites, not transformers' static
   cache.

Each under `--backend cudagraphs` (Inductor with CUDA graph trees) and `--backend inductor_cuda` (the same Inductor
kernels without CUDA graphs): what the first gains over the second is what capture/replay gives; what the second gains
over eager is what Inductor's kernels give. From each report.json it keeps the verdict, tokens, graph breaks,
recompiles, the CUDA graphs captured, replayed and declined (with Inductor's reasons), the held tensors whose address
moved, Decode ms/token eager and graph (median [min, max] over the fresh processes), peak device memory per side, the
fusions' effect (the unfused third side) and the batch buckets.

It writes DIR/device_check.json after every target (a run cut short still leaves what finished), and
DIR/device_check.md and DIR/device_check.log; a target cut short by its limit keeps the figures of the verify workers
that finished (`workers`). The adapt runs' folders go to --work (default: a temporary folder
outside DIR). Each target runs under its own time limit within --budget-s. The environment (GPU, driver, CUDA, torch,
transformers, triton, Python) is in the JSON and the Markdown.
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
            else:
                param.normal_(0.0, 0.02, generator=generator)
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
    alone: bool               # a timing that matters: nothing else runs meanwhile
    buckets: str | None = None
    record: dict[str, Any] = field(default_factory=dict)


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


def targets(work: Path, dry_run: bool, dry_backend: str = DRY_BACKEND) -> list[Target]:
    """In the order they run; those not `alone` run side by side, in the place of the first of them."""
    shape = write_shape_target(work, dry_run)
    tiny = [("legacy_llm", [str(EXAMPLES / "legacy_llm")]), ("hf_cache_api", [str(EXAMPLES / "hf_cache_api")]),
            ("meta_llama", [str(EXAMPLES / "meta_llama")]), ("hf-llama-tiny", ["--hf", "llama", "--tiny"]),
            ("hf-qwen3-tiny", ["--hf", "qwen3", "--tiny"])]
    if dry_run:
        # One backend, one run each, no time that matters: the same targets, on the CPU's cores.
        return [Target(SHAPE, [str(shape)], dry_backend, 1, MIN_STEPS, 1200, False, buckets="1,2"),
                *(Target(name, args, dry_backend, 1, MIN_STEPS, 1200, False) for name, args in tiny)]
    # The limits add up to the default budget: the real shape under cudagraphs first (what the check is for), the tiny
    # ones side by side, then the control at the real shape with what is left.
    found = [Target(f"{name}/{backend}", args, backend, 1, MIN_STEPS, 100, False)
             for backend in (GRAPH_BACKEND, CONTROL_BACKEND) for name, args in tiny]
    return [Target(f"{SHAPE}/{GRAPH_BACKEND}", [str(shape)], GRAPH_BACKEND, 3, 128, 240, True, buckets="1,8"), *found,
            Target(f"{SHAPE}/{CONTROL_BACKEND}", [str(shape)], CONTROL_BACKEND, 3, 128, 100, True)]


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


def run_target(target: Target, work: Path, deadline: float, log: Log, concurrent: bool) -> None:
    left = deadline - time.monotonic()
    limit = min(target.limit_s, left)
    record = target.record
    record.update(id=target.id, backend=target.backend, runs=target.runs, steps=target.steps,
                  buckets_asked=target.buckets, limit_s=round(limit, 1))
    if limit < 30:
        record.update(status="not run", error=f"the budget had {left:.0f} s left")
        log(f"{target.id}: not run, {left:.0f} s of the budget left")
        return
    out = work / "runs" / target.id.replace("/", "-")
    shutil.rmtree(out, ignore_errors=True)
    command = adapt_command(target, out, limit)
    record["command"] = " ".join(command[1:])
    env = {key: value for key, value in os.environ.items() if key != "GRAPHMODE_CORES_LOCK"}
    env.update(PYTHONUNBUFFERED="1", GRAPHMODE_HOME=str(work / "home" / target.id.replace("/", "-")), COLUMNS="200")
    if concurrent:
        # Side by side, each process compiles in itself: a pool of compile workers per process would be one per core
        # times the targets.
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    log(f"{target.id}: started (limit {limit:.0f} s)")
    started = time.monotonic()
    lines: list[str] = []
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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
    elapsed = time.monotonic() - started
    timed_out = stopped.is_set()
    record.update(elapsed_s=round(elapsed, 1), exit_status=process.returncode, run_folder=str(out))
    report = next(out.glob("*/report.json"), None)
    if report is not None:
        record.update(summarise(json.loads(report.read_text())))
    else:
        # Cut short: what the verify workers that finished wrote (runners.results.WorkerResult, in logs/).
        record["workers"] = summarise_workers(out)
    record["status"] = ("timed out" if timed_out else "verified" if process.returncode == 0 else
                        "failed" if report is not None else "error")
    if record["status"] != "verified":
        record["output_tail"] = lines[-15:]
    log(f"{target.id}: {record['status']} in {elapsed:.0f} s (exit {process.returncode})")


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


def summarise_workers(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Per side ("adapted", "original", "unfused"), each finished run's own figures: Decode ms/token (median of the
    steps after warm-up), graph breaks, recompiles, peak device memory, CUDA graphs and moved addresses."""
    sides: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("*/logs/*.json")):
        side = path.name.split(".")[0]
        if side not in ("adapted", "original", "unfused") or path.name.count(".") > 2:
            continue
        try:
            worker = json.loads(path.read_text())
            steady = worker["decode_ms"][1:] or worker["decode_ms"]
        except (OSError, ValueError, KeyError):
            continue
        sides.setdefault(side, []).append({
            "run": path.name, "tpot_ms": statistics.median(steady), "warmup_s": worker.get("warmup_s"),
            "graph_breaks": worker.get("graph_breaks"), "recompiles": worker.get("recompiles"),
            "peak_device_mb": worker.get("peak_device_mb"), "dtype": worker.get("dtype"),
            "cuda_graphs": _graph_counts(worker["cuda_graphs"]) if worker.get("cuda_graphs") else {},
            "addresses_moved": (worker.get("static_addresses") or {}).get("moved")})
    return sides


def _graph_counts(record: dict[str, Any]) -> dict[str, Any]:
    return {key: record.get(key) for key in ("captures", "replays", "warmup_runs", "captures_after_first_replay",
                                             "skips", "skip_reasons", "unavailable")}


def comparisons(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model run under both backends: eager, Inductor's kernels alone, and with capture/replay (Decode ms/token,
    medians), and what each step gives."""
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for record in records:
        model, _, backend = record["id"].partition("/")
        if record.get("tpot_ms", {}).get("graph"):
            by_model.setdefault(model, {})[backend] = record
    rows = []
    for model, sides in by_model.items():
        if GRAPH_BACKEND not in sides or CONTROL_BACKEND not in sides:
            continue
        eager = statistics.median([sides[b]["tpot_ms"]["eager"][0] for b in sides if sides[b]["tpot_ms"]["eager"]])
        kernels, graphs = sides[CONTROL_BACKEND]["tpot_ms"]["graph"][0], sides[GRAPH_BACKEND]["tpot_ms"]["graph"][0]
        rows.append({"model": model, "eager_ms": eager, "inductor_cuda_ms": kernels, "cudagraphs_ms": graphs,
                     "inductor_kernels_speedup": eager / kernels, "capture_replay_speedup": kernels / graphs,
                     "total_speedup": eager / graphs,
                     "runs": {b: sides[b]["runs"] for b in sides}})
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
                  "| Model | Eager ms | inductor_cuda ms | cudagraphs ms | "
                  "Inductor's kernels (eager / inductor_cuda) | Capture/replay (inductor_cuda / cudagraphs) |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {c['model']} | {c['eager_ms']:.3f} | {c['inductor_cuda_ms']:.3f} | {c['cudagraphs_ms']:.3f} | "
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
                              for side, runs in r["workers"].items())
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
                        help="all targets together (default: 440 s on a GPU, 3600 s in a dry run)")
    parser.add_argument("--only", help="comma-separated target ids (or their model part, e.g. legacy_llm)")
    parser.add_argument("--jobs", type=int, help="targets run side by side (never the real shape on a GPU); "
                                                   "default: 10 on a GPU, 1 in a dry run")
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (1 if args.dry_run else 10)
    args.budget_s = args.budget_s or (3600.0 if args.dry_run else 440.0)
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "device_check.log")
    work = args.work or Path(tempfile.mkdtemp(prefix="graphmode-device-check-"))
    work.mkdir(parents=True, exist_ok=True)
    chosen = targets(work, args.dry_run, args.dry_backend)
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [t for t in chosen if t.id in wanted or t.id.partition("/")[0] in wanted]
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

    def one(target: Target, concurrent: bool) -> None:
        try:
            run_target(target, work, deadline, log, concurrent)
        except Exception as error:  # noqa: BLE001 - one target's failure never stops the others
            target.record.update(status="error", error=f"{type(error).__name__}: {error}")
            log(f"{target.id}: error: {error}")
        finished()

    log(f"{len(chosen)} target(s), work folder {work}, budget {args.budget_s:.0f} s")
    finished()
    together = [t for t in chosen if not t.alone]
    for target in chosen:
        if target.alone:
            one(target, False)
        elif target is together[0]:
            with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
                list(pool.map(lambda t: one(t, len(together) > 1 and args.jobs > 1), together))
    finished()
    log(f"done in {time.monotonic() - started:.0f} s: "
        + ", ".join(f"{t.id} {t.record.get('status')}" for t in chosen))
    return 0 if all(t.record.get("status") == "verified" for t in chosen) else 1


if __name__ == "__main__":
    raise SystemExit(main())
