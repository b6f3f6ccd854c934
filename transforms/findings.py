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
    source: str = "static"  # "static" (a rule) or "runtime" (the Dynamo probe)
    autofix: bool = True  # a codemod exists for this kind of hazard
    evidence: str = ""  # what the runtime probe saw at this line, when it saw something

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        return cls(**data)
