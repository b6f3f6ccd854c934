"""How the UNMODIFIED model behaves in graph mode, in a fresh process, in triage order.

    python -m runners.workers.probe_worker --folder DIR --steps N --backend NAME --out PROBE.json

Decode, exactly as the harness calls it, is compiled with dynamic=False (the setting
verification uses) and run for N greedy steps, in the order skills/triage.md prescribes:

1. aot_eager: Dynamo + AOTAutograd, no backend code generation. Graph breaks (explain),
   recompiles with the guard that failed, a hit recompile limit, an exception. Expect a
   recompile every step from Python-int positions and growing caches (lessons 1-3). Any
   problem here is in the model code as Dynamo sees it, and triage stops.
2. force_eager: the target backend's own pipeline without capture (npugraph_ex
   options={"force_eager": True}; Inductor without CUDA graphs for cudagraphs; Inductor
   itself for inductor). Stages that cannot run here are recorded as skipped, with why.
3. backend: the target backend itself, when stage 2 was clean.

Every stage runs on a fresh, identically seeded model (forward may have first-call side
effects, lesson 6) and is fed the tokens of an eager run of the same steps, so its logits
are compared with eager step by step (lesson 5: eager and compiled can take different paths).

A stage that raises records the innermost error and the target's line (runners.probe.crash), and
its counts are not given as figures. `--inference-mode-as-no-grad` runs every
`torch.inference_mode` as `torch.no_grad` (see inference_mode_as_no_grad); the result then
names that change in `measured_with`.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch._dynamo.utils import counters

from graphmode.runners.backends import BACKEND_NAMES, get
from graphmode.runners.harness import load_harness, max_seq_len, sources
from graphmode.runners.measure.dynamo_watch import CompileWatch, SourceReason, explain_breaks, model_files
from graphmode.runners.measure.env_info import environment
from graphmode.runners.probe.crash import Crash, describe_crash
from graphmode.runners.workers.common import WorkerFailure, call_user, run_main

PROBE_BACKEND = "aot_eager"
LOGITS_ATOL = 1e-3
STAGES = ("aot_eager", "force_eager", "backend")
CLASSIFICATIONS = ("recompile", "graph_break", "compile_error", "mismatch", "ok")
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<func>.+)_at_\d+$")


def _relative(path: str | None, folder: Path) -> str | None:
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(folder))
    except ValueError:
        return path


def _function(name: str) -> str:
    """The user's function name for a Dynamo resume function ("torch_dynamo_resume_in_forward_at_65")."""
    match = _RESUME.match(name)
    return match["func"] if match else name


def _sites(reasons: list[SourceReason]) -> list[dict[str, Any]]:
    """Guard failures grouped by the source line they point at, in order of first sight.

    A Python-int position fails a different value every step ("pos == 8", "pos == 9", ...);
    the person needs the line and how often, not one entry per step. One entry per distinct
    (file, line): a resume function of `forward` that starts at a line is still that line.
    """
    grouped: OrderedDict[tuple[str, int | None], dict[str, Any]] = OrderedDict()
    for r in reasons:
        function = _function(r.function)
        site = grouped.setdefault((r.file, r.line), {"file": r.file, "line": r.line, "function": function,
                                                     "count": 0, "first_reason": r.reason})
        if function not in site["function"].split(", "):
            site["function"] += f", {function}"
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


# -- measuring code that enters inference mode --------------------------------------------------

INFERENCE_MODE_AS_NO_GRAD = ("every `torch.inference_mode` (the harness's, the model's and the probe's own) "
                             "run as `torch.no_grad`")


class _Unchanged(contextlib.ContextDecorator, contextlib.nullcontext):
    """`inference_mode(False)`: leaves the grad mode as it is, as a `with` block or a decorator."""


def _as_no_grad(mode: bool = True) -> contextlib.AbstractContextManager:
    return torch.no_grad() if mode else _Unchanged()


def inference_mode_as_no_grad() -> None:
    """Makes `torch.inference_mode` a `torch.no_grad` in this process.

    Why: on torch 2.13, Dynamo cannot compile a Decode that enters inference mode itself
    (`@torch.inference_mode()` on harness.decode, or a `with` block in it): AOTAutograd raises
    "Cannot set version_counter for inference tensor" and nothing is measured. no_grad computes the
    same values without autograd and Dynamo traces it, so the graph breaks and recompiles of the rest
    of the code can still be counted; the probe's result names the substitution (`measured_with`).
    Must run before the harness is imported: a decorator binds `torch.inference_mode` then.
    """
    torch.inference_mode = _as_no_grad
    torch.autograd.inference_mode = _as_no_grad
    torch.autograd.grad_mode.inference_mode = _as_no_grad


# -- one stage ---------------------------------------------------------------------------------

@dataclass
class Reference:
    """The eager run every stage is compared with: the tokens fed to each step, its logits."""
    tokens: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


@dataclass
class StageRun:
    graph_breaks: int = 0
    break_reasons: list[SourceReason] = field(default_factory=list)
    recompiles: list[SourceReason] = field(default_factory=list)
    limit_hit: bool = False
    graphs_per_step: list[int] = field(default_factory=list)
    diffs: list[float] = field(default_factory=list)
    crash: Crash | None = None  # what stopped the run, when something did

    @property
    def error(self) -> str | None:
        return self.crash.text() if self.crash else None

    @property
    def max_abs_diff(self) -> float | None:
        return max(self.diffs) if self.diffs else None

    def classification(self) -> str:
        # One word for the person: an exception first (nothing else is trustworthy then),
        # then recompiles (the main enemy, lesson 1), then graph breaks, then wrong numbers.
        if self.error is not None:
            return "compile_error"
        if self.recompiles or self.limit_hit:
            return "recompile"
        if self.graph_breaks:
            return "graph_break"
        if self.max_abs_diff is not None and self.max_abs_diff > LOGITS_ATOL:
            return "mismatch"
        return "ok"

    def summary(self) -> str:
        if self.error is not None:
            return f"raised while compiling or running the compiled step: {self.error}"
        parts = [f"{self.graph_breaks} graph break(s)", f"{len(self.recompiles)} recompile(s)"]
        if self.recompiles:
            parts[-1] += f" at {len(_sites(self.recompiles))} source line(s)"
        if self.limit_hit:
            parts.append(f"recompile_limit ({torch._dynamo.config.recompile_limit}) hit: "
                         "the rest ran eagerly")
        diff = self.max_abs_diff
        if diff is not None:
            relation = "within" if diff <= LOGITS_ATOL else "NOT within"
            parts.append(f"logits {relation} {LOGITS_ATOL:g} of eager (max abs diff {diff:.3g} "
                         f"over {len(self.diffs)} step(s))")
        return ", ".join(parts)


class _Target:
    """The harness and prompt, and fresh, identically seeded models on demand."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.harness = load_harness(folder)
        self.prompt = call_user("harness.make_prompt", folder, self.harness.make_prompt)
        self.first_model = self.fresh_model()

    def fresh_model(self, device: str = "cpu") -> torch.nn.Module:
        model = call_user("harness.build_model", self.folder, self.harness.build_model)
        return model.to(device) if device != "cpu" else model

    def prefill(self, model: torch.nn.Module, device: str) -> tuple[torch.Tensor, Any]:
        prompt = self.prompt.to(device)
        return call_user("harness.prefill", self.folder, lambda: self.harness.prefill(model, prompt))

    def decode_step(self) -> Callable[..., Any]:
        harness = self.harness

        def decode_step(model: torch.nn.Module, token: torch.Tensor, state: Any) -> Any:
            return harness.decode(model, token, state)

        return decode_step


def eager_reference(target: _Target, steps: int, device: str) -> Reference:
    """Greedy eager Decode on a fresh model: the tokens every stage is fed, and the logits."""
    ref = Reference()
    model = target.fresh_model(device)
    with torch.inference_mode():
        logits, state = target.prefill(model, device)
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)  # a fresh (B, 1) tensor (lesson 3)
            ref.tokens.append(token)
            logits, state = call_user("harness.decode", target.folder,
                                      lambda: target.harness.decode(model, token, state))
            ref.logits.append(logits.detach().float().cpu().clone())
    return ref


def run_stage(target: _Target, compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]],
              ref: Reference, device: str, explain: bool) -> StageRun:
    """Compiled Decode on a fresh model, fed the reference tokens; exceptions are recorded."""
    run = StageRun()
    folder, harness = target.folder, target.harness
    torch._dynamo.reset()
    with torch.inference_mode():
        if explain:
            # explain really runs one Decode step: on its own fresh model, so the measured
            # run below starts from exactly what Prefill leaves on a new model.
            model = target.fresh_model(device)
            _, state = target.prefill(model, device)
            try:
                run.graph_breaks, run.break_reasons = explain_breaks(
                    target.decode_step(), model, ref.tokens[0].clone(), state, root=folder,
                    own=model_files(model) if isinstance(model, torch.nn.Module) else frozenset())
            except Exception as exc:  # noqa: BLE001 - a compile failure is a finding here
                run.crash = describe_crash(exc, folder)
                return run
        model = target.fresh_model(device)
        _, state = target.prefill(model, device)
        breaks_before = _breaks_counted()
        compiled = compile_fn(target.decode_step())
        with CompileWatch(root=folder) as watch:
            try:
                for step, token in enumerate(ref.tokens):
                    before = watch.graphs
                    logits, state = compiled(model, token.clone(), state)
                    run.graphs_per_step.append(watch.graphs - before)
                    kept = logits.detach().float().cpu()
                    run.diffs.append(float((kept - ref.logits[step]).abs().max()))
                    if step == 0:
                        watch.mark()  # the first compile is expected; later ones are recompiles
            except Exception as exc:  # noqa: BLE001
                run.crash = describe_crash(exc, folder)
            run.recompiles = [_blame_harness(r, harness) for r in watch.recompiles]
            run.limit_hit = watch.limit_hit
        if not explain:
            run.graph_breaks = _breaks_counted() - breaks_before
    torch._dynamo.reset()
    return run


def _breaks_counted() -> int:
    """Graph breaks Dynamo has counted so far. torch 2.13 counts a break at an unsupported call (`print`) under
    `counters["graph_break"]`, but a data-dependent branch, the kind real model code breaks on most, only under
    `counters["unimplemented"]` (measured): both are needed."""
    return sum(counters["graph_break"].values()) + sum(counters["unimplemented"].values())


# -- the stages per backend ----------------------------------------------------------------------

def _stage_dict(name: str, backend: str, status: str, reason: str,
                run: StageRun | None = None) -> dict[str, Any]:
    # A run that crashed counted only what it saw before the crash: no figure, rather than a 0.
    counted = run is not None and run.crash is None
    return {
        "name": name,
        "backend": backend,
        "status": status,
        "reason": reason,
        "graph_breaks": run.graph_breaks if counted else None,
        "recompiles": len(run.recompiles) if counted else None,
        "recompile_limit_hit": run.limit_hit if counted else None,
        "logits_max_abs_diff": run.max_abs_diff if counted else None,
        "error": run.error if run else None,
        "crash": run.crash.to_dict() if run and run.crash else None,
        "classification": run.classification() if run else None,
    }


def _ran(name: str, backend: str, run: StageRun) -> dict[str, Any]:
    status = "passed" if run.classification() == "ok" else "failed"
    return _stage_dict(name, backend, status, run.summary(), run)


def triage(target: _Target, backend: str, steps: int, stage1: StageRun) -> dict[str, Any]:
    stages = [_ran("aot_eager", PROBE_BACKEND, stage1)]
    refs: dict[str, Reference] = {}

    def reference(device: str) -> Reference:
        if device not in refs:
            refs[device] = eager_reference(target, steps, device)
        return refs[device]

    def stopped() -> str | None:
        failed = next((s for s in stages if s["status"] == "failed"), None)
        if failed is None:
            return None
        return f"not run: triage stopped at stage {failed['name']} ({failed['classification']})"

    # Stage 2: the backend's own pipeline without capture.
    target_backend = get(backend)
    plan = target_backend.force_eager()
    if stopped():
        stages.append(_stage_dict("force_eager", plan.what, "skipped", stopped()))
    elif plan.unavailable is not None or plan.compile is None:
        stages.append(_stage_dict("force_eager", plan.what, "skipped", plan.unavailable or ""))
    else:
        stages.append(_ran("force_eager", plan.what,
                           run_stage(target, plan.compile, reference(plan.device), plan.device, False)))

    # Stage 3: the target backend itself.
    what3 = target_backend.stage_label
    same_as = target_backend.backend_stage_same_as
    if stopped():
        stages.append(_stage_dict("backend", what3, "skipped", stopped()))
    elif same_as is not None:
        earlier = next(s for s in stages if s["name"] == same_as)
        copied = dict(earlier, name="backend", backend=what3, reason=f"same as {same_as}")
        if earlier["status"] == "skipped":
            copied["reason"] = f"same as {same_as}, which was skipped: {earlier['reason']}"
        stages.append(copied)
    elif target_backend.available() is not None:
        stages.append(_stage_dict("backend", what3, "skipped", target_backend.available()))
    elif stages[1]["status"] == "skipped" and plan.compile is not None:
        stages.append(_stage_dict("backend", what3, "skipped",
                                  f"not run: the force_eager stage was skipped ({stages[1]['reason']})"))
    else:
        device3 = target_backend.device
        run = run_stage(target, lambda fn: target_backend.compile(fn, fullgraph=False),
                        reference(device3), device3, False)
        stages.append(_ran("backend", what3, run))

    failed = next((s for s in stages if s["status"] == "failed"), None)
    return {
        "stages": stages,
        "failed_stage": failed["name"] if failed else None,
        "classification": failed["classification"] if failed else "ok",
        # "ok" covers the stages that ran; these did not (not available here, or stopped).
        "skipped_stages": [s["name"] for s in stages if s["status"] == "skipped"],
        "target_backend": backend,
        "logits_atol": LOGITS_ATOL,
    }


def probe_model(folder: Path, steps: int, backend: str = PROBE_BACKEND,
                measured_with: str | None = None) -> dict[str, Any]:
    """`measured_with`: what was changed in this process before the target was loaded, or None."""
    target = _Target(folder)
    harness, model, prompt = target.harness, target.first_model, target.prompt
    entry = type(model)
    try:
        entry_file = inspect.getsourcefile(entry)
    except TypeError:
        entry_file = None

    ref = eager_reference(target, steps, "cpu")
    stage1 = run_stage(target, lambda fn: get(PROBE_BACKEND).compile(fn, fullgraph=False), ref, "cpu", True)
    recompiles = stage1.recompiles
    # A crashed run's counts stop at the crash: they are no figure for the model, so none is given.
    counted = stage1.crash is None

    return {
        "entry_class": entry.__name__,
        "entry_file": _relative(entry_file, folder),
        "max_seq_len": max_seq_len(harness),
        "sources": sources(harness, folder),
        "prompt_shape": list(prompt.shape),
        "backend": PROBE_BACKEND,
        "dynamic": False,
        "steps": steps,
        "crash": stage1.crash.to_dict() if stage1.crash else None,
        "measured_with": measured_with,
        "graph_breaks": stage1.graph_breaks if counted else None,
        "break_reasons": [{"reason": r.reason, "file": r.file, "line": r.line, "code": r.code, "inside": r.inside}
                          for r in stage1.break_reasons],
        "graphs_per_step": stage1.graphs_per_step,
        "recompiles": len(recompiles) if counted else None,
        "recompile_reasons": [f"{r.reason} ({r.file}:{r.line})" for r in recompiles],
        "recompile_sites": _sites(recompiles),
        "recompile_limit_hit": stage1.limit_hit if counted else None,
        "recompile_limit": torch._dynamo.config.recompile_limit,
        "triage": triage(target, backend, steps, stage1),
        "env": environment("cpu"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m graphmode.runners.workers.probe_worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--backend", default=PROBE_BACKEND, choices=[n for n in BACKEND_NAMES if n != "auto"],
                        help="the target backend triage ends with (default: aot_eager, stage 1 only)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--inference-mode-as-no-grad", action="store_true",
                        help="run every torch.inference_mode as torch.no_grad (see inference_mode_as_no_grad)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        raise WorkerFailure(f"--steps must be at least 2 to see a recompile, got {args.steps}")
    measured_with = None
    if args.inference_mode_as_no_grad:
        inference_mode_as_no_grad()  # before the harness is imported: its decorators bind at import
        measured_with = INFERENCE_MODE_AS_NO_GRAD
    result = probe_model(args.folder.resolve(), args.steps, args.backend, measured_with)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    raise SystemExit(run_main(main))
