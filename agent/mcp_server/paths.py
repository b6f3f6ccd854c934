"""The folders a `graphmode mcp` server may read and where it writes, and every path a tool is given checked against
them: resolved (links followed) before it is compared, so `..` and a link cannot lead out."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graphmode.agent.errors import UserError


@dataclass(frozen=True)
class Folders:
    roots: tuple[Path, ...]  # what the tools may read: targets and adapted folders lie under one of these
    out: Path  # where the tools' run folders go

    @classmethod
    def of(cls, roots: list[Path], out: Path) -> "Folders":
        resolved = tuple(dict.fromkeys(root.expanduser().resolve() for root in roots))
        for root in resolved:
            if not root.is_dir():
                raise UserError(f"--root {root}: no such folder")
        return cls(resolved, out.expanduser().resolve())

    def readable(self, given: str, what: str) -> Path:
        """`given` resolved (relative to the first root), which must exist and lie under a root."""
        if not isinstance(given, str) or not given.strip() or "\x00" in given:
            raise UserError(f"{what}: give a path")
        path = Path(given).expanduser()
        resolved = (path if path.is_absolute() else self.roots[0] / path).resolve()
        if not self.holds(resolved):
            raise UserError(f"{given}: outside the folders this server may read "
                            f"({', '.join(str(root) for root in self.roots)})")
        if not resolved.exists():
            raise UserError(f"{given}: no such file or folder")
        return resolved

    def within(self, path: str | Path, what: str) -> Path:
        """A path a saved session or a target file names (a session's target, a graphmode.toml's harness), which must
        lie under a root too."""
        resolved = Path(path).resolve()
        if not self.holds(resolved):
            raise UserError(f"{what} {resolved} is outside the folders this server may read "
                            f"({', '.join(str(root) for root in self.roots)})")
        return resolved

    def holds(self, path: str | Path) -> bool:
        """Whether `path`, resolved, is a root or lies under one."""
        resolved = Path(path).resolve()
        return any(resolved == root or root in resolved.parents for root in self.roots)
