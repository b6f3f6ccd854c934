"""A batch's summary: one row per target (summary.json, summary.md), the speed-up chart, and `--fail-on`.

A row is made once, when its target finishes, from the run's exit status and its report.json, and kept in the
store; the summary files are rewritten from the rows after every target and at the end, so a batch stopped or
killed half-way still leaves a summary that lists every target once.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphmode.agent.batch.job import LOG_NAME, JobOutcome
from graphmode.agent.batch.manifest import BatchTarget, Manifest
from graphmode.agent.batch.store import VERIFIED
from graphmode.agent.errors import UserError
from graphmode.agent.output import write_atomic
from graphmode.runners.measure.timing import UNSTABLE_QUALIFIER, qualified

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
CHART = "speedups.png"
PENDING = "pending"

# adapt's exit statuses (agent.cli.consoles): 0 verified, 1 not verified, 2 bad input, 3 internal error, 4 stopped for
# confirmation; anything else (killed by a signal, 130) is an error too.
_STATUS_BY_EXIT = {0: VERIFIED, 1: "not_verified", 2: "bad_input", 3: "error", 4: "stopped"}


def status_of(outcome: JobOutcome) -> str | None:
    """The target's status, or None when the batch itself stopped it (it has yet to run)."""
    if outcome.interrupted:
        return None
    if outcome.timed_out:
        return "timeout"
    return _STATUS_BY_EXIT.get(outcome.exit_code, "error")


def make_row(target: BatchTarget, outcome: JobOutcome, status: str, out: Path, executor: str) -> dict[str, Any]:
    """The summary row of a finished target: its status, and the figures of its report.json (None where it has
    none: a run that failed before verifying)."""
    report = outcome.report or {}
    folder = out / target.name
    run_folder = Path(outcome.report_path).parent if outcome.report_path else None
    return {
        "name": target.name,
        "target": target.shown_as,
        "backend": report.get("backend") or target.run.get("backend", "auto"),
        "status": status,
        "exit_code": outcome.exit_code,
        **_report_figures(report),
        "seconds": round(outcome.seconds, 1),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "problem": _problem(target, outcome, status, report.get("problems") or []),
        "report": _beside_report(run_folder, "report.md", out),
        "report_json": _beside_report(run_folder, "report.json", out),
        "design": _beside_report(run_folder, "design.md", out),
        "diff": _beside_report(run_folder, "planned.diff", out),
        "log": _relative(folder / LOG_NAME, out),
        "session": outcome.session,
        "executor": executor,
        "host": outcome.host,
    }


def _report_figures(report: dict[str, Any]) -> dict[str, Any]:
    """The row's figures read from the target's report.json (None where it has none)."""
    fusion = report.get("fusion") or {}
    return {
        "findings": report.get("findings"),
        "fixed_automatically": report.get("findings_fixed"),
        "changes_applied": len(report["changes_applied"]) if "changes_applied" in report else None,
        "manual_items": report.get("manual_items"),
        "graph_breaks": report.get("graph_breaks"),
        "recompiles": report.get("recompiles"),
        "tokens_equal": report.get("tokens_equal"),
        "decode_speedup": report.get("decode_speedup"),
        # The report's own verdict (runners.measure.timing.speedup_unstable): too spread over the runs to quote.
        "decode_speedup_unstable": report.get("decode_speedup_unstable"),
        "runs": report.get("runs"),
        # Design -> verify rounds the target took (agent.workflow.repair; None before one was reported), and what a
        # bisection left out.
        "rounds": len(report["rounds"]) if report.get("rounds") else None,
        "dropped": [d["codemod"] for d in report.get("dropped") or []],
        # With fusions applied: Decode without them over Decode with them, timed in the same runs (None without).
        "fusion_speedup": fusion.get("speedup", {}).get("median"),
        "fusion_speedup_unstable": fusion.get("unstable") if fusion else None,
        "warmup_s": report.get("warmup_s"),
    }


def _beside_report(run_folder: Path | None, name: str, out: Path) -> str | None:
    """A file the run wrote beside its report.json, relative to the batch folder; None when it has none."""
    return _relative(run_folder / name, out) if run_folder is not None and (run_folder / name).exists() else None


def _problem(target: BatchTarget, outcome: JobOutcome, status: str, problems: list[str]) -> str | None:
    """What the summary says went wrong with a target: why it stopped, else its report's first problem, else the
    job's error; None for a verified one."""
    if status == "timeout":
        return f"stopped after {target.target_timeout:g} s (target_timeout, or --timeout)"
    if status == "stopped":
        return f"stopped for confirmation (yes = false): graphmode resume {outcome.session}"
    if status == VERIFIED:
        return None
    return problems[0] if problems else outcome.error


def _relative(path: Path, out: Path) -> str:
    return os.path.relpath(path, out)


def pending_row(target: BatchTarget) -> dict[str, Any]:
    return {"name": target.name, "target": target.shown_as, "backend": target.run.get("backend", "auto"),
            "status": PENDING}


def failed(row: dict[str, Any]) -> bool:
    return row["status"] != VERIFIED


@dataclass(frozen=True)
class FailOn:
    """A --fail-on condition: `manual` (any item left for a person) or `speedup<X` (a Decode speed-up below X)."""

    kind: str
    threshold: float | None = None

    def breaches(self, row: dict[str, Any]) -> str | None:
        """Why the row fails this condition, or None."""
        if self.kind == "manual" and (row.get("manual_items") or 0) > 0:
            return f"{row['manual_items']} item(s) left for a person"
        speedup = row.get("decode_speedup")
        if self.kind == "speedup" and speedup is not None and speedup < self.threshold:
            return f"Decode speed-up {speedup_text(row)} is below {self.threshold:g}x"
        return None

    def __str__(self) -> str:
        return "manual" if self.kind == "manual" else f"speedup<{self.threshold:g}"


_SPEEDUP = re.compile(r"speedup\s*<\s*([0-9]*\.?[0-9]+)\Z")


def parse_fail_on(specs: list[str]) -> list[FailOn]:
    """`--fail-on` values (repeated, or comma-separated): manual, speedup<X."""
    conditions = []
    for spec in specs:
        for part in (p.strip() for p in spec.split(",")):
            matched = _SPEEDUP.match(part)
            if part == "manual":
                conditions.append(FailOn("manual"))
            elif matched and math.isfinite(float(matched.group(1))):
                conditions.append(FailOn("speedup", float(matched.group(1))))
            else:
                raise UserError(f"--fail-on {part!r}: give manual (any item left for a person) or speedup<X (a "
                                "Decode speed-up below X, e.g. speedup<1.2), comma-separated or repeated")
    return conditions


def breaches(rows: list[dict[str, Any]], conditions: list[FailOn]) -> list[str]:
    """Every --fail-on condition a target breaches, as 'name: why'."""
    return [f"{row['name']}: {why} (--fail-on {condition})" for row in rows for condition in conditions
            if (why := condition.breaches(row))]


def write_summary(manifest: Manifest, rows: list[dict[str, Any]], conditions: list[FailOn], *,
                  chart: bool) -> dict[str, Any]:
    """summary.json and summary.md (and, with `chart`, the speed-up PNG) in the batch folder; returns the JSON."""
    out = manifest.out
    chart_name = speedup_chart(rows, out / CHART) if chart else (CHART if (out / CHART).is_file() else None)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    summary = {
        "manifest": str(manifest.path),
        "out": str(out),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "targets": len(rows),
        "counts": counts,
        "failed": [row["name"] for row in rows if failed(row)],
        "fail_on": [str(c) for c in conditions],
        "fail_on_breaches": breaches(rows, conditions),
        "chart": chart_name,
        "rows": rows,
    }
    write_atomic(out / SUMMARY_JSON, json.dumps(summary, indent=2) + "\n")
    write_atomic(out / SUMMARY_MD, _markdown(summary))
    return summary


COLUMNS = ("target", "status", "rounds", "findings", "fixed automatically", "left for a person", "graph breaks",
           "recompiles", "tokens equal", "Decode speed-up", "warm-up s", "time s")


def cells(row: dict[str, Any]) -> list[str]:
    """A row as the table's cells (summary.md and the terminal's table)."""
    def number(value: Any, form: str = "{}") -> str:
        return "" if value is None else form.format(value)

    tokens = row.get("tokens_equal")
    return [row["name"], row["status"].replace("_", " "), number(row.get("rounds")), number(row.get("findings")),
            number(row.get("fixed_automatically")), number(row.get("manual_items")), number(row.get("graph_breaks")),
            number(row.get("recompiles")), "" if tokens is None else ("yes" if tokens else "no"),
            speedup_text(row), number(row.get("warmup_s"), "{:.1f}"),
            number(row.get("seconds"), "{:.0f}")]


def speedup_text(row: dict[str, Any]) -> str:
    """The Decode speed-up as the summary shows it: marked unstable where the target's report calls it so."""
    speedup = row.get("decode_speedup")
    if speedup is None:
        return ""
    return qualified(f"{speedup:.2f}x", row.get("decode_speedup_unstable"))


UNSTABLE_NOTE = (f"Speed-ups marked *{UNSTABLE_QUALIFIER}* spread more than 1.5x over their target's runs, and the "
                 "target's report says so too: do not quote them. Rerun those targets on a quiet machine, with more "
                 "`runs`.")


def _markdown(summary: dict[str, Any]) -> str:
    rows = summary["rows"]
    lines = [f"# graphmode batch: {Path(summary['manifest']).name}", "",
             f"Manifest `{summary['manifest']}`, written {summary['written_at']}. "
             + ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in sorted(summary["counts"].items())) + ".",
             "", "| " + " | ".join(COLUMNS) + " | report |", "|" + "---|" * (len(COLUMNS) + 1)]
    lines += [_table_line(row) for row in rows]
    if any(row.get("decode_speedup_unstable") for row in rows):
        lines += ["", UNSTABLE_NOTE]
    lines += _fusions_paragraph(rows) + _dropped_paragraph(rows)
    if summary["chart"]:
        lines += ["", f"![Decode speed-up per target]({summary['chart']})"]
    lines += _problems_section(rows) + _fail_on_section(summary)
    return "\n".join(lines) + "\n"


def _table_line(row: dict[str, Any]) -> str:
    """A target's row of the Markdown table, linking its report (else its log)."""
    link = f"[report]({row['report']})" if row.get("report") else (f"[log]({row['log']})" if row.get("log") else "")
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells(row)) + f" | {link} |"


def _fusions_paragraph(rows: list[dict[str, Any]]) -> list[str]:
    """The fusion speed-up of each target that applied fusions; nothing when none did."""
    fused = [row for row in rows if row.get("fusion_speedup") is not None]
    if not fused:
        return []
    return ["", "Fusions: Decode without them over Decode with them, timed in the same runs: " + ", ".join(
        f"{row['name']} {qualified(format(row['fusion_speedup'], '.2f') + 'x', row.get('fusion_speedup_unstable'))}"
        for row in fused) + "."]


def _dropped_paragraph(rows: list[dict[str, Any]]) -> list[str]:
    """The codemods a bisection left out, per target; nothing when none was."""
    dropped = [row for row in rows if row.get("dropped")]
    if not dropped:
        return []
    return ["", "Left out after a bisection found they change the tokens: " + ", ".join(
        f"{row['name']} ({', '.join(f'`{name}`' for name in row['dropped'])})" for row in dropped) + "."]


def _problems_section(rows: list[dict[str, Any]]) -> list[str]:
    """Each target's problem, under a heading; nothing when no target has one."""
    problems = [row for row in rows if row.get("problem")]
    if not problems:
        return []
    return ["", "## Problems", ""] + [f"- **{row['name']}** ({row['status'].replace('_', ' ')}): {row['problem']}"
                                      for row in problems]


def _fail_on_section(summary: dict[str, Any]) -> list[str]:
    """The --fail-on limits and what breaches them; nothing without --fail-on."""
    if not summary["fail_on"]:
        return []
    return (["", f"## --fail-on {','.join(summary['fail_on'])}", ""]
            + ([f"- {breach}" for breach in summary["fail_on_breaches"]] or ["- no target breaches it"]))


def _mark_unstable(bars: Any, rows: list[dict[str, Any]]) -> None:
    """Pale, hatched bars for unstable speed-ups: a figure that must not be read as measured."""
    for bar, row in zip(bars, rows):
        if row.get("decode_speedup_unstable"):
            bar.set_alpha(0.35)
            bar.set_hatch("//")


def speedup_chart(rows: list[dict[str, Any]], path: Path) -> str | None:
    """A PNG of each target's Decode speed-up (bars; the verified ones green); the file name, or None when no
    target has a speed-up to show. matplotlib is imported only here."""
    shown = [row for row in rows if row.get("decode_speedup") is not None]
    if not shown:
        path.unlink(missing_ok=True)  # an earlier chart would show figures this summary no longer has
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    names = [row["name"] for row in shown]
    speedups = [row["decode_speedup"] for row in shown]
    colors = ["tab:green" if row["status"] == VERIFIED else "tab:red" for row in shown]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.4 * len(shown)), dpi=110)
    bars = ax.barh(range(len(shown)), speedups, color=colors)
    _mark_unstable(bars, shown)
    ax.bar_label(bars, labels=[speedup_text(row) for row in shown], padding=3, fontsize=8)
    ax.axvline(1.0, color="gray", linewidth=1, linestyle="--")
    ax.set_yticks(range(len(shown)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("Decode speed-up, graph over eager (green: verified, red: not; hatched: unstable, not to quote)")
    ax.set_xlim(0, max(max(speedups) * 1.2, 1.2))  # the 1.0x line always shows
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path.name
