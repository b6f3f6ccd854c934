"""Building a random model whose every tensor comes from the seed, uninitialised memory included.

A model's `__init__` may leave a tensor as `torch.empty(...)` that a checkpoint would overwrite (DeepSeek-V3's
`e_score_correction_bias`, a cache preallocated in `__init__`, modules built with torch's `skip_init`). With
random weights nothing overwrites it: it holds whatever memory held, which differs from one process to the next,
so the original and the adapted side of a comparison run different models. `seeded_build` builds the model with
every such allocation made from NaN instead (zeros for integer tensors), so what `__init__` never wrote is known
after it, and fills exactly those elements from the seed: two builds agree bit for bit, and the names of the
tensors filled are returned for the harness to say.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

# The allocations that leave memory as it was, as Python calls them. The legacy constructors (`torch.Tensor(n)`,
# `torch.FloatTensor(n)`) allocate in C++ without passing here: what they leave unwritten is not seen.
_UNINITIALISED = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty}


class _EmptyAsNaN(TorchFunctionMode):
    """While active, an uninitialised allocation made in Python comes back filled: NaN for floating-point and
    complex tensors, which no initialisation produces, so what stays NaN was never written; zeros otherwise."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in _UNINITIALISED and isinstance(result, torch.Tensor) and result.device.type != "meta":
            with torch.no_grad():
                result.fill_(math.nan if result.is_floating_point() or result.is_complex() else 0)
        return result


def seeded_build(build: Callable[[], torch.nn.Module], seed: int = 0) -> tuple[torch.nn.Module, list[str]]:
    """`build()`, with every element its `__init__` left unwritten filled from `seed`; and the names of the tensors
    (parameters, buffers, plain tensor attributes) that had such elements."""
    with _EmptyAsNaN():
        model = build()
    generator = torch.Generator().manual_seed(seed)
    filled = []
    with torch.no_grad():
        for name, tensor in _tensors(model):
            if not (tensor.is_floating_point() and tensor.device.type != "meta"):
                continue
            unwritten = torch.isnan(tensor)
            if not unwritten.any():
                continue
            tensor[unwritten] = _values(name, tensor, generator)[unwritten]
            filled.append(name)
    return model, filled


def _tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter and buffer, and every tensor a module holds as a plain attribute, once each."""
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        held = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False),
                *((n, v) for n, v in vars(module).items() if isinstance(v, torch.Tensor))]
        for name, tensor in held:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                yield (f"{prefix}.{name}" if prefix else name), tensor


def _values(name: str, tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """What a seeded initialisation gives such a tensor: zeros for a bias, a buffer or a plain tensor (a cache is
    written before it is read), ones for another 1-D parameter (a scale), N(0, 1/fan_in) for a matrix."""
    if "bias" in name.rsplit(".", 1)[-1] or not isinstance(tensor, torch.nn.Parameter):
        return torch.zeros_like(tensor)
    if tensor.dim() < 2:
        return torch.ones_like(tensor)
    drawn = torch.randn(tensor.shape, generator=generator) / math.sqrt(tensor.shape[-1])
    return drawn.to(dtype=tensor.dtype, device=tensor.device)
