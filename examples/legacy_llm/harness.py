"""How graphmode builds and drives the bundled example.

A harness is the contract between graphmode and a model it has never seen:
build the model, make a prompt, and run one Prefill and one Decode step in the
model's own calling convention. graphmode does the timing and the greedy choice.
"""
import torch

from model import ModelArgs, Transformer

# The files graphmode may rewrite (relative to this folder).
SOURCES = ["model.py"]
# The longest sequence the adapted model must hold: prompt plus every Decode step.
MAX_SEQ_LEN = 64


def build_model() -> torch.nn.Module:
    """A tiny model with random weights from a fixed seed, in inference mode."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs(max_seq_len=MAX_SEQ_LEN))
    return model.eval()


def make_prompt() -> torch.Tensor:
    """One prompt of 8 token ids, the same on every call."""
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, ModelArgs.vocab_size, (1, 8), generator=generator)


def prefill(model, tokens):
    """Runs the whole prompt; returns the last position's logits and the cache."""
    logits, cache = model(tokens, 0)
    return logits[:, -1, :], {"cache": cache, "pos": tokens.shape[1]}


def decode(model, token, state):
    """Runs one new token per sequence at the next position."""
    logits, cache = model(token, state["pos"], state["cache"])
    return logits[:, -1, :], {"cache": cache, "pos": state["pos"] + 1}


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
