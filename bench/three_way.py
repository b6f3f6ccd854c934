"""Decode speed of the bundled example three ways, in one process: eager original, graphmode-adapted, hand-written.

    python bench/three_way.py [--backend inductor] [--steps 32] [--repeats 5] [--threads N]
                              [--hand-attention sdpa|matmul] [--shape default|larger] [--clock wall|thread]

- eager:   examples/legacy_llm/model.py as it is, driven like its harness (concatenated cache), eagerly.
- adapted: the same file through transforms.pipeline.adapt_source (all codemods, with the fused operators of the
           backend's hardware, as `graphmode adapt --backend` writes them), Prefill eager,
           `model.decode` compiled with the backend (fullgraph=True, dynamic=False).
- hand:    bench/handwritten_llm.py (gpt-fast style) with the original's weights, Prefill eager,
           `forward` on one token compiled with the same backend.

Both model.py files are imported under unique module names (no harness, no `from model import`).
Compilation and one warm-up generation happen before timing. The repeats are interleaved
(eager, adapted, hand, eager, ...) so machine noise hits all three alike; each repeat is one
Prefill plus `steps` Decode steps, and its figure is the median Decode ms/step. Printed: the
median [min, max] over repeats, and the ratios. Goal: adapted / hand <= 1.0.

`--shape larger` builds all three at dim 1024, 8 layers, 16 heads over 4 KV heads (hidden 2816), where the
weights, not the per-step overhead, take most of a step. `--clock thread` times each step in this thread's CPU time
(`time.thread_time`) instead of wall time: with `--threads 1` all of a step's work runs in this thread, and on a
machine shared with other work the time other processes take from it no longer counts.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/three_way.py` from anywhere
    sys.path.insert(0, str(ROOT))

from graphmode.runners.backends import Backend, resolve  # noqa: E402
from graphmode.runners.harness import next_token_logits  # noqa: E402
from graphmode.transforms.codemods import Options  # noqa: E402
from graphmode.transforms.output.helper_module import helper_modules  # noqa: E402
from graphmode.transforms.pipeline import adapt_source  # noqa: E402

EXAMPLE = ROOT / "examples" / "legacy_llm"
MAX_SEQ_LEN = 64
VERSIONS = ("eager", "adapted", "hand")
# ModelArgs fields over the example's defaults (dim 128, 2 layers, 4 heads over 2 KV heads, hidden 344).
SHAPES = {
    "default": {},
    "larger": {"dim": 1024, "n_layers": 8, "n_heads": 16, "n_kv_heads": 4, "hidden_dim": 2816},
}
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def import_file(path: Path, name: str) -> ModuleType:
    """Imports one file under a module name of our choosing (registered first: dataclasses need it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_prompt(vocab_size: int) -> torch.Tensor:
    """The harness's prompt: 8 token ids from a fixed generator."""
    return torch.randint(0, vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))


class Version:
    """One way of running the model: prefill(prompt) eagerly, then step(token, pos) per Decode step."""

    def __init__(self, name: str, prefill: Callable, step: Callable):
        self.name, self.prefill, self.step = name, prefill, step
        self.medians: list[float] = []  # one median Decode ms/step per timed repeat
        self.tokens: torch.Tensor | None = None
        self.logits: list[torch.Tensor] = []

    def generate(self, prompt: torch.Tensor, steps: int, sync: Callable[[], None],
                 clock: Callable[[], float] = time.perf_counter) -> list[float]:
        """Prefill, then `steps` greedy Decode steps; returns ms per Decode step, as `clock` counts them."""
        logits, state = self.prefill(prompt)
        all_logits, tokens, times = [logits], [], []
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            tokens.append(token)
            sync()
            started = clock()
            logits, state = self.step(token, state)
            sync()
            times.append((clock() - started) * 1e3)
            all_logits.append(logits)
        self.tokens, self.logits = torch.cat(tokens, dim=1), all_logits
        return times


def build(backend: Backend, tmp: Path, hand_sdpa: bool, shape: str = "default") -> dict[str, Version]:
    sizes = {**SHAPES[shape], "max_seq_len": MAX_SEQ_LEN}
    original_mod = import_file(EXAMPLE / "model.py", "gm3_original_model")
    torch.manual_seed(0)  # the harness's build_model()
    original = original_mod.Transformer(original_mod.ModelArgs(**sizes)).eval()

    # The fused operators graphmode writes for this backend (`graphmode adapt --backend` chooses them the same way):
    # on CPU the attention stays the model's own for Inductor to fuse, not SDPA.
    adaptation = adapt_source((EXAMPLE / "model.py").read_text(), "model.py", None,
                              Options(max_seq_len=MAX_SEQ_LEN, entry_class="Transformer", fused_ops=backend.fused_ops))
    (tmp / "adapted").mkdir()
    written = {"model.py": adaptation.adapted}
    for name, text in {**written, **helper_modules(written)}.items():  # graphmode_static.py beside the model
        (tmp / "adapted" / name).write_text(text)
    sys.path.insert(0, str(tmp / "adapted"))  # the adapted file imports graphmode_static, as a harness has it
    adapted_mod = import_file(tmp / "adapted" / "model.py", "gm3_adapted_model")
    adapted = adapted_mod.Transformer(adapted_mod.ModelArgs(**sizes)).eval()
    adapted.load_state_dict(original.state_dict(), strict=True)
    adapted.setup_caches(max_batch_size=1, max_seq_length=MAX_SEQ_LEN)  # the static buffers, as the hand-written has

    hand_mod = import_file(Path(__file__).with_name("handwritten_llm.py"), "gm3_handwritten_llm")
    hand = hand_mod.Transformer(hand_mod.ModelArgs.like(original.args), sdpa=hand_sdpa).eval()
    hand.load_from(original)

    def eager_prefill(prompt):
        logits, cache = original(prompt, 0)
        return logits[:, -1, :], (cache, prompt.shape[1])

    def eager_step(token, state):
        cache, pos = state
        logits, cache = original(token, pos, cache)
        return logits[:, -1, :], (cache, pos + 1)

    adapted_decode = backend.compile(adapted.decode, fullgraph=True)

    def adapted_prefill(prompt):
        n = prompt.shape[1]
        out = adapted.prefill(prompt, torch.arange(n))
        return next_token_logits(out), n

    def adapted_step(token, pos):
        out = adapted_decode(token, torch.tensor([pos]))
        return next_token_logits(out), pos + 1

    hand_decode = backend.compile(hand.forward, fullgraph=True)

    def hand_prefill(prompt):
        n = prompt.shape[1]
        return hand(prompt, torch.arange(n))[:, -1, :], n

    def hand_step(token, pos):
        return hand_decode(token, torch.tensor([pos]))[:, -1, :], pos + 1

    return {
        "eager": Version("eager", eager_prefill, eager_step),
        "adapted": Version("adapted", adapted_prefill, adapted_step),
        "hand": Version("hand", hand_prefill, hand_step),
    }


def spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):8.3f}{unit} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads(N) first (0: torch's default); 1 is steadier on a busy machine")
    parser.add_argument("--hand-attention", choices=("sdpa", "matmul"), default="sdpa",
                        help="the hand-written model's attention: F.scaled_dot_product_attention "
                             "(gpt-fast) or the original's matmul/softmax")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="default",
                        help="the example's own sizes, or dim 1024, 8 layers, 16 heads over 4 KV heads")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall time, or this thread's CPU time (steadier on a shared machine; use --threads 1)")
    args = parser.parse_args()
    if args.steps + 8 > MAX_SEQ_LEN:
        parser.error(f"--steps must be at most {MAX_SEQ_LEN - 8} (prompt 8 + steps <= {MAX_SEQ_LEN})")
    if args.threads:
        torch.set_num_threads(args.threads)
    backend, _ = resolve(args.backend)
    assert backend.device == "cpu", "this benchmark runs on CPU backends"

    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        versions = build(backend, Path(tmp), args.hand_attention == "sdpa", args.shape)
        clock = CLOCKS[args.clock]
        prompt = make_prompt(512)
        warmup: dict[str, float] = {}
        for name, version in versions.items():  # compiles (first call) and warms up, untimed
            started = time.perf_counter()
            version.generate(prompt, args.steps, backend.synchronize)
            warmup[name] = time.perf_counter() - started
        with torch.compiler.set_stance("fail_on_recompile"):  # a recompile now would be timed
            for _ in range(args.repeats):
                for version in versions.values():
                    times = version.generate(prompt, args.steps, backend.synchronize, clock)
                    version.medians.append(statistics.median(times))

    eager, adapted, hand = (versions[n] for n in VERSIONS)
    same = all(torch.equal(v.tokens, eager.tokens) for v in versions.values())
    diffs = {n: max((a - b).abs().max().item() for a, b in zip(versions[n].logits, eager.logits))
             for n in ("adapted", "hand")}

    shape = ", ".join(f"{name} {value}" for name, value in SHAPES[args.shape].items()) or "the example's own sizes"
    print(f"backend {backend.name}, torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1, "
          f"prompt 8, {args.steps} Decode steps x {args.repeats} interleaved repeats, "
          f"hand-written attention: {args.hand_attention}; shape: {shape}; clock: {args.clock}")
    print(f"greedy tokens equal (all three): {same}; max |logit diff| vs eager: "
          f"adapted {diffs['adapted']:.2e}, hand {diffs['hand']:.2e}")
    print(f"{'version':<9} {'Decode ms/step: median [min, max] over repeats':<46} first run (compile+warm-up)")
    for version in versions.values():
        print(f"{version.name:<9} {spread(version.medians):<46} {warmup[version.name]:.2f} s")
    ratio = lambda a, b: [x / y for x, y in zip(a.medians, b.medians)]  # noqa: E731  per repeat
    print(f"adapted / hand : {spread(ratio(adapted, hand), 'x')}   (goal <= 1.0)")
    print(f"eager / adapted: {spread(ratio(eager, adapted), 'x')}   (graph-mode speed-up)")
    print(f"eager / hand   : {spread(ratio(eager, hand), 'x')}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
