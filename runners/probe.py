"""probe(): how the unmodified model behaves in graph mode (see runners.probe_worker)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from runners.backends import get, resolve
from runners.subprocess_run import WorkerError, run_worker


class ProbeError(WorkerError):
    """The probe worker failed or timed out."""


def probe(folder: Path, steps: int = 8, backend: str = "aot_eager", timeout_s: float = 300,
          log_dir: Path | None = None) -> dict[str, Any]:
    """Runs the ORIGINAL model's Decode compiled (dynamic=False) for `steps` steps, in triage order.

    Stage 1 compiles with aot_eager: its figures are the top-level fields entry_class,
    entry_file, max_seq_len, sources, graph_breaks, break_reasons [{reason, file, line}],
    recompiles, recompile_reasons, recompile_sites [{file, line, function, count,
    first_reason, last_reason}] (one per source line), recompile_limit_hit,
    graphs_per_step, steps and env. Files are relative to `folder` when inside it.

    `triage` then says where the problem first shows: {"stages": [{name, backend, status
    ("failed" | "passed" | "skipped"), reason, graph_breaks, recompiles, error, ...}] for
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
    with tempfile.TemporaryDirectory(prefix="graphmode-probe-") as tmp:
        out = Path(tmp) / "probe.json"
        run_worker("runners.probe_worker",
                   ["--folder", str(Path(folder).resolve()), "--steps", str(steps), "--backend", backend,
                    "--out", str(out)],
                   name="probe", timeout_s=timeout_s, log_dir=log_dir, error=ProbeError)
        return json.loads(out.read_text())
