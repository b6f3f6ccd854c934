"""Run in a child process with a transformers release first on sys.path (tests/test_absorbed_mla.py): that release's
DeepSeek-V2 (or V3) modeling file, adapted by graphmode's whole chain, against the file as released, at a tiny fp32
size with random weights. Prints one JSON line: the cache tensors the static path holds, the greedy tokens of both,
the largest logit difference, and the compiled Decode's graph breaks and recompiles.

    PYTHONPATH=<release site>:<repo> python tests/mla_release_check.py [--q-lora-rank N] [--backend B] [--model M]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPT, STEPS, MAX_SEQ_LEN = 7, 10, 32
# DeepSeek-V2's fields at a tiny size. Every layer dense (first_k_dense_replace = layers) unless `--moe`, which
# makes the second layer a mixture of 4 routed experts (2 per token) and a shared one: the release's dispatch loops
# over the counts of each expert's tokens on the host, which static_moe replaces (routed at batch 1: 2 of 4).
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=12, head_dim=8, first_k_dense_replace=2, n_routed_experts=4,
            n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32, n_group=2, topk_group=1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--q-lora-rank", type=int, default=None)
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--model", default="deepseek_v2", help="deepseek_v2 or deepseek_v3")
    parser.add_argument("--moe", action="store_true", help="the second layer a mixture of experts")
    args = parser.parse_args()

    import torch
    from torch._dynamo.utils import counters
    from transformers import CONFIG_MAPPING

    from bench.real_size import Shape, release_modules, unit_scale_weights

    original_module, adapted_module, entry = release_modules(Shape("tiny", "", args.model))
    config = CONFIG_MAPPING[args.model](**{**TINY, "first_k_dense_replace": 1 if args.moe else 2},
                                        q_lora_rank=args.q_lora_rank)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    original = getattr(original_module, entry)(config).eval()
    adapted = getattr(adapted_module, entry)(config).eval()
    unit_scale_weights(original)  # the global generator, seeded above
    adapted.load_state_dict(original.state_dict())
    prompt = torch.randint(0, config.vocab_size, (1, PROMPT))

    with torch.no_grad():
        out = original(prompt, use_cache=True)
        cache, expected, expected_logits = out.past_key_values, [], [out.logits[:, -1]]
        for _ in range(STEPS):
            expected.append(int(expected_logits[-1].argmax(-1)))
            out = original(torch.tensor([[expected[-1]]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            expected_logits.append(out.logits[:, -1])

        adapted.setup_caches(1, MAX_SEQ_LEN)
        held = {name: list(buffer.shape) for name, buffer in adapted.named_buffers() if "kv_cache" in name}
        torch._dynamo.reset()
        counters.clear()
        decode = torch.compile(adapted.decode, backend=args.backend, fullgraph=True, dynamic=False)
        logits = [adapted.prefill(prompt, torch.arange(PROMPT)).logits[:, -1]]
        got = []
        for step in range(STEPS):
            got.append(int(logits[-1].argmax(-1)))
            logits.append(decode(torch.tensor([[got[-1]]]), torch.tensor([PROMPT + step])).logits[:, -1])
    difference = max(float((a - b).abs().max()) for a, b in zip(logits, expected_logits))
    print(json.dumps({
        "held": held, "config": {k: getattr(config, k) for k in ("num_hidden_layers", "kv_lora_rank",
                                                                 "qk_rope_head_dim")},
        "expected": expected, "got": got, "largest_logit_difference": difference,
        "largest_logit": max(float(x.abs().max()) for x in expected_logits),
        "graph_breaks": sum(counters["graph_break"].values()),
        "recompiles": max(0, counters["stats"]["unique_graphs"] - 1),
        "adapted_source": adapted_module.__name__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
