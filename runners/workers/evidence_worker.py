"""Runtime evidence of the UNMODIFIED model, in a fresh process (runners.evidence.collect starts it).

    python -m runners.workers.evidence_worker --folder DIR --steps N --out EVIDENCE.json

1. untraced: a fresh, seeded model runs the harness's Prefill and N greedy Decode steps; the
   tokens it chose and the logits of every step are kept.
2. traced: another fresh model (forward may have first-call side effects) runs the same Prefill
   and is fed the same tokens under the evidence trace. Its logits must equal step 1's bit for
   bit: the trace observes, it must never change what the model computes.

Every user call goes through runners.workers.common.call_user, so a harness that raises ends the worker
with one line naming the user's file:line.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from graphmode.runners import npu_standin
from graphmode.runners.evidence.analysis import analyse
from graphmode.runners.evidence.entry_calls import record_entry_calls
from graphmode.runners.evidence.model import DECODE, PREFILL
from graphmode.runners.evidence.tracer import EvidenceTracer
from graphmode.runners.harness import load_harness, sources
from graphmode.runners.workers.common import WorkerFailure, call_user, run_main


def _logits(result: Any, what: str) -> tuple[torch.Tensor, Any]:
    """(logits, state) from what harness.prefill/decode returned, or a one-line contract error."""
    if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[0], torch.Tensor):
        got = type(result).__name__ if not isinstance(result, tuple) else f"a tuple of {len(result)}"
        raise WorkerFailure(f"{what} must return (logits, state) with logits a tensor; got {got}")
    return result


def collect(folder: Path, steps: int, only: list[str] | None = None) -> dict[str, Any]:
    harness = load_harness(folder)
    files = only or sources(harness, folder)
    prompt = call_user("harness.make_prompt", folder, harness.make_prompt)
    if not isinstance(prompt, torch.Tensor):
        raise WorkerFailure(f"harness.make_prompt must return a LongTensor (batch, T); got {type(prompt).__name__}")

    with torch.inference_mode():
        model = call_user("harness.build_model", folder, harness.build_model)
        reference: list[torch.Tensor] = []
        tokens: list[torch.Tensor] = []
        run: dict[str, Any] = {}

        def prefill() -> None:
            run["logits"], run["state"] = _logits(call_user("harness.prefill", folder,
                                                            lambda: harness.prefill(model, prompt)), "harness.prefill")
            reference.append(run["logits"].clone())

        def decode() -> None:
            token = run["logits"].argmax(-1, keepdim=True)  # a fresh (B, 1) tensor every step
            tokens.append(token)
            run["logits"], run["state"] = _logits(call_user("harness.decode", folder, lambda: harness.decode(
                model, token, run["state"])), "harness.decode")
            reference.append(run["logits"].clone())

        started = time.perf_counter()
        # The untraced run also records how the harness calls the model's forward (runners.evidence.entry_calls).
        entry_calls = record_entry_calls(model, prefill, [decode] * steps, prompt.shape[-1]) \
            if isinstance(model, torch.nn.Module) else None
        untraced_s = time.perf_counter() - started

        model = call_user("harness.build_model", folder, harness.build_model)
        tracer = EvidenceTracer(folder, files)
        traced: list[torch.Tensor] = []
        started = time.perf_counter()
        with tracer.phase(PREFILL, 0):
            logits, state = _logits(call_user("harness.prefill", folder, lambda: harness.prefill(model, prompt)),
                                    "harness.prefill")
        traced.append(logits.clone())
        for step, token in enumerate(tokens, start=1):
            fed = token.clone()
            with tracer.phase(DECODE, step):
                logits, state = _logits(call_user("harness.decode", folder,
                                                  lambda: harness.decode(model, fed, state)), "harness.decode")
            traced.append(logits.clone())
        traced_s = time.perf_counter() - started

    new_tokens = int(tokens[0].shape[-1]) if tokens and tokens[0].dim() else 1
    evidence = analyse(tracer, steps, list(prompt.shape), new_tokens)
    evidence.untraced_s, evidence.traced_s = untraced_s, traced_s
    evidence.entry_calls = entry_calls.to_dict() if entry_calls else {}
    if entry_calls is not None and not entry_calls.recomputes_sequence:
        # The trace takes any integer input that grows for a token sequence; the harness's own calls say which
        # input holds the tokens. One new token beside a mask that grows (generate()'s 2-D attention mask) is a
        # model with a cache, fed a growing mask: that mask is its own finding, not "no KV cache".
        evidence.recomputes_sequence = None
    # The model's own calls: a library's check for a device (transformers' is_torch_npu_available) is not the model's.
    evidence.npu_stand_ins = [[call, local] for call, where in npu_standin.calls()
                              if (local := _in_folder(where, folder)) is not None]
    evidence.logits_equal = all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(reference, traced))
    evidence.max_abs_diff = max(float((a.float() - b.float()).abs().max()) if a.shape == b.shape else float("inf")
                                for a, b in zip(reference, traced))
    return evidence.to_dict()


def _in_folder(where: str, folder: Path) -> str | None:
    """"file:line" with the file relative to `folder`; None when the file lies outside it."""
    file, _, line = where.rpartition(":")
    path = Path(file)
    return f"{path.relative_to(folder)}:{line}" if path.is_relative_to(folder) else None


def main(argv: list[str] | None = None) -> None:
    import json

    parser = argparse.ArgumentParser(prog="python -m graphmode.runners.workers.evidence_worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sources", default="", help="comma-separated files to trace instead of the harness's SOURCES")
    args = parser.parse_args(argv)
    if args.steps < 2:
        raise WorkerFailure(f"--steps must be at least 2 to see what changes between Decode steps, got {args.steps}")
    result = collect(args.folder.resolve(), args.steps, args.sources.split(",") if args.sources else None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    raise SystemExit(run_main(main))
