"""The baseline table of FINDINGS.md from GRAPHMODE_CORPUS_KEEP's results.jsonl.

    python tests/corpus/results_table.py /tmp/corpus_keep/results.jsonl

One row per case (the last record of a case wins): package==version:model, whether the original
runs, graphmode's result, the own-harness check on the adapted sources, the first thing graphmode
could not do (file:line), and the seconds the case took (build + original + adapt + own harness).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> list[dict]:
    records: dict[str, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            records[record["case"]] = record
    return list(records.values())


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(records: list[dict]) -> str:
    out = ["| case | original runs | graphmode | own harness on adapted sources | first missing capability | s |",
           "|---|---|---|---|---|---|"]
    for r in records:
        report = r.get("report") or {}
        result = r["result"]
        if report.get("changes_applied") is not None:
            result += f" (applied: {', '.join(report['changes_applied']) or 'none'})"
        blocker = r.get("first_blocker") or r.get("why") or ""
        out.append("| " + " | ".join(_cell(x) for x in (
            r["case"], "yes" if r.get("original_ok") else "no", result, r.get("own_harness", "not run"),
            blocker, r.get("seconds", ""))) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(rows(Path(sys.argv[1]))))
