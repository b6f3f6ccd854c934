"""Peak memory of the current process: resident (ru_maxrss) and, where a device exists, the device allocator's."""
from __future__ import annotations

import resource
import sys

import torch


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far; it only ever grows (ru_maxrss)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def _device_module(device: str):  # torch.cuda or torch.npu, where usable; else None
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda
    if device == "npu" and "torch_npu" in sys.modules:
        return torch.npu
    return None


def peak_device_mb(device: str) -> float | None:
    """Peak memory the device allocator handed out since the last reset; None on CPU."""
    module = _device_module(device)
    return module.max_memory_allocated() / 2**20 if module is not None else None


def reset_device_peak(device: str) -> None:
    """Starts a new device peak window (the resident peak cannot be reset)."""
    module = _device_module(device)
    if module is not None:
        module.reset_peak_memory_stats()


def peak_memory(device: str) -> dict[str, float | None]:
    """Peak resident memory of this process, and peak memory the allocator handed out on the device."""
    return {"peak_rss_mb": peak_rss_mb(), "peak_device_mb": peak_device_mb(device)}
