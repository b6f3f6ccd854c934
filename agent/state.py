"""The state one adaptation carries from node to node.

Everything in it is plain JSON (lists, dicts, strings, numbers), so a session checkpointed to
SQLite can be resumed by a later process, and batch tools can read it back.
"""
from __future__ import annotations

from pydantic import BaseModel, Field


class Change(BaseModel):
    """One planned change: one codemod over the files it rewrites."""

    id: str  # "C1", "C2", ... in chain order; what the person approves
    codemod: str
    title: str
    description: str
    skill: str
    requires: list[str] = Field(default_factory=list)  # ids of changes this one relies on
    files: list[str] = Field(default_factory=list)
    edits: list[dict] = Field(default_factory=list)  # transforms.codemods.Edit as dicts, original lines
    fixes: list[int] = Field(default_factory=list)  # indexes into RunState.findings
    diff: str = ""  # the hunks of the planned diff its edits touch (agent.diffs), shown before approval


class RunState(BaseModel):
    # What to adapt and how
    session_id: str
    target: str  # absolute path of the target folder (holds harness.py and the sources)
    run_dir: str  # where this run writes design.md, adapted/, changes.diff, report.*
    backend: str = "auto"
    steps: int = 32
    runs: int = 3  # fresh processes per side in verify; figures are their median [min, max]
    similarity: float = 0.95  # lowest acceptable difflib ratio of graph tokens against eager
    # Inductor's on-disk compile cache for the graph runs: "" = a fresh one in the run folder (run 1
    # compiles cold, later runs read it), "off" = every run compiles cold, else a folder kept across sessions.
    compile_cache: str = ""
    # Batch sizes to pad the prompt to in verify (one capture each); [] = none. The static buffers are
    # then sized for the largest.
    batch_buckets: list[int] = Field(default_factory=list)
    auto_approve: bool = False
    timeout_s: float = 600  # the most one worker process (evidence, probe, each verify run) may take

    # analyze
    sources: list[str] = Field(default_factory=list)  # relative to target
    entry_class: str = ""
    max_seq_len: int = 64
    findings: list[dict] = Field(default_factory=list)  # transforms.findings.Finding as dicts
    baseline: dict = Field(default_factory=dict)  # the unmodified Decode under Dynamo (runners.probe)
    # One traced eager run of the unmodified Prefill and Decode (runners.evidence.Evidence as a dict): what grows,
    # which ints change, where the host syncs are, and how the harness calls forward.
    evidence: dict = Field(default_factory=dict)

    # design / confirm
    plan: list[Change] = Field(default_factory=list)
    manual: list[dict] = Field(default_factory=list)  # findings and codemod items left for a person
    design_path: str = ""
    planned_diff_path: str = ""  # every change applied, as one diff (planned.diff beside design.md)
    approved: list[str] | None = None  # change ids; None until confirmed

    # implement
    applied: list[str] = Field(default_factory=list)  # codemods that changed at least one file
    adapted_dir: str = ""
    diff_path: str = ""

    # verify / report
    verification: dict = Field(default_factory=dict)
    report_path: str = ""
