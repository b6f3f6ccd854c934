"""The one finding type shared by static rules and the runtime probe."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    code: str  # stable rule code, e.g. "GM101"
    path: str  # relative to the target folder
    line: int
    column: int
    message: str
    skill: str  # id of the skill (skills/<id>.md) that explains the hazard and its fix
    function: str = ""  # qualified name of the enclosing function, e.g. "Attention.forward"
    # "static" (a rule), "runtime" (the Dynamo probe), "trace" (runners.evidence.collect) or "adapted" (an earlier
    # round's adapted run, agent.workflow.repair)
    source: str = "static"
    autofix: bool = False  # a codemod was run over the file and fixes this finding (`graphmode scan --check-fixes`)
    evidence: str = ""  # what the runtime probe saw at this line, when it saw something
    # What the evidence trace (runners.evidence.findings.reconcile) says of this line: "seen" (the hazard ran in
    # Decode), "prefill-only" or "not-run" (Decode never ran the line), "" (not traced).
    trace: str = ""

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        return cls(**data)
