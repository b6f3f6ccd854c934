"""The Decode ms-per-step chart of a report (matplotlib, imported only when a chart is drawn)."""
from __future__ import annotations

from pathlib import Path


def _run_style(color: str, label: str, n: int, runs: int) -> dict:
    """How run `n` (from 0) of a side's `runs` is drawn. The legend names both line weights: run 1 bold, later runs
    faint (run 1 of the graph side compiles cold; the others read the compile cache)."""
    if n == 0:
        first = f"{label}: run 1" + (" (bold)" if runs > 1 else "")
        return {"color": color, "alpha": 0.85, "linewidth": 1.4, "label": first}
    return {"color": color, "alpha": 0.45, "linewidth": 0.9,
            "label": f"{label}: runs 2-{runs} (faint)" if n == 1 else None}


def decode_chart(verification: dict, path: Path) -> str | None:
    """A PNG of Decode ms per step, every run of each side; the file name, or None without data."""
    per_step = verification.get("decode_ms_per_step") or {}
    if not any(per_step.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    styles = {"eager": ("tab:blue", "eager original"), "graph": ("tab:orange", f"graph ({verification['backend']})")}
    fig, (whole, steady) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for side, runs in per_step.items():
        color, label = styles.get(side, ("tab:gray", side))
        for n, steps in enumerate(runs):
            kwargs = _run_style(color, label, n, len(runs))
            whole.plot(range(1, len(steps) + 1), steps, marker="o", markersize=2.5, **kwargs)
            steady.plot(range(2, len(steps) + 1), steps[1:], marker="o", markersize=2.5, **kwargs)
    whole.set_yscale("log")
    whole.set_title("Every Decode step (step 1 = warm-up/compile)", fontsize=10)
    steady.set_yscale("log")
    steady.set_title("Steady state: steps 2..N", fontsize=10)
    for ax in (whole, steady):
        ax.set_xlabel("Decode step")
        ax.set_ylabel("ms per step (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Decode ms/step, {verification.get('runs', 1)} fresh process(es) per side", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path.name
