"""Reads the skills/ files: the knowledge each finding and change cites."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Skill:
    id: str
    title: str
    summary: str  # one sentence: why the hazard hurts
    codes: tuple[str, ...]
    path: str  # inside the installed package, for citation


def _front_matter(text: str) -> dict[str, str]:
    if not text.startswith("---"):
        return {}
    header = text.split("---", 2)[1]
    fields = {}
    for line in header.strip().splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip().strip('"')
    return fields


@cache
def skills() -> dict[str, Skill]:
    found = {}
    for entry in resources.files("graphmode.skills").iterdir():
        if entry.name.endswith(".md"):
            meta = _front_matter(entry.read_text(encoding="utf-8"))
            codes = tuple(c.strip() for c in meta.get("codes", "").strip("[]").split(",") if c.strip())
            found[meta["id"]] = Skill(meta["id"], meta.get("title", meta["id"]), meta.get("summary", ""), codes,
                                      f"skills/{entry.name}")
    return found


def skill(skill_id: str) -> Skill:
    return skills().get(skill_id) or Skill(skill_id, skill_id, "", (), f"skills/{skill_id}.md")
