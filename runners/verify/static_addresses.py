"""Whether the memory a compiled Decode reads stays where it was: the capture/replay check that runs on a CPU.

A captured graph (a CUDA graph, npugraph_ex's) replays against the addresses it was captured with. The model's
parameters, buffers and tensors held as plain attributes (a static KV cache, the mask rows, the rotary table) are
the graph's static inputs: a step that puts a new tensor in their place (`self.cache_k = torch.cat(...)`, a
non-in-place `index_copy`, a `setup_caches` that runs again) leaves a replay writing the old memory and reading stale
values, or, under CUDA graph trees, records the graph again every step. Nothing of that shows on a CPU backend, which
runs the new tensor happily; the addresses do. So the worker records every such tensor's `data_ptr()` once warm, and
again after each Decode step and after the timed generation, and verify fails a run where one moved, naming it.

The per-step token and position tensors are not among them: they are fresh by design (a capture/replay backend
copies them into its own placeholders).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def held_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the model holds, by its dotted name: parameters, buffers, and tensors kept as plain module
    attributes, alone or in a list, tuple or dict (`self.caches = [...]`)."""
    held: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, tensor in [*module._parameters.items(), *module._buffers.items(), *vars(module).items()]:
            for key, value in _tensors_in(name, tensor):
                held.setdefault(dot + key, value)
    return held


def _tensors_in(name: str, value: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, (list, tuple)):
        return [(f"{name}[{i}]", item) for i, item in enumerate(value) if isinstance(item, torch.Tensor)]
    if isinstance(value, dict) and not name.startswith("_"):  # not the module's own _parameters, _buffers, ...
        return [(f"{name}[{key!r}]", item) for key, item in value.items() if isinstance(item, torch.Tensor)]
    return []


def addresses(model: torch.nn.Module) -> dict[str, int]:
    """name -> data_ptr() of every tensor the model holds (a tensor with no storage, on the meta device, as 0)."""
    return {name: _address(tensor) for name, tensor in held_tensors(model).items()}


def _address(tensor: torch.Tensor) -> int:
    try:
        return tensor.data_ptr()
    except RuntimeError:  # a tensor subclass or fake tensor without storage
        return 0


@dataclass
class AddressWatch:
    """The model's held tensors' addresses once warm, and the first time each one moved or went away."""

    model: torch.nn.Module
    warm: dict[str, int] = field(default_factory=dict)
    moved: list[dict[str, Any]] = field(default_factory=list)  # {"name", "when", "before", "after"}
    checks: int = 0

    def start(self) -> None:
        """After the warm-up step: what every later step must leave in place."""
        self.warm = addresses(self.model)

    def check(self, when: str) -> None:
        """`when` names what ran since the last check ("Decode step 3"); a tensor that moved is recorded once."""
        self.checks += 1
        seen = {m["name"] for m in self.moved}
        now = addresses(self.model)
        for name, before in self.warm.items():
            if name not in seen and now.get(name) != before:
                self.moved.append({"name": name, "when": when, "before": before, "after": now.get(name)})

    def record(self) -> dict[str, Any]:
        """{"tensors": how many were watched, "checks", "moved": [{"name", "when", "before", "after"}]}
        (after None: the tensor is no longer held)."""
        return {"tensors": len(self.warm), "checks": self.checks, "moved": list(self.moved)}


def moved_problem(moved: list[dict[str, Any]]) -> str | None:
    """One line for verify: the tensors a run's Decode moved, the first few by name."""
    if not moved:
        return None
    shown = "; ".join(f"{m['name']} ({'no longer held' if m['after'] is None else 'reallocated'} by {m['when']})"
                      for m in moved[:3])
    more = f", and {len(moved) - 3} more" if len(moved) > 3 else ""
    return (f"{len(moved)} static tensor(s) of the model changed address after warm-up: {shown}{more}; a captured "
            "graph replays against the old memory (write them in place: copy_, index_copy_)")
