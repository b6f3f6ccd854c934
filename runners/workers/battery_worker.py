"""The equivalence battery: the adapted model against the original beyond the one greedy sequence of the harness.

    python -m graphmode.runners.workers.battery_worker --original DIR --adapted DIR --backend NAME --out BATTERY.json

One fresh process builds both models from their harnesses (each `build_model` seeds itself, so the weights are
the same) and runs every row on both. A row that goes through the model's own path (its `forward`, its
`generate`, its harness loop) compares eager with eager and must give the same tokens and logits within the
tolerance; a row on the static path runs `prefill` eagerly and `decode` compiled with the verify backend. A row
the original itself cannot run is "n/a" with the reason, not a failure. "Verified" needs every other row to hold.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import torch

from graphmode.runners.backends import Backend, resolve
from graphmode.runners.harness import load_harness, logits_of, next_token_logits, size_static_path, \
    static_length
from graphmode.runners.verify.results import DEFAULT_LOGITS_ATOL as DEFAULT_ATOL
from graphmode.runners.workers.common import run_main

HELD, FAILED, NOT_APPLICABLE = "held", "failed", "n/a"
BATCH = 3
OWN_STEPS = 8


@dataclass
class Row:
    name: str
    path: str  # "own" (the model's own code, eager against eager) or "static" (the entries, decode compiled)
    status: str
    detail: str


class _NotRunnable(Exception):
    """The original itself cannot run the row: the row does not apply to this model."""


def _batch_prompt(prompt: torch.Tensor) -> torch.Tensor:
    """BATCH different prompts of the harness's length, made of its own token ids (valid for any vocabulary)."""
    generator = torch.Generator().manual_seed(7)
    rows = [prompt[0]] + [prompt[0][torch.randperm(prompt.shape[1], generator=generator)]
                          for _ in range(BATCH - 1)]
    return torch.stack(rows).to(prompt.device)


def _padded(prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_batch_prompt` with rows 1 and 2 left-padded (2 and 4 slots of id 0) and its 2-D mask."""
    ids = _batch_prompt(prompt)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _generate_positions(model: Any, mask: torch.Tensor) -> dict:
    """{"position_ids": each row's count of unpadded slots before each slot} where `forward` takes position_ids:
    generate()'s prepare_inputs_for_generation passes them so in every release. Some Hub code relies on it: left
    out, stable-code-3b's forward counts positions from 0 at every Decode step, whatever its cache holds."""
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return {}
    return {"position_ids": (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)}


def _padded_loop(model: Any, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> dict:
    """Greedy steps through `forward` by keyword, the caller's cache carried, the mask grown and the positions
    counted from it, as generate() does."""
    out = model(input_ids=ids, attention_mask=mask, use_cache=True, **_generate_positions(model, mask))
    logits = logits_of(out)[:, -1]
    seen, tokens = [logits], []
    for _ in range(steps):
        token = logits.argmax(-1, keepdim=True)
        tokens.append(token.squeeze(-1).tolist())
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        past = out.past_key_values if hasattr(out, "past_key_values") else out[1]
        positions = {name: value[:, -1:] for name, value in _generate_positions(model, mask).items()}
        out = model(input_ids=token, attention_mask=mask, past_key_values=past, use_cache=True, **positions)
        logits = logits_of(out)[:, -1]
        seen.append(logits)
    return {"tokens": tokens, "logits": seen}


def _compare(name: str, path: str, run: Callable[[Any, Any], Any], original: Any, adapted: Any,
             atol: float) -> Row:
    """Runs the row on both (`run` gives {"tokens": [...], "logits": [tensors]}, either or both): tokens must be
    equal, logits within atol."""
    try:
        expected = run(original, "original")
    except _NotRunnable as reason:
        return Row(name, path, NOT_APPLICABLE, str(reason))
    except Exception as error:  # the original's own limits: the row does not apply
        return Row(name, path, NOT_APPLICABLE, f"the original raises {type(error).__name__}: {_line(error)}")
    try:
        got = run(adapted, "adapted")
    except Exception as error:
        return Row(name, path, FAILED, f"the adapted model raises {type(error).__name__}: {_line(error)}")
    return _judged(name, path, expected, got, atol)


def _judged(name: str, path: str, expected: Any, got: Any, atol: float) -> Row:
    tokens_e, tokens_g = expected.get("tokens"), got.get("tokens")
    if tokens_e is not None and tokens_e != tokens_g:
        return Row(name, path, FAILED, f"tokens differ: original {_short(tokens_e)}, adapted {_short(tokens_g)}")
    logits_e, logits_g = expected.get("logits"), got.get("logits")
    if logits_e is not None:
        if [tuple(t.shape) for t in logits_e] != [tuple(t.shape) for t in logits_g]:
            return Row(name, path, FAILED, f"logits shapes differ: original {tuple(logits_e[0].shape)}, adapted "
                                           f"{tuple(logits_g[0].shape)}")
        worst = max(float((e.float() - g.float()).abs().max().nan_to_num(nan=float("inf")))
                    for e, g in zip(logits_e, logits_g))
        if not worst <= atol:
            return Row(name, path, FAILED, f"logits differ by up to {worst:.3g} (tolerance {atol:g})")
        return Row(name, path, HELD, f"same tokens, logits within {worst:.2g}" if tokens_e is not None
                   else f"logits within {worst:.2g}")
    return Row(name, path, HELD, "same tokens")


def _line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def _short(tokens: list) -> str:
    text = str(tokens)
    return text[:80] + ("..." if len(text) > 80 else "")


class Battery:
    """Both models, their harnesses and what every row needs."""

    def __init__(self, original_harness, original: torch.nn.Module, adapted_harness, adapted: torch.nn.Module,
                 backend: Backend, atol: float = DEFAULT_ATOL, length: int | None = None) -> None:
        self.original_harness, self.original = original_harness, original.eval()
        self.adapted_harness, self.adapted = adapted_harness, adapted.eval()
        self.prompt = original_harness.make_prompt().to(backend.device)
        # The sized length: the static path's (a revision at confirmation may have made it other than the harness's).
        self.max_seq_len = static_length(adapted_harness, length)
        size_static_path(self.adapted, adapted_harness, self.prompt.shape[0], self.max_seq_len)
        self.backend, self.atol = backend, atol

    @classmethod
    def from_folders(cls, original_dir: Path, adapted_dir: Path, backend: Backend, atol: float = DEFAULT_ATOL,
                     length: int | None = None):
        """Each folder's harness builds its model (seeded by the harness: the same weights on both sides)."""
        original_harness = load_harness(original_dir)
        original = original_harness.build_model().to(backend.device)
        _forget_modules_under(original_dir)  # packages too (remote code): the adapted folder has its own copies
        adapted_harness = load_harness(adapted_dir)
        adapted = adapted_harness.build_model().to(backend.device)
        return cls(original_harness, original, adapted_harness, adapted, backend, atol, length)

    @cached_property
    def compiled_decode(self):
        """The adapted `decode`, compiled once for every row on the static path."""
        return self.backend.compile(self.adapted.decode, True)

    def harness_of(self, side: str):
        return self.original_harness if side == "original" else self.adapted_harness

    def rows(self) -> list[Row]:
        with torch.inference_mode():
            rows = [self.padded_batch(), self.own_loop_batch(), self.two_conversations(), self.generate_strategies(),
                    self.near_sized_length(), self.two_static_conversations(), self.past_sized_length(),
                    self.padded_static_batch()]
        return rows

    # -- the model's own path: eager against eager ------------------------------------------------
    def padded_batch(self) -> Row:
        """Three prompts, two of them left-padded, with the 2-D mask, through `forward` by keyword."""
        ids, mask = _padded(self.prompt)

        def run(model, side):
            parameters = inspect.signature(model.forward).parameters
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
            if not takes_any and not {"input_ids", "attention_mask"} <= set(parameters):
                raise _NotRunnable("`forward` takes no `input_ids` and `attention_mask`")
            return {"logits": [logits_of(model(input_ids=ids, attention_mask=mask))]}

        return _compare("batch 3, left padding, 2-D mask", "own", run, self.original, self.adapted, self.atol)

    def own_loop_batch(self) -> Row:
        """The harness's own prefill/decode with three prompts at once (the caller carries the cache)."""
        prompt = _batch_prompt(self.prompt)

        def run(model, side):
            return self._own_loop(self.harness_of(side), model, prompt, OWN_STEPS)

        return _compare(f"the model's own loop, batch {BATCH}, {OWN_STEPS} steps", "own", run, self.original,
                        self.adapted, self.atol)

    def two_conversations(self) -> Row:
        """Two prompts interleaved step by step through the harness's own loop, each with its own state."""
        second = _batch_prompt(self.prompt)[1:2]

        def run(model, side):
            harness = self.harness_of(side)
            logits_a, state_a = harness.prefill(model, self.prompt)
            logits_b, state_b = harness.prefill(model, second)
            seen, tokens = [logits_a, logits_b], [[], []]
            for _ in range(OWN_STEPS):
                for index in (0, 1):
                    token = seen[-2].argmax(-1, keepdim=True)
                    tokens[index].append(int(token[0, 0]))
                    if index == 0:
                        logits, state_a = harness.decode(model, token.clone(), state_a)
                    else:
                        logits, state_b = harness.decode(model, token.clone(), state_b)
                    seen.append(logits)
            return {"tokens": tokens, "logits": seen}

        return _compare("two conversations interleaved, the model's own loop", "own", run, self.original,
                        self.adapted, self.atol)

    def generate_strategies(self) -> Row:
        """`generate()` greedy, with 3 beams and with use_cache=False, where the model has it (Hugging Face)."""
        def run(model, side):
            if not callable(getattr(model, "generate", None)):
                raise _NotRunnable("the model has no `generate()`")
            tokens = []
            for options in ({"do_sample": False}, {"do_sample": False, "num_beams": 3},
                            {"do_sample": False, "use_cache": False}):
                out = model.generate(self.prompt, max_new_tokens=6, pad_token_id=0, **options)
                tokens.append(out.tolist())
            return {"tokens": tokens}

        return _compare("generate(): greedy, 3 beams, use_cache=False", "own", run, self.original, self.adapted,
                        self.atol)

    def _own_loop(self, harness, model, prompt: torch.Tensor, steps: int) -> dict:
        logits, state = harness.prefill(model, prompt)
        seen, tokens = [logits], []
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            tokens.append(token.squeeze(-1).tolist())
            logits, state = harness.decode(model, token.clone(), state)
            seen.append(logits)
        return {"tokens": tokens, "logits": seen}

    # -- the static path: the entries, Decode compiled ------------------------------------------------
    def near_sized_length(self) -> Row:
        """Prompt plus generation up to the last slot the static buffers hold, Decode compiled."""
        steps = self.max_seq_len - self.prompt.shape[1] - 1
        name = f"prompt {self.prompt.shape[1]} + {steps} steps: the last slot of {self.max_seq_len}"
        try:
            expected = self._own_loop(self.original_harness, self.original, self.prompt, steps)
        except Exception as error:
            return Row(name, "static", NOT_APPLICABLE, f"the original raises {type(error).__name__}: {_line(error)}")
        try:
            got = self._static_loop(self.prompt, steps)
        except Exception as error:
            return Row(name, "static", FAILED, f"the adapted entries raise {type(error).__name__}: {_line(error)}")
        return _judged(name, "static", expected, got, self.atol)

    def two_static_conversations(self) -> Row:
        """Two prompts interleaved step by step on the static path, each conversation held and restored in turn
        (`GraphmodeStaticPath.hold`/`restore`), against each prompt alone on the original."""
        name = "two conversations interleaved on the static path (hold/restore)"
        switch = getattr(inspect.getmodule(type(self.adapted)), "GraphmodeStaticPath", None)
        if not (callable(getattr(switch, "hold", None)) and callable(getattr(switch, "restore", None))):
            return Row(name, "static", NOT_APPLICABLE,
                       "the adapted entry module has no GraphmodeStaticPath.hold/restore")
        prompts = [self.prompt, _batch_prompt(self.prompt)[1:2]]
        try:
            expected = [self._own_loop(self.original_harness, self.original, p, OWN_STEPS) for p in prompts]
        except Exception as error:
            return Row(name, "static", NOT_APPLICABLE, f"the original raises {type(error).__name__}: {_line(error)}")
        try:
            got = self._interleaved_static(prompts, switch)
        except Exception as error:
            return Row(name, "static", FAILED, f"the adapted entries raise {type(error).__name__}: {_line(error)}")
        return _judged(name, "static", {"tokens": [e["tokens"] for e in expected],
                                        "logits": [t for e in expected for t in e["logits"]]},
                       {"tokens": [g["tokens"] for g in got], "logits": [t for g in got for t in g["logits"]]},
                       self.atol)

    def padded_static_batch(self) -> Row:
        """The left-padded batch of `padded_batch` on the static path: `prefill`/`decode` with its padding mask at the
        full length (Decode compiled), against the original's own loop with the mask growing, as generate() runs."""
        name = f"batch {BATCH}, left padding, 2-D mask, {OWN_STEPS} steps"
        ids, mask = _padded(self.prompt)
        if "attention_mask" not in inspect.signature(self.adapted.prefill).parameters:
            return Row(name, "static", NOT_APPLICABLE, "not offered: the entries take no padding mask (their rows "
                                                       "share one set of positions); padded batches go through "
                                                       "`forward`, as the row above")
        try:
            expected = _padded_loop(self.original, ids, mask, OWN_STEPS)
        except Exception as error:
            return Row(name, "static", NOT_APPLICABLE, f"the original raises {type(error).__name__}: {_line(error)}")
        model, device = self.adapted, ids.device
        padding = torch.ones(BATCH, self.max_seq_len, dtype=mask.dtype, device=device)
        padding[:, : mask.shape[1]] = mask
        try:
            model.setup_caches(max_batch_size=BATCH, max_seq_length=self.max_seq_len)
            decode = self.backend.compile(model.decode, True)
            logits = next_token_logits(model.prefill(ids, torch.arange(ids.shape[1], device=device),
                                                     attention_mask=padding))
            got = {"tokens": [], "logits": [logits]}
            for step in range(OWN_STEPS):
                token = logits.argmax(-1, keepdim=True)
                got["tokens"].append(token.squeeze(-1).tolist())
                position = torch.tensor([ids.shape[1] + step], device=device)
                logits = next_token_logits(decode(token.clone(), position, attention_mask=padding)).clone()
                got["logits"].append(logits)
        except Exception as error:
            return Row(name, "static", FAILED, f"the adapted entries raise {type(error).__name__}: {_line(error)}")
        finally:
            # as the other rows found it
            size_static_path(model, self.adapted_harness, self.prompt.shape[0], self.max_seq_len)
        judged = _judged(name, "static", expected, got, self.atol)
        if judged.status != FAILED:
            return judged
        return self._judged_by_rows_alone(name, ids, mask, expected, got) or judged

    def _judged_by_rows_alone(self, name: str, ids: torch.Tensor, mask: torch.Tensor, padded: dict,
                              got: dict) -> Row | None:
        """Where the static path differs from the original's padded loop, the original's own loop on each row alone,
        unpadded, is the reference, if the original's padded loop differs from it too: that original does not serve
        left padding in its Decode steps (GIT widens the mask by image tokens a text-only cache does not hold), so
        its padded figures prove nothing about the adaptation. The row holds where the static path gives each row's
        own tokens; None where the original's padded loop agrees with its rows alone (the failure stands)."""
        unpadded = [ids[r:r + 1, int((mask[r] == 0).sum()):] for r in range(ids.shape[0])]
        try:
            alone = [_padded_loop(self.original, row, torch.ones_like(row), OWN_STEPS) for row in unpadded]
        except Exception:
            return None  # the original cannot run a row alone: the padded loop stays the reference
        rows = {"tokens": [[row["tokens"][step][0] for row in alone] for step in range(OWN_STEPS)],
                "logits": [torch.cat([row["logits"][step] for row in alone]) for step in range(OWN_STEPS + 1)]}
        if _judged(name, "static", padded, rows, self.atol).status != FAILED:
            return None
        judged = _judged(name, "static", rows, got, self.atol)
        if judged.status == FAILED:
            return Row(name, "static", FAILED,
                       f"{judged.detail}, against each row run alone, unpadded, by the original")
        return Row(name, "static", HELD, f"{judged.detail} as each row run alone, unpadded, by the original, whose own "
                                         f"padded loop gives other tokens ({_short(padded['tokens'])}): it does "
                                         "not serve left padding in Decode")

    def _interleaved_static(self, prompts: list[torch.Tensor], switch) -> list[dict]:
        model, device, decode = self.adapted, self.prompt.device, self.compiled_decode
        runs, held = [], []
        for prompt in prompts:
            logits = next_token_logits(model.prefill(prompt, torch.arange(prompt.shape[1], device=device)))
            runs.append({"tokens": [], "logits": [logits], "length": prompt.shape[1]})
            held.append(switch.hold(model))
        for step in range(OWN_STEPS):
            for run, state in zip(runs, held):
                switch.restore(model, state)
                token = run["logits"][-1].argmax(-1, keepdim=True)
                run["tokens"].append(token.squeeze(-1).tolist())
                position = torch.tensor([run["length"] + step], device=device)
                run["logits"].append(next_token_logits(decode(token.clone(), position)).clone())
                state.update(switch.hold(model))
        return runs

    def _static_loop(self, prompt: torch.Tensor, steps: int) -> dict:
        model, device, decode = self.adapted, prompt.device, self.compiled_decode
        logits = next_token_logits(model.prefill(prompt, torch.arange(prompt.shape[1], device=device)))
        seen, tokens = [logits], []
        for step in range(steps):
            token = logits.argmax(-1, keepdim=True)
            tokens.append(token.squeeze(-1).tolist())
            position = torch.tensor([prompt.shape[1] + step], device=device)
            logits = next_token_logits(decode(token.clone(), position)).clone()
            seen.append(logits)
        return {"tokens": tokens, "logits": seen}

    def past_sized_length(self) -> Row:
        """A prompt longer than the static buffers were set up for must be refused with a message that names the
        sizes and the sizing call, never an index error deep inside attention. Where graphmode sized nothing (the
        model's own buffers), the adapted entries may fail as the original does."""
        length = self.max_seq_len + 1
        prompt = self.prompt.repeat(1, length // self.prompt.shape[1] + 1)[:, :length]
        name = f"a prompt of {length}, past the {self.max_seq_len} slots"
        try:
            self.adapted.prefill(prompt, torch.arange(length, device=prompt.device))
        except ValueError as error:
            if "setup_caches" in str(error) and str(self.max_seq_len) in str(error):
                return Row(name, "static", HELD, f"refused: {_line(error)}")
            failure = f"refused without naming the size and the sizing call (`setup_caches`): {_line(error)}"
        except Exception as error:
            failure = f"not refused: {type(error).__name__}: {_line(error)}"
        else:
            return Row(name, "static", NOT_APPLICABLE, "the entries take it: nothing in the adapted model is sized")
        try:
            self.original_harness.prefill(self.original, prompt)
        except Exception as error:
            return Row(name, "static", NOT_APPLICABLE, f"the original's own buffers refuse it too "
                                                       f"({type(error).__name__}: {_line(error)})")
        return Row(name, "static", FAILED, failure)


def _forget_modules_under(folder: Path) -> None:
    """Drops every imported module whose file lies in `folder`, so the next folder's imports load its own."""
    root = folder.resolve()
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(root):
            del sys.modules[name]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m graphmode.runners.workers.battery_worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--original", type=Path, required=True)
    parser.add_argument("--adapted", type=Path, required=True)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--static-length", type=int, metavar="N",
                        help="positions the adapted model's static path is set up for (default: the harness's "
                             "MAX_SEQ_LEN)")
    args = parser.parse_args(argv)
    backend, _ = resolve(args.backend)
    rows = Battery.from_folders(args.original.resolve(), args.adapted.resolve(), backend, args.atol,
                                args.static_length).rows()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(row) for row in rows], indent=2))


if __name__ == "__main__":
    raise SystemExit(run_main(main))
