"""What the adapted static path allocates at published model shapes, against the KV cache it has to hold.

    python bench/real_size.py [--shapes NAME,...] [--run-1b] [--run-mla] [--positions 4096] [--steps 32] [--threads N]

For each shape below, the transformers release's own modeling file is adapted by graphmode's chain (as
`graphmode fix --entry-class <Model>ForCausalLM` would), and the original and the adapted model are built from the
published config on the meta device, in bf16, as `from_pretrained` builds a model before it loads weights. Then
`setup_caches(1, L)` at the model's own context length L, and the bytes of every buffer and tensor the adapted model
holds that the original does not (meta tensors: counted, never allocated) are printed next to the bytes of a bf16
KV cache of that length (2 x layers x KV heads x head size x L x 2 bytes; for multi-head latent attention, DeepSeek's,
what serving engines cache: layers x L x (kv_lora_rank + qk_rope_head_dim) x 2 bytes, the latent and the rope key).
Goal: at most 1.02x, plus tables linear in L. Each release runs in a process of its own, against that release's
wheel unzipped into the corpus cache (tests/corpus/hf.py; GRAPHMODE_CORPUS_CACHE, by default
~/.cache/graphmode-corpus), never the installed one.

`--run-1b` then runs Llama-3.2-1B's shape for real on CPU, bf16 with random weights: the eager original (its own
growing cache) against the adapted model with `decode` compiled (inductor, fullgraph, dynamic=False) and the static
path set up for `--positions` positions: greedy tokens must be identical, with 0 graph breaks and 0 recompiles.
`--run-mla` does the same at DeepSeek-V2-Lite's shape (16 heads, latent 512, rope 64, 4.57.1's file) cut to 2 layers,
the second a mixture of its 64 experts (6 per token, routed: Decode gathers their weights from the stack, where the
release loops over the experts on the host): the adapted Decode attends over the cached latent with kv_b_proj
absorbed, the original over the keys
and values it expands, so their bf16 roundings differ; the row gives the smallest top-2 margin of the original's
logits, and the margin at the first token that differs: 0 there is a tie of two bf16 logits, which rounding alone
decides (not counted as a failure; every token before it is identical).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/real_size.py` from anywhere
    sys.path.insert(0, str(ROOT))

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class Shape:
    name: str
    release: str  # the transformers release whose modeling file is adapted
    model: str  # the folder under transformers/models/
    config: dict = field(default_factory=dict)  # the published config's sizes (config.json)

    @property
    def length(self) -> int:
        return self.config["max_position_embeddings"]


# Published configs (the models' config.json on the Hub), the fields that size memory. Mistral-7B is read by
# 4.36.2's file, whose mask helper takes the sliding window; 4.44's builds its own sliding mask, which graphmode
# leaves to a person.
SHAPES = [
    Shape("Llama-3.1-8B", "4.44.2", "llama", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
        rms_norm_eps=1e-5)),
    Shape("Qwen2.5-7B", "4.44.2", "qwen2", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        use_sliding_window=False, sliding_window=131072, max_window_layers=28)),
    Shape("Mistral-7B", "4.36.2", "mistral", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, sliding_window=4096, rope_theta=10000.0)),
    Shape("Gemma-2-9B", "4.44.2", "gemma2", dict(
        vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, max_position_embeddings=8192, sliding_window=4096,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    Shape("Mixtral-8x7B", "4.44.2", "mixtral", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, num_local_experts=8, num_experts_per_tok=2,
        rope_theta=1000000.0, sliding_window=None)),
    # MLA: 4.57's file expands the latent through kv_b_proj before its cache write (16 heads x (192 + 128) per token
    # and layer); the static path caches the latent and the rope key instead (absorbed_mla). 5.x's file caches the
    # latent itself, but its attention takes neither `position_ids` nor `cache_position`, so graphmode leaves it.
    Shape("DeepSeek-V2-Lite", "4.57.1", "deepseek_v2", dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, num_hidden_layers=27, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=163840, kv_lora_rank=512, q_lora_rank=None,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
        num_experts_per_tok=6, moe_intermediate_size=1408, first_k_dense_replace=1, moe_layer_freq=1, n_group=1,
        topk_group=1, topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0, rope_theta=10000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_scaling={
            "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
            "mscale": 0.707, "mscale_all_dim": 0.707})),
]
# The real run: Llama-3.2-1B's published shape.
ONE_B = Shape("Llama-3.2-1B", "4.44.2", "llama", dict(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rope_theta=500000.0,
    rope_scaling={**LLAMA3_ROPE, "factor": 32.0}, rms_norm_eps=1e-5, tie_word_embeddings=True))
# The real MLA run: DeepSeek-V2-Lite's shape cut to 2 layers, a dense one and a mixture of its 64 experts (6 routed
# per token, 2 shared): Decode reads the 6 routed experts' weights, gathered from the stack (static_moe).
MLA_RUN = Shape("DeepSeek-V2-Lite-2L", "4.57.1", "deepseek_v2", {
    **next(s for s in SHAPES if s.name == "DeepSeek-V2-Lite").config, "num_hidden_layers": 2})
BY_NAME = {s.name: s for s in [*SHAPES, ONE_B, MLA_RUN]}
RUNS = {"run-1b": ONE_B, "run-mla": MLA_RUN}
GIB = 1024 ** 3


# -- in the child: one release on sys.path ---------------------------------------------------------------------
def release_modules(shape: Shape):
    """(original module, adapted module, config class name, the causal-LM class name) for the shape's release."""
    from graphmode.transforms.codemods import Options
    from graphmode.transforms.codemods.lib.helper_code import helper_module_text
    from graphmode.transforms.output.helper_module import MODULE_NAME as HELPER_MODULE
    from graphmode.transforms.pipeline import adapt_source

    package = f"transformers.models.{shape.model}"
    original = importlib.import_module(f"{package}.modeling_{shape.model}")
    entry = next(n for n in vars(original) if n.endswith("ForCausalLM"))
    source = Path(original.__file__).read_text(encoding="utf-8")
    adapted_text = adapt_source(source, Path(original.__file__).name, None, Options(entry_class=entry)).adapted
    # graphmode's helper module where the adapted file's relative import looks for it, beside the original.
    helpers = importlib.util.module_from_spec(importlib.util.spec_from_loader(f"{package}.{HELPER_MODULE}", None))
    sys.modules[helpers.__name__] = helpers
    exec(compile(helper_module_text(), f"{HELPER_MODULE}.py", "exec"), helpers.__dict__)
    # The adapted text as a sibling module of the original, so its relative imports resolve in the release.
    name = f"{package}.modeling_{shape.model}_graphmode"
    spec = importlib.util.spec_from_loader(name, loader=None)
    adapted = importlib.util.module_from_spec(spec)
    adapted.__package__, adapted.__file__ = package, str(Path(original.__file__).with_name(name + ".py"))
    sys.modules[name] = adapted
    exec(compile(adapted_text, adapted.__file__, "exec"), adapted.__dict__)
    return original, adapted, entry


def _config(shape: Shape, model_class):
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[shape.model](**shape.config)
    # What from_pretrained picks on torch >= 2.1: SDPA where the release's class supports it.
    config._attn_implementation = "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"
    return config


def _bytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def measure(shape: Shape) -> dict:
    import torch

    from graphmode.runners.verify.static_addresses import held_tensors

    original_module, adapted_module, entry = release_modules(shape)
    config = _config(shape, getattr(original_module, entry))
    torch.set_default_dtype(torch.bfloat16)  # as from_pretrained(torch_dtype=torch.bfloat16) builds it
    with torch.device("meta"):
        original = getattr(original_module, entry)(config)
        adapted = getattr(adapted_module, entry)(config)
    torch.set_default_dtype(torch.float32)
    length = shape.length
    adapted.setup_caches(1, length)
    before = {n: _bytes(t) for n, t in held_tensors(original).items()}
    after = {n: (_bytes(t), tuple(t.shape), str(t.dtype)) for n, t in held_tensors(adapted).items()}
    added = {n: v for n, v in after.items() if before.get(n) != v[0]}
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * length * 2
    extra = {}
    if getattr(config, "kv_lora_rank", None):  # MLA: what a serving engine caches, the latent and the rope key
        kv = config.num_hidden_layers * length * (config.kv_lora_rank + config.qk_rope_head_dim) * 2
        # ... and what a cache of the keys and values kv_b_proj expands them to would hold
        extra["expanded_kv_bytes"] = config.num_hidden_layers * length * config.num_attention_heads * (
            config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim) * 2
    largest = sorted(added.items(), key=lambda item: -item[1][0])[:4]
    return {"shape": shape.name, "release": shape.release, "positions": length, "kv_bytes": kv,
            "static_bytes": sum(v[0] for v in added.values()), "added": len(added),
            "largest": [[n, b, list(s), d] for n, (b, s, d) in largest], **extra}


def _logits(output):
    return getattr(output, "logits", output)


def unit_scale_weights(model, generator=None) -> None:
    """Random weights that keep activations at unit scale (norms 1, each matrix scaled by its fan-in), as
    graphmode's harnesses set tiny models' weights: with a config's 0.02 init the logits of random weights are
    nearly flat, and greedy tokens would turn on rounding alone."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                scale = 1.0 if "embed" in name else param.shape[-1] ** -0.5
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def run_real(shape: Shape, positions: int, steps: int) -> dict:
    """A published shape for real: the eager original against the adapted Decode compiled, bf16, CPU."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    original_module, adapted_module, entry = release_modules(shape)
    config = _config(shape, getattr(original_module, entry))
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    original = getattr(original_module, entry)(config).eval()
    adapted = getattr(adapted_module, entry)(config).eval()
    torch.set_default_dtype(torch.float32)
    unit_scale_weights(original, torch.Generator().manual_seed(0))
    adapted.load_state_dict(original.state_dict())
    prompt = torch.randint(0, config.vocab_size, (1, 16))
    with torch.inference_mode():
        started = time.perf_counter()
        out = original(prompt, use_cache=True)
        cache, token, eager_tokens, margins = out.past_key_values, out.logits[:, -1:].argmax(-1), [], []
        for _ in range(steps):
            eager_tokens.append(int(token))
            top = out.logits[0, -1].float().topk(2).values
            margins.append(float(top[0] - top[1]))  # how far greedy's choice was from the runner-up
            out = original(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        eager_s = time.perf_counter() - started

        adapted.setup_caches(1, positions)
        buffers = sum(_bytes(b) for n, b in adapted.named_buffers() if "kv_cache" in n)
        decode = torch.compile(adapted.decode, backend="inductor", fullgraph=True, dynamic=False)
        counters.clear()
        started = time.perf_counter()
        # The entries hand back what `forward` does: the logits (4.44's files, with return_dict=False) or an output.
        logits = _logits(adapted.prefill(prompt, torch.arange(prompt.shape[1])))
        token, graph_tokens = logits[:, -1:].argmax(-1), []
        for step in range(steps):
            graph_tokens.append(int(token))
            position = torch.tensor([prompt.shape[1] + step])
            token = _logits(decode(token, position))[:, -1:].argmax(-1)
        graph_s = time.perf_counter() - started
    breaks = sum(counters["graph_break"].values())
    compiles = counters["stats"]["unique_graphs"]
    differs = next((i for i, (a, b) in enumerate(zip(eager_tokens, graph_tokens)) if a != b), None)
    return {"shape": shape.name, "positions": positions, "steps": steps, "tokens_equal": eager_tokens == graph_tokens,
            "first_difference": differs, "smallest_margin": round(min(margins), 4),
            # The step that decides the token that differs: a margin of 0 is a tie that any rounding breaks.
            "margin_at_first_difference": None if differs is None else round(margins[differs], 4),
            "graph_breaks": breaks, "recompiles": max(0, compiles - 1), "kv_cache_bytes": buffers,
            "eager_s": round(eager_s, 1), "graph_s_with_compile": round(graph_s, 1)}


# -- in the parent: one child per release ----------------------------------------------------------------------
def _site(release: str) -> Path:
    from tests.corpus import hf

    cache = Path(os.environ.get("GRAPHMODE_CORPUS_CACHE", Path.home() / ".cache" / "graphmode-corpus"))
    return hf.prepare_site(release, cache)


def _child(names: list[str], release: str, extra: list[str]) -> list[dict]:
    site = _site(release)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, __file__, "--child", ",".join(names), *extra], env=env,
                          capture_output=True, text=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        rows.append({"shape": ",".join(names), "release": release, "error": done.stderr.strip().splitlines()[-1:]})
    return rows


def _print(row: dict) -> None:
    if "error" in row:
        print(f"{row['shape']:<16} {row['release']:<8} FAILED: {' '.join(row['error'])}")
        return
    ratio = row["static_bytes"] / row["kv_bytes"]
    print(f"{row['shape']:<16} {row['release']:<8} {row['positions']:>7} {row['kv_bytes'] / GIB:>9.2f} "
          f"{row['static_bytes'] / GIB:>10.3f} {ratio:>7.3f}")
    if "expanded_kv_bytes" in row:
        print(f"{'':<16}MLA: the KV figure is the latent + rope key; expanded keys and values would be "
              f"{row['expanded_kv_bytes'] / GIB:.2f} GiB ({row['expanded_kv_bytes'] / row['kv_bytes']:.1f}x)")
    for name, size, shape, dtype in row["largest"]:
        print(f"{'':<16}{size / GIB:>9.3f} GiB  {name} {shape} {dtype}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    parser.add_argument("--run-1b", action="store_true", help="also run Llama-3.2-1B's shape on CPU, bf16")
    parser.add_argument("--run-mla", action="store_true", help="also run DeepSeek-V2-Lite's attention on CPU, bf16")
    parser.add_argument("--positions", type=int, default=4096, help="the static path's length for the runs")
    parser.add_argument("--steps", type=int, default=32, help="Decode steps for the runs")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.child:
        for name in args.child.split(","):
            row = run_real(RUNS[name], args.positions, args.steps) if name in RUNS else measure(BY_NAME[name])
            print(json.dumps(row), flush=True)
        return 0
    wanted = [BY_NAME[n] for n in args.shapes.split(",") if n]
    print(f"{'shape':<16} {'release':<8} {'L':>7} {'KV GiB':>9} {'static GiB':>10} {'ratio':>7}")
    failed = False
    for release in sorted({s.release for s in wanted}):
        for row in _child([s.name for s in wanted if s.release == release], release, []):
            _print(row)
            failed |= "error" in row or row["static_bytes"] > 1.02 * row["kv_bytes"]
    extra = ["--positions", str(args.positions), "--steps", str(args.steps)]
    if args.threads:
        extra += ["--threads", str(args.threads)]
    for run, wanted_run in (("run-1b", args.run_1b), ("run-mla", args.run_mla)):
        if not wanted_run:
            continue
        for row in _child([run], RUNS[run].release, extra):
            print(json.dumps(row))
            # A token that differs where the original's own top two logits were equal (a bf16 tie, margin 0) is
            # decided by rounding alone; it is printed (first_difference, margin_at_first_difference), not failed.
            tie = row.get("margin_at_first_difference") == 0
            failed |= not (row.get("tokens_equal") or tie) or row.get("graph_breaks") or row.get("recompiles")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
