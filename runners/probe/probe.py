"""probe(): how the unmodified model behaves in graph mode (see runners.workers.probe_worker)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from graphmode.runners.backends import get, resolve
from graphmode.runners.subprocess_run import WorkerError, run_worker


class ProbeError(WorkerError):
    """The probe worker failed or timed out."""


# What torch 2.13's errors say when inference mode, not the model, stopped the compile ("Cannot set
# version_counter for inference tensor", "Inplace update to inference tensor outside InferenceMode").
_INFERENCE_TENSOR = "inference tensor"


def probe(folder: Path, steps: int = 8, backend: str = "aot_eager", timeout_s: float = 300,
          log_dir: Path | None = None) -> dict[str, Any]:
    """Runs the ORIGINAL model's Decode compiled (dynamic=False) for `steps` steps, in triage order.

    Stage 1 compiles with aot_eager: its figures are the top-level fields entry_class,
    entry_file, max_seq_len, sources, graph_breaks, break_reasons [{reason, file, line}],
    recompiles, recompile_reasons, recompile_sites [{file, line, function, count,
    first_reason, last_reason}] (one per source line), recompile_limit_hit,
    graphs_per_step, steps and env. Files are relative to `folder` when inside it.

    When stage 1 crashed, `crash` says why ({type, message, cause, file, line, where, text,
    wrapped_in}: the innermost exception and the target's line it happened at) and graph_breaks,
    recompiles and recompile_limit_hit are None: nothing was measured. A crash that inference mode
    caused is probed once more with every `torch.inference_mode` run as `torch.no_grad`; when that
    run does not crash, its figures are the result, `crash` still names the crash of the code as
    written and `measured_with` says what was changed for measuring (else it is None;
    `retry_crash` holds the second crash when the retry crashed too). `headline` says all of it in
    one line, for the design document and the report.

    `triage` then says where the problem first shows: {"stages": [{name, backend, status
    ("failed" | "passed" | "skipped"), reason, graph_breaks, recompiles, error, crash, ...}] for
    aot_eager, force_eager and backend, "failed_stage": a name or None, "classification":
    "recompile" | "graph_break" | "compile_error" | "mismatch" | "ok"}. A later stage runs
    only when the earlier ones were clean; stages this machine cannot run (npugraph_ex
    without torch_npu, cudagraphs without CUDA) are skipped with the reason, never faked.
    "ok" means no stage that ran failed. `backend` is a name from runners.backends
    ("auto" is resolved here); an unknown name raises BackendUnavailable before running.
    """
    if backend == "auto":
        backend = resolve("auto")[0].name
    else:
        get(backend)  # an unknown name fails here, in one line, before a worker starts

    def run(name: str, *extra: str) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="graphmode-probe-") as tmp:
            out = Path(tmp) / "probe.json"
            run_worker("graphmode.runners.workers.probe_worker",
                       ["--folder", str(Path(folder).resolve()), "--steps", str(steps), "--backend", backend,
                        "--out", str(out), *extra],
                       name=name, timeout_s=timeout_s, log_dir=log_dir, error=ProbeError)
            return json.loads(out.read_text())

    result = run("probe")
    crash = result["crash"]
    result["retry_crash"] = None
    if crash is not None and _INFERENCE_TENSOR in crash["message"]:
        retry = run("probe.no_grad", "--inference-mode-as-no-grad")
        if retry["crash"] is None:
            result = {**retry, "crash": crash, "retry_crash": None}
        else:
            result["retry_crash"] = {**retry["crash"], "measured_with": retry["measured_with"]}
    result["headline"] = headline(result)
    return result


def headline(result: dict[str, Any]) -> str:
    """One line on the unmodified Decode: its figures, or that it crashed, why, and what was measured."""
    crash, retry_crash = result.get("crash"), result.get("retry_crash")
    figures = f"{result['graph_breaks']} graph breaks, {result['recompiles']} recompiles"
    if result.get("recompile_limit_hit"):
        figures += ", and it hit the recompile limit, after which Dynamo silently runs eager"
    if crash is None:
        return figures
    where = f" at {crash['where']}" if crash.get("where") else " (at no line of the target's folder)"
    text = f"the probe of the original crashed: {crash['cause']}{where}"
    if result.get("measured_with"):
        return f"{text}; measured with {result['measured_with']}: {figures}"
    if retry_crash is not None:
        again = f" at {retry_crash['where']}" if retry_crash.get("where") else ""
        text += f"; with {retry_crash['measured_with']} it crashed too: {retry_crash['cause']}{again}"
    return f"{text}; no graph-break or recompile figures"
