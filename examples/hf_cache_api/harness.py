"""How graphmode builds and drives the Hugging Face 4.36-style example (a cache object through forward).

The model is called the way transformers' generation loop calls it: by keyword, with the cache it
returned last time (`past_key_values`, the legacy tuple form) and `use_cache=True`; it returns an
object with `.logits` and `.past_key_values`.
"""
import torch

from model import Config, ForCausalLM

# The files graphmode may rewrite (relative to this folder); cache.py and masks.py are library code.
SOURCES = ["model.py"]
# The longest sequence the adapted model must hold: prompt plus every Decode step.
MAX_SEQ_LEN = 64
# The tiny model: hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 256, 64 positions, SDPA attention.
CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=MAX_SEQ_LEN)


def build_model() -> torch.nn.Module:
    """A tiny model whose every parameter is set explicitly from a fixed seed, in inference mode.

    Embeddings ~ N(0, 1) and projections ~ N(0, 1/fan_in) keep the activations at unit scale, so the
    greedy tokens vary (with the usual 0.02 a random model this small repeats one token).
    """
    torch.manual_seed(0)
    model = ForCausalLM(Config(**CONFIG))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif "embed" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * param.shape[-1] ** -0.5)
    return model.eval()


def make_prompt() -> torch.Tensor:
    """One prompt of 8 token ids, the same on every call."""
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, CONFIG["vocab_size"], (1, 8), generator=generator)


def prefill(model, tokens):
    """Runs the whole prompt with no cache yet; returns the last position's logits and the cache."""
    out = model(input_ids=tokens, past_key_values=None, use_cache=True)
    return out.logits[:, -1, :], out.past_key_values


def decode(model, token, state):
    """Runs one new token per sequence after the cached ones; the positions come from the cache length."""
    out = model(input_ids=token, past_key_values=state, use_cache=True)
    return out.logits[:, -1, :], out.past_key_values


def generate(model, steps: int = 32):
    """Greedy generation in the model's own style (one Prefill, then Decode steps)."""
    tokens = make_prompt()
    with torch.inference_mode():
        logits, state = prefill(model, tokens)
        out = []
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            out.append(token)
            logits, state = decode(model, token, state)
    return torch.cat(out, dim=1)


if __name__ == "__main__":
    print(generate(build_model()).tolist())
