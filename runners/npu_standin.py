"""A CPU stand-in for `torch.npu`, for model code written for Ascend and analysed where torch_npu cannot be imported.

Code published for Ascend imports torch_npu and asks `torch.npu` about the device at import and build time
(`torch.npu.get_device_name()`, `set_device`, `set_compile_mode`, streams). torch_npu registers `torch.npu` when
it is imported; on a machine without CANN it cannot be, so `optional_imports` gives a placeholder for the package
and this module a `torch.npu` that answers those calls as a machine with no NPU would: none available, device 0,
no memory in use, streams and events that do nothing. Every answered call is recorded with the line of the model's
code that made it (`calls()`), for the design to list. Anything else that would compute on an NPU raises, naming
itself and that line. On a host where torch_npu imports, nothing here is installed.
"""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

NAME = "CPU stand-in for torch.npu (torch_npu cannot be imported here)"
_CALLS: dict[tuple[str, str], None] = {}  # (call, "file:line") in the order first made


class NpuStandInError(RuntimeError):
    """Code called into `torch.npu` for something only an Ascend NPU can do."""


def _caller(depth: int = 2) -> str:
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _record(call: str) -> None:
    _CALLS.setdefault((call, _caller(3)), None)


class _Nothing:
    """A stream or an event of a device that has none: every method does nothing (an event's time is 0)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: 0.0 if name == "elapsed_time" else (True if name == "query" else None)


def _answer(call: str, value: Any):
    def answered(*args: Any, **kwargs: Any) -> Any:
        _record(f"torch.npu.{call}")
        return value() if callable(value) else value
    return answered


# What a machine with no NPU answers. Values that are classes or factories are called for each call.
_ANSWERS: dict[str, Any] = {
    "is_available": False, "device_count": 0, "current_device": 0, "is_initialized": False,
    "get_device_name": NAME, "get_device_capability": (0, 0),
    "get_device_properties": lambda: types.SimpleNamespace(name=NAME, total_memory=0, major=0, minor=0,
                                                            multi_processor_count=0),
    "set_device": None, "synchronize": None, "empty_cache": None, "init": None,
    "manual_seed": None, "manual_seed_all": None, "seed": None, "set_compile_mode": None,
    "memory_allocated": 0, "max_memory_allocated": 0, "memory_reserved": 0, "max_memory_reserved": 0,
    "reset_peak_memory_stats": None, "reset_max_memory_allocated": None,
    "Stream": _Nothing, "Event": _Nothing, "current_stream": _Nothing, "default_stream": _Nothing,
    "stream": contextlib.nullcontext, "device": contextlib.nullcontext,
}


class _Refused:
    """What the stand-in cannot answer (`torch.npu.amp.autocast(...)`, an NPU operator): calling it raises with its
    name and the line that called it; reading an attribute of it gives another such stand-in."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Refused:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Refused(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any):
        raise NpuStandInError(f"{self._name} (called at {_caller()}) needs an Ascend NPU: torch_npu cannot be "
                              f"imported here, and graphmode's {NAME.split(' (')[0]} answers only questions about "
                              "the device")


class _TorchNpu(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("torch.npu", __doc__)
        self.config = types.SimpleNamespace()  # `torch.npu.config.allow_internal_format = False` is a setting

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in _ANSWERS:
            return _answer(name, _ANSWERS[name])
        return _Refused(f"torch.npu.{name}")


def install() -> bool:
    """`torch.npu` as the stand-in, unless torch already has one (torch_npu imported for real); True if installed."""
    import torch

    if hasattr(torch, "npu"):
        return False
    torch.npu = _TorchNpu()
    sys.modules.setdefault("torch.npu", torch.npu)
    return True


def calls() -> list[tuple[str, str]]:
    """(call, "file:line") of every call the stand-in answered, each once, in the order first made."""
    return list(_CALLS)
