"""How graphmode builds and drives the Meta-reference-style example.

The model holds its own key/value caches, so the state between steps is only the position.
"""
import torch

from model import ModelArgs, Transformer

# The files graphmode may rewrite (relative to this folder).
SOURCES = ["model.py"]
# The longest sequence the adapted model must hold: prompt plus every Decode step.
MAX_SEQ_LEN = 64


def build_model() -> torch.nn.Module:
    """A tiny model whose every parameter is set explicitly from a fixed seed, in inference mode."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs(max_seq_len=MAX_SEQ_LEN, max_batch_size=1))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return model.eval()


def make_prompt() -> torch.Tensor:
    """One prompt of 8 token ids, the same on every call."""
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, ModelArgs.vocab_size, (1, 8), generator=generator)


def prefill(model, tokens):
    """Runs the whole prompt from position 0; returns the last position's logits and the next position."""
    logits = model(tokens, 0)
    return logits[:, -1, :], {"pos": tokens.shape[1]}


def decode(model, token, state):
    """Runs one new token per sequence at the next position; the caches live in the model."""
    logits = model(token, state["pos"])
    return logits[:, -1, :], {"pos": state["pos"] + 1}


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
