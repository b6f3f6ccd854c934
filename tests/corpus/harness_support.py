"""What every corpus harness shares (copied next to each generated harness.py as corpus_support.py).

graphmode's own code, not a library's: the site check, import shims that keep a package's heavy
`__init__` from running, the explicit seeded initialisation of every parameter, the prompt, greedy
generation in the harness's own prefill/decode convention, and the `tokens [[...]]` line that
`python harness.py N` prints (the corpus test compares it between the original and adapted sources).
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch


def require_site(site: str, top_modules: list[str]) -> None:
    """Each of `top_modules` must come from `site` (not from an installed release)."""
    for name in top_modules:
        loaded = sys.modules.get(name)
        where = getattr(loaded, "__file__", None) or next(iter(getattr(loaded, "__path__", [])), "")
        if loaded is not None and not str(where).startswith(site):
            raise ImportError(f"{name} was imported from {where} before this harness; "
                              f"the corpus case needs the copy in {site}")


def bare_package(name: str, site: str) -> types.ModuleType:
    """Registers package `name` (dotted) from `site` without running its __init__.py: for packages
    whose __init__ imports heavy dependencies the model files never use (lightning, torchao...).
    Its submodules import as usual."""
    if name in sys.modules:
        return sys.modules[name]
    folder = Path(site, *name.split("."))
    if not folder.is_dir():
        raise ImportError(f"no package folder {folder}")
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    module.__file__ = str(folder / "__init__.py")
    module.__package__ = name
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(bare_package(parent, site), child, module)
    return module


def stub_module(name: str, **attributes) -> types.ModuleType:
    """Registers module `name` with only `attributes`: a stand-in for a module whose import pulls in
    a heavy dependency, when the model files need only a small helper from it."""
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module


def alias_module(name: str, module: types.ModuleType) -> None:
    """Makes `import name` give `module` (e.g. a package's own module name for the target's copy of it,
    so that code resolving classes by that name gets the copy graphmode rewrites)."""
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, module)


def init_parameters(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Sets every parameter explicitly from `seed` (tiny random models need it: some libraries leave
    parameters uninitialised or zero): 1-D weights 1 and biases 0, embeddings N(0, 1), the rest
    N(0, 1/fan_in). Then eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() <= 1:
                value = torch.ones(param.shape) if not name.endswith("bias") else torch.zeros(param.shape)
            elif "emb" in name or "wte" in name or "wpe" in name:
                value = torch.randn(param.shape, generator=generator)
            else:
                value = torch.randn(param.shape, generator=generator) * param.shape[-1] ** -0.5
            param.copy_(value.to(param.dtype))
    return model.eval()


def make_prompt(vocab_size: int, length: int, batch: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab_size, (batch, length), generator=generator)


def generate(harness, model, steps: int = 32) -> torch.Tensor:
    """Greedy generation through the harness's own prefill/decode (one Prefill, then Decode steps)."""
    tokens = harness.make_prompt()
    with torch.inference_mode():
        logits, state = harness.prefill(model, tokens)
        out = []
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            out.append(token)
            logits, state = harness.decode(model, token, state)
    return torch.cat(out, dim=1)


def main(harness) -> None:
    """`python harness.py [STEPS]`: builds the model and prints its greedy tokens as one JSON line."""
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    model = harness.build_model()
    print("model", type(model).__module__, type(model).__name__)
    print("tokens", json.dumps(generate(harness, model, steps).tolist()))
