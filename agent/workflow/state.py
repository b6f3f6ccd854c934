"""The state one adaptation carries from node to node.

Run options (what the person asked for) are kept apart from results (what each step found). The results that
graphmode itself reads are typed models: the baseline probe, the verification (runners.verify.record: the record
verify returns, kept as it came), the findings and the items left for a person. A runner's record may hold more than
graphmode reads (figures kept for the reports); those extra fields are kept as they came (`extra="allow"`), so
nothing a runner measured is lost on the way to the report.

Everything serialises to plain JSON, so a session checkpointed to SQLite can be resumed by a later process, and
batch tools can read it back. `schema_version` says which layout a saved session has: a session saved by an
earlier layout is refused with a clear message rather than misread (agent.workflow.graph.saved_state).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, model_validator

from graphmode.runners.evidence.model import Evidence
from graphmode.runners.run_settings import SETTINGS, default
from graphmode.runners.verify.record import Record, Verification
from graphmode.transforms.findings import Finding

# 3: the entry class and MAX_SEQ_LEN only in the baseline, each change's diff on disk, the verification as
# runners.verify.verify returns it (2: options nested under
# `options`; typed baseline, verification and manual items; 1: every field flat, dicts).
SCHEMA_VERSION = 3


class RunOptions(BaseModel):
    """What to adapt and how: set by the command line, never changed by a step."""

    target: str  # absolute path of the target folder (holds harness.py and the sources)
    run_dir: str  # where this run writes design.md, adapted/, changes.diff, report.*
    # Defaults and bounds: runners.run_settings, shared with the command line, graphmode.toml and batch manifests.
    backend: str = default("backend")
    steps: int = default("steps")
    runs: int = default("runs")  # fresh processes per side in verify; figures are their median [min, max]
    similarity: float = default("similarity")  # lowest acceptable difflib ratio of graph tokens against eager
    # Inductor's on-disk compile cache for the graph runs: "" = a fresh one in the run folder (run 1
    # compiles cold, later runs read it), "off" = every run compiles cold, else a folder kept across sessions.
    compile_cache: str = default("compile_cache")
    # Batch sizes to pad the prompt to in verify (one capture each); [] = none. The static buffers are
    # then sized for the largest.
    batch_buckets: list[int] = Field(default_factory=list)
    auto_approve: bool = False
    # The most design -> verify rounds (agent.workflow.repair): a failed verification is repaired and verified again
    # while rounds are left.
    rounds: int = default("rounds")
    timeout_s: float = default("timeout")  # the most one worker process (evidence, probe, each verify run) may take
    # `--hf`: what the user named and how graphmode built it (agent.targets.hf.HFTarget.summary()); None otherwise.
    hf: dict[str, Any] | None = None
    # graphmode.toml's [target] sources: the files that may be rewritten, instead of the harness's SOURCES.
    sources: list[str] | None = None
    # The interpreter the target's model runs under (graphmode.toml's python, --python): every worker runs there;
    # its facts (runners.interpreter.Interpreter.to_dict()) for the documents. None: graphmode's own.
    python: str | None = None
    interpreter: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _within_bounds(self) -> "RunOptions":
        for key, value in (("steps", self.steps), ("runs", self.runs), ("similarity", self.similarity),
                           ("timeout", self.timeout_s), ("rounds", self.rounds)):
            problem = SETTINGS[key].problem(value)
            if problem:
                raise ValueError(f"{key} = {value!r} {problem}")
        return self

    @property
    def name(self) -> str:
        """What the documents call the target: the run folder's name (the target folder's, or hf-<model>)."""
        return self.run_dir.rstrip("/").split("/")[-1]


class Baseline(Record):
    """The unmodified Decode under Dynamo (graphmode.runners.probe.probe.probe; its docstring says every field)."""

    entry_class: str = ""
    entry_file: str | None = None
    max_seq_len: int = 64
    prompt_shape: list[int] = Field(default_factory=list)
    steps: int = 0
    # None when the probe crashed and nothing could be measured (`crash` says why).
    graph_breaks: int | None = None
    recompiles: int | None = None
    recompile_limit_hit: bool | None = None
    break_reasons: list[dict[str, Any]] = Field(default_factory=list)  # {"reason", "file", "line"}
    recompile_reasons: list[str] = Field(default_factory=list)
    recompile_sites: list[dict[str, Any]] = Field(default_factory=list)  # {"file", "line", "function", "count", ...}
    crash: dict[str, Any] | None = None
    retry_crash: dict[str, Any] | None = None
    measured_with: str | None = None
    headline: str = ""  # all of the above in one line
    triage: dict[str, Any] | None = None  # {"stages": [...], "failed_stage", "classification"}


class ManualItem(Record):
    """A line left for a person: a finding no change fixes, or a spot a codemod recognised only in part
    (agent.workflow.leftovers merges the items of one line; `reasons` lists each)."""

    kind: str  # "finding" or "codemod"
    path: str
    line: int
    code: str = ""  # the rule's code (findings)
    codemod: str = ""  # the codemod's name (codemod items)
    message: str = ""
    reason: str = ""
    why: str = ""
    reasons: list[dict[str, Any]] = Field(default_factory=list)


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
    # The hunks of the planned diff its edits touch (agent.workflow.diffs), shown before approval: a file beside
    # design.md (changes/<id>.diff), so checkpoints stay small; "" when the change has no lines of its own.
    diff_path: str = ""
    # A fusion's estimated effect per layer (agent.workflow.adaptation.fusion_numbers), for the design.
    numbers: str = ""


    def diff(self) -> str:
        """Its part of the planned diff; "" when it has no lines of its own."""
        return Path(self.diff_path).read_text(encoding="utf-8") if self.diff_path else ""


class Round(BaseModel):
    """One finished round of design -> confirm -> implement -> verify, as the reports tell it
    (agent.workflow.repair)."""

    number: int
    design_path: str  # that round's design document, kept beside the latest (design.md)
    approved: list[str] = Field(default_factory=list)  # codemods
    declined: list[str] = Field(default_factory=list)  # codemods a person (not a --yes run) left out
    applied: list[str] = Field(default_factory=list)
    revisions: dict[str, Any] = Field(default_factory=dict)  # the parameters as a person revised them
    # The verification's verdict in short (None when it did not run: `problems` says why).
    passed: bool | None = None
    problems: list[str] = Field(default_factory=list)
    tokens_equal: bool | None = None
    first_divergent_step: int | None = None
    graph_breaks: int | None = None
    recompiles: int | None = None
    decode_speedup: float | None = None
    # What the repair found and did after it: {"kind": "evidence" | "declined" | "applied" | "kept" (a failure's
    # line) | "dropped" | "bisected" (a bisection's verdict), "path", "line" (the original's), "adapted_line",
    # "count", "codemod", "change", "what", "reason"}; [] when the round verified or was declined.
    repairs: list[dict[str, Any]] = Field(default_factory=list)
    outcome: str = ""  # one sentence: verified, repaired into round N+1, or why it stopped


def _traced_run(value: Any) -> Evidence | None:
    """The evidence as analyze returned it (a dict, as checkpoints keep it) or already built; None when not traced."""
    if value is None or isinstance(value, Evidence):
        return value
    return Evidence.from_dict(value) if value else None


# Saved as runners.evidence.model's JSON layout (Evidence.to_dict), held as the typed record.
TracedRun = Annotated[Evidence | None, PlainValidator(_traced_run),
                      PlainSerializer(lambda evidence: evidence.to_dict() if evidence is not None else None)]


class RunState(BaseModel):
    # A field this layout does not have is a caller's mistake (or an older layout's field), not something to drop.
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    session_id: str
    options: RunOptions

    # analyze
    sources: list[str] = Field(default_factory=list)  # relative to the target
    findings: list[Finding] = Field(default_factory=list)
    baseline: Baseline = Field(default_factory=Baseline)
    # One traced eager run of the unmodified Prefill and Decode: what grows, which ints change, where the host syncs
    # are, and how the harness calls forward. The codemods' options are read from it by agent.workflow.adaptation.
    evidence: TracedRun = None

    # design / confirm
    plan: list[Change] = Field(default_factory=list)
    manual: list[ManualItem] = Field(default_factory=list)
    design_path: str = ""
    planned_diff_path: str = ""  # every change applied, as one diff (planned.diff beside design.md)
    approved: list[str] | None = None  # change ids; None until confirmed
    # Design rounds (agent.workflow.repair): which this is, and the finished ones before it. `designs` lists every
    # design document written, revisions at confirmation included.
    round: int = 1
    rounds: list[Round] = Field(default_factory=list)
    designs: list[str] = Field(default_factory=list)
    # A person's revised parameters (agent.workflow.revisions: max_seq_len, max_batch_size, entry_class, fused_ops), and
    # whether confirm just took a revision (then design runs again before anything is applied).
    revisions: dict[str, Any] = Field(default_factory=dict)
    revising: bool = False
    # Codemods a person declined (still planned, but a later round proposes them only when chosen, and a --yes
    # round never adds them back), and those a bisection found to change the tokens, left out of every later
    # design ({"codemod", "change", "round", "why", "trials"}).
    declined: list[str] = Field(default_factory=list)
    dropped: list[dict[str, Any]] = Field(default_factory=list)
    # What the adapted runs showed that the original's traced run did not: evidence lines for the codemods' options
    # ({"host_sync_lines": [[file, line], ...]}), and the declined changes behind a failure, to offer again.
    repair_evidence: dict[str, list] = Field(default_factory=dict)
    offers: list[dict[str, Any]] = Field(default_factory=list)
    # Why this round was not run although one was left (agent.workflow.repair.rounds.nothing_new: a person
    # declined every change the repair offered, and nothing else changed); "" otherwise. Confirm then goes to the
    # report, which says it.
    stopped: str = ""

    # implement
    applied: list[str] = Field(default_factory=list)  # codemods that changed at least one file
    adapted_dir: str = ""
    # The same adaptation without the fusion codemods (adapted-unfused/), for verify to time against; "" when no
    # fusion was applied, and in sessions saved before it (a defaulted field: the layout reads them as they were).
    unfused_dir: str = ""
    diff_path: str = ""

    # verify / report
    verification: Verification | None = None
    report_path: str = ""
    # `graphmode verify` on a folder of adapted sources (agent.workflow.verify_only): {"folder", "written_by"
    # ("graphmode adapt", "graphmode fix" or None: unknown), "files" (agent.workflow.hand_edits.edited_files; None:
    # unknown)}; None in a session's own verification.
    hand_edits: dict[str, Any] | None = None

    # What analyze found, kept once: in the probe's record.
    @property
    def entry_class(self) -> str:
        """The model class the harness builds."""
        return self.baseline.entry_class

    @property
    def max_seq_len(self) -> int:
        """The harness's MAX_SEQ_LEN: the positions its static path is set up for unless a person revises it."""
        return self.baseline.max_seq_len
