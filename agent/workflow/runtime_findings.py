"""The graph breaks and recompiles the probe saw, merged into the static findings: no line is reported twice."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from graphmode.agent.workflow.state import Baseline
from graphmode.transforms.findings import Finding


def with_runtime_findings(static: list[Finding], baseline: Baseline, sources: list[str]) -> list[Finding]:
    """Adds the graph breaks and recompiles the probe saw in the sources, so that no location is reported
    twice: evidence at a line a static finding names goes onto that finding, and a recompile guard goes
    onto the static finding (same file) that names the guarded variable, else the nearest one in the
    same function. Only what no static finding explains becomes a runtime finding of its own."""
    events = [("GM901", item.get("file"), item.get("line"), item.get("function") or "",
               f"graph break: {item.get('reason', '')}")
              for item in baseline.break_reasons]
    events += [("GM902", site.get("file"), site.get("line"), site.get("function") or "",
                f"recompiled {site.get('count', 1)}x; guard: {site.get('first_reason', '')}")
               for site in baseline.recompile_sites]
    merged = list(static)
    added: list[Finding] = []
    for code, path, line, function, what in events:
        relative = next((s for s in sources if path and Path(path).as_posix().endswith(s)), None)
        if relative is None or not line:
            continue  # outside the sources (the harness, torch itself): shown in the baseline section
        target = _explaining_finding(merged, relative, line, function, what if code == "GM902" else "")
        if target is not None:
            if what not in merged[target].evidence:
                said = "; ".join(filter(None, [merged[target].evidence, what]))
                merged[target] = replace(merged[target], evidence=said)
        elif not any(f.path == relative and f.line == line and what in f.message for f in added):
            skill = "triage" if code == "GM901" else "positions-as-tensors"
            added.append(Finding(code, relative, line, 1, what, skill, source="runtime", autofix=False))
    return merged + added


def _explaining_finding(findings: list[Finding], path: str, line: int, function: str, guard: str) -> int | None:
    """Index of the static finding that explains a runtime event, or None."""
    same_line = [i for i, f in enumerate(findings) if f.path == path and f.line == line]
    if same_line or not guard:
        return same_line[0] if same_line else None
    guarded = re.findall(r"[A-Za-z_]\w*", guard.split("guard:", 1)[-1].replace("tensor ", "", 1))
    variable = guarded[0] if guarded else ""
    in_function = [i for i, f in enumerate(findings)
                   if f.path == path and function and f.function.split(".")[-1] == function]
    naming = [i for i in in_function if variable and variable in findings[i].message]
    if not naming and any(word in variable for word in ("past", "cache", "kv")):
        naming = [i for i in in_function if findings[i].code.startswith("GM30")]
    candidates = naming or in_function
    return min(candidates, key=lambda i: abs(findings[i].line - line)) if candidates else None
