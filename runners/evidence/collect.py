"""Runtime evidence of the UNMODIFIED model, collected in a fresh process: what its Prefill and Decode steps really do,
line by line.

Static rules and codemods recognise caches and positions by names and code shapes; the evidence records instead what
happens when the harness runs, with no Dynamo involved. Each concern has its module: runners.evidence.model (the
evidence as data and its JSON, no torch), runners.evidence.tracer (what runs under torch and records),
runners.evidence.analysis (the records compared step by step into evidence), runners.workers.evidence_worker (both, in
the child process) and runners.evidence.findings (the evidence as findings; `reconcile` checks static findings against
it). This module starts the worker and reads back what it wrote.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from graphmode.runners.evidence.model import Evidence
from graphmode.runners.subprocess_run import WorkerError, run_worker


class EvidenceError(WorkerError):
    """The evidence worker failed (the harness raised, broke the contract) or timed out."""


def collect_evidence(folder: Path, steps: int = 4, timeout_s: float = 300,
                     log_dir: Path | None = None, sources: list[str] | None = None) -> Evidence:
    """Traces the UNMODIFIED model's Prefill and `steps` Decode steps in a fresh process; `sources`: the files to
    trace, instead of the harness's SOURCES.

    Raises EvidenceError with one line (the user's file:line when their code raised)."""
    if steps < 2:
        raise ValueError(f"steps must be at least 2 to see what changes between Decode steps, got {steps}")
    with tempfile.TemporaryDirectory(prefix="graphmode-evidence-") as tmp:
        out = Path(tmp) / "evidence.json"
        seconds = run_worker("graphmode.runners.workers.evidence_worker",
                             ["--folder", str(Path(folder).resolve()), "--steps", str(steps), "--out", str(out),
                              *(["--sources", ",".join(sources)] if sources else [])],
                             name="evidence", timeout_s=timeout_s, log_dir=log_dir, error=EvidenceError)
        evidence = Evidence.from_dict(json.loads(out.read_text()))
    evidence.worker_s = seconds
    return evidence
