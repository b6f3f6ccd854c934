"""The fixed variables of a measurement, recorded next to every result."""
from __future__ import annotations

import platform
import sys
from typing import Any

import torch


def environment(device: str) -> dict[str, Any]:
    name = device
    if device == "cuda" and torch.cuda.is_available():
        name = f"cuda ({torch.cuda.get_device_name(0)})"
    elif device == "cpu":
        name = f"cpu ({platform.processor() or platform.machine()})"
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": name,
        "threads": torch.get_num_threads(),
        "executable": sys.executable,
    }
