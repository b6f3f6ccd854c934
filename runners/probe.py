"""probe(): how the unmodified model behaves in graph mode (see runners.probe_worker)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from runners.subprocess_run import WorkerError, run_worker


class ProbeError(WorkerError):
    """The probe worker failed or timed out."""


def probe(folder: Path, steps: int = 8, timeout_s: float = 300, log_dir: Path | None = None) -> dict[str, Any]:
    """Runs the ORIGINAL model's Decode compiled (aot_eager, dynamic=False) for `steps` steps.

    Returns entry_class, entry_file, max_seq_len, sources, graph_breaks, break_reasons
    [{reason, file, line}], recompiles, recompile_reasons, recompile_sites
    [{file, line, function, count, first_reason, last_reason}], recompile_limit_hit,
    graphs_per_step and env.
    """
    with tempfile.TemporaryDirectory(prefix="graphmode-probe-") as tmp:
        out = Path(tmp) / "probe.json"
        run_worker("runners.probe_worker",
                   ["--folder", str(Path(folder).resolve()), "--steps", str(steps), "--out", str(out)],
                   name="probe", timeout_s=timeout_s, log_dir=log_dir, error=ProbeError)
        return json.loads(out.read_text())
