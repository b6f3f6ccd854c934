"""How the UNMODIFIED model behaves in graph mode, in a fresh process.

    python -m runners.probe_worker --folder DIR --steps N --out PROBE.json

Decode, exactly as the harness calls it, is compiled with aot_eager and dynamic=False (the
settings verification uses) and run for N greedy steps. aot_eager is cheap to compile and
goes through Dynamo and AOTAutograd, which is where breaks and guards come from. Expect a
recompile every step from Python-int positions and growing caches (lessons 1-3).
"""
from __future__ import annotations

import argparse
import inspect
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from runners.backends import get
from runners.cli import WorkerFailure, call_user, run_main
from runners.dynamo_watch import CompileWatch, SourceReason, explain_breaks
from runners.env_info import environment
from runners.harness import load_harness, max_seq_len, sources

PROBE_BACKEND = "aot_eager"


def _relative(path: str | None, folder: Path) -> str | None:
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(folder))
    except ValueError:
        return path


def _sites(reasons: list[SourceReason]) -> list[dict[str, Any]]:
    """Guard failures grouped by the source line they point at, in order of first sight.

    A Python-int position fails a different value every step ("pos == 8", "pos == 9", ...);
    the person needs the line and how often, not one entry per step.
    """
    grouped: OrderedDict[tuple[str, int | None, str], dict[str, Any]] = OrderedDict()
    for r in reasons:
        key = (r.file, r.line, r.function)
        site = grouped.setdefault(key, {"file": r.file, "line": r.line, "function": r.function,
                                        "count": 0, "first_reason": r.reason})
        site["count"] += 1
        site["last_reason"] = r.reason
    return list(grouped.values())


def _blame_harness(reason: SourceReason, harness: Any) -> SourceReason:
    """Guards on decode_step's own arguments (e.g. a growing cache tensor) carry no user
    stack, so Dynamo names our wrapper; they are really about what harness.decode receives."""
    if Path(reason.file).resolve() != Path(__file__).resolve():
        return reason
    _, line = inspect.getsourcelines(harness.decode)
    return SourceReason(reason.reason, "harness.py", line, "decode (its arguments)")


def probe_model(folder: Path, steps: int) -> dict[str, Any]:
    harness = load_harness(folder)
    model = call_user("harness.build_model", folder, harness.build_model)
    prompt = call_user("harness.make_prompt", folder, harness.make_prompt)
    entry = type(model)
    try:
        entry_file = inspect.getsourcefile(entry)
    except TypeError:
        entry_file = None

    def decode_step(model: torch.nn.Module, token: torch.Tensor, state: Any) -> Any:
        return harness.decode(model, token, state)

    with torch.inference_mode():
        logits, state = call_user("harness.prefill", folder, lambda: harness.prefill(model, prompt))
        token = logits.argmax(-1, keepdim=True)
        graph_breaks, break_reasons = call_user("torch._dynamo.explain(harness.decode)", folder,
                                                 lambda: explain_breaks(decode_step, model, token, state, root=folder))
        # explain ran one real Decode step; some caches grow in place, so start again from Prefill.
        logits, state = call_user("harness.prefill", folder, lambda: harness.prefill(model, prompt))
        compiled = get(PROBE_BACKEND).compile(decode_step, fullgraph=False)
        graphs_per_step: list[int] = []
        with CompileWatch(root=folder) as watch:
            for step in range(steps):
                token = logits.argmax(-1, keepdim=True)  # fresh each step (lesson 3)
                before = watch.graphs
                logits, state = call_user("compiled harness.decode", folder,
                                           lambda: compiled(model, token, state))
                graphs_per_step.append(watch.graphs - before)
                if step == 0:
                    watch.mark()  # the first compile is expected; later ones are recompiles
            recompiles = [_blame_harness(r, harness) for r in watch.recompiles]
            limit_hit = watch.limit_hit

    return {
        "entry_class": entry.__name__,
        "entry_file": _relative(entry_file, folder),
        "max_seq_len": max_seq_len(harness),
        "sources": sources(harness, folder),
        "prompt_shape": list(prompt.shape),
        "backend": PROBE_BACKEND,
        "dynamic": False,
        "steps": steps,
        "graph_breaks": graph_breaks,
        "break_reasons": [{"reason": r.reason, "file": r.file, "line": r.line} for r in break_reasons],
        "graphs_per_step": graphs_per_step,
        "recompiles": len(recompiles),
        "recompile_reasons": [f"{r.reason} ({r.file}:{r.line})" for r in recompiles],
        "recompile_sites": _sites(recompiles),
        "recompile_limit_hit": limit_hit,
        "recompile_limit": torch._dynamo.config.recompile_limit,
        "env": environment("cpu"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runners.probe_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.steps < 2:
        raise WorkerFailure(f"--steps must be at least 2 to see a recompile, got {args.steps}")
    result = probe_model(args.folder.resolve(), args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    raise SystemExit(run_main(main))
