"""The items left for a person: one per line, and whether the adapted Decode really runs that line.

Findings no change fixes and the spots a codemod recognised only in part can name the same line (a
GM501 position parameter and the static_positions note on why it was left): the person gets the line
once, with every reason (`merge_by_line`).

Rules and codemods judge by reading the source; the verifier traces one eager Decode step of the
adapted model (runners/evidence/line_trace.py). An item on a line Decode never runs (a flash-attention path,
a training branch, another head) does not stand between the model and graph mode; the report says so.
"""
from __future__ import annotations

from pathlib import Path

from graphmode.transforms.pipeline import original_to_adapted


def merge_by_line(items: list[dict]) -> list[dict]:
    """One item per (path, line), in the order the lines first appear.

    Each keeps its first item's fields (so `kind`, `code`, `message` still say what the main reason is)
    and lists under `reasons` every item of that line whose rule or codemod and text differ (the same
    message twice on one line, at two columns, is one reason); `path` and `line` are the item's own.
    """
    merged: dict[tuple[str, int], dict] = {}
    for item in items:
        key = (item["path"], item["line"])
        reason = {k: v for k, v in item.items() if k not in ("path", "line", "reasons")}
        if key not in merged:
            merged[key] = {**item, "reasons": [reason]}
        elif _says(reason) not in {_says(r) for r in merged[key]["reasons"]}:
            merged[key]["reasons"].append(reason)
    return list(merged.values())


def _says(reason: dict) -> tuple[str, str]:
    """What a reason says: its rule code or codemod, and its text."""
    return reason.get("code") or reason.get("codemod") or "", reason.get("message") or reason.get("reason") or ""


def mark_decode_runs(manual: list[dict], decode_lines: dict[str, list[int]], target: Path,
                     adapted_dir: Path) -> list[dict]:
    """Copies of the items, each with `decode_runs`: True or False, or None when nothing was traced."""
    if not decode_lines:
        return [{**item, "decode_runs": None} for item in manual]
    maps: dict[str, dict[int, int]] = {}
    marked = []
    for item in manual:
        path = item["path"]
        if path not in maps:
            original = (target / path).read_text(encoding="utf-8")
            adapted_file = adapted_dir / path
            adapted = adapted_file.read_text(encoding="utf-8") if adapted_file.is_file() else original
            maps[path] = original_to_adapted(original, adapted)
        line = maps[path].get(item["line"])
        runs = None if line is None else line in set(decode_lines.get(path, ()))
        marked.append({**item, "decode_runs": runs})
    return marked


# The codemods whose items say why the entry points cannot be added: why the carried cache was not made static first
# (the entries need it), then why no entries. An item that only points at another is left out.
_ENTRY_CODEMODS = ("cache_object", "static_kv_cache", "carried_cache", "absorbed_mla", "added_cache", "split_decode")
_CONSEQUENCE = "the cache was not replaced: another part of it"
# Findings of the carried cache that the traced run saw: grown with cat (GM301) or carried as an object (GM303) on
# lines Decode ran; written at Python-int bounds (GM302 `setitem`, which the trace itself found: a slice read at such
# bounds may be a position table's).
_CACHE_FINDINGS = {"GM301": ("seen", "trace"), "GM303": ("seen", "trace"), "GM302": ("trace",)}
_CACHE_WRITE = "`setitem` writes"


def entry_blockers(manual: list[dict]) -> list[str]:
    """What stops the entry points, in the items' words with their places, cause first; [] where split_decode left no
    item (the entries can be added, or the class has its own). The cause: why the carried cache was not made static
    (the cache codemods' items, advisories left out, or, where none recognised the cache, the lines the traced run
    saw grow, write or read it); then split_decode's own words. A reason several lines share is said once, with its
    lines."""
    said = _codemod_blockers(manual)
    entries = _ENTRY_CODEMODS.index("split_decode")
    if not any(order == entries for order, _ in said):
        return []
    if all(order == entries for order, _ in said):  # no cache codemod recognised the cache: the trace's lines name it
        said.update(_traced_cache_lines(manual))
    return [f"{reason} ({', '.join(places)})" for (_, reason), places in sorted(said.items(), key=lambda p: p[0][0])]


def _codemod_blockers(manual: list[dict]) -> dict[tuple[int, str], list[str]]:
    """(order in _ENTRY_CODEMODS, reason) -> its places, for the entry codemods' reasons that stop something."""
    said: dict[tuple[int, str], list[str]] = {}
    for item, r in _reasons(manual):
        if r.get("codemod") in _ENTRY_CODEMODS and not r["reason"].startswith(_CONSEQUENCE) and not r.get("advisory"):
            said.setdefault((_ENTRY_CODEMODS.index(r["codemod"]), r["reason"]), []).append(_place(item))
    return said


def _traced_cache_lines(manual: list[dict]) -> dict[tuple[int, str], list[str]]:
    """(-1, message) -> its places, for the findings of the carried cache the traced run saw (_CACHE_FINDINGS)."""
    said: dict[tuple[int, str], list[str]] = {}
    for item, r in _reasons(manual):
        seen = {r.get("trace"), r.get("source")} & set(_CACHE_FINDINGS.get(r.get("code"), ()))
        if seen and (r.get("code") != "GM302" or r.get("message", "").startswith(_CACHE_WRITE)):
            said.setdefault((-1, r["message"]), []).append(_place(item))
    return said


def _reasons(manual: list[dict]):
    """(item, reason) for every reason of every item (an item not merged by line is its own one reason)."""
    return ((item, r) for item in manual for r in item.get("reasons") or [item])


def _place(item: dict) -> str:
    return f"{item['path']}:{item['line']}"
