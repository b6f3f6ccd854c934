"""The fixed variables of a measurement, recorded next to every result."""
from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# Where CANN's toolkit says which version it is (set_env.sh exports the first two).
_CANN_HOMES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
_CANN_DEFAULT = Path("/usr/local/Ascend/ascend-toolkit/latest")


def package_version(name: str) -> str | None:
    """The installed distribution's version from its metadata, or None; never imports it
    (importing torch_npu without CANN breaks `import torch`)."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def cann_version() -> str | None:
    """CANN's toolkit version from its install record, or None when no toolkit is found."""
    homes = [Path(os.environ[key]) for key in _CANN_HOMES if os.environ.get(key)] + [_CANN_DEFAULT]
    for home in homes:
        for info in (home / "ascend_toolkit_install.info", home / "version.cfg"):
            try:
                lines = info.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                key, _, value = line.partition("=")
                if key.strip().lower() in ("version", "toolkit_version") and value.strip():
                    return value.strip().strip('"[]')
    return None


def environment(device: str) -> dict[str, Any]:
    import torch  # here, not at import: the agent reads package versions without torch

    name = device
    if device == "cuda" and torch.cuda.is_available():
        name = f"cuda ({torch.cuda.get_device_name(0)})"
    elif device == "cpu":
        name = f"cpu ({platform.processor() or platform.machine()})"
    return {
        "torch": torch.__version__,
        "torch_npu": package_version("torch_npu"),
        "transformers": package_version("transformers"),
        "cann": cann_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": name,
        "threads": torch.get_num_threads(),
        "executable": sys.executable,
    }
