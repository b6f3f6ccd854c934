"""The torch_npu 2.13.0 wheel's Python sources, for the `npu_api` tests (tests/test_npu_backends.py,
tests/test_npu_fused_ops.py): downloaded once a test process (never installed), and only the .py files under
`NEEDED` extracted. GRAPHMODE_TORCH_NPU_SRC names an already extracted wheel (the folder holding `torch_npu/`),
to skip the download; it is used when it holds everything in `NEEDED`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from graphmode.runners.backends._npu_config import TORCH_NPU_VERSION

NEEDED = (
    # npu/npugraph_ex/: torch.npu.npugraph_ex, whose inference.cache_compile is the public npugraph_ex cache.
    "torch_npu/dynamo/npugraph_ex/", "torch_npu/dynamo/torchair/", "torch_npu/npu/npugraph_ex/",
    # The fused operators' meta functions and their documentation (transforms/codemods/lib/npu_ops.py).
    "torch_npu/op_plugin/meta/_meta_registrations.py", "torch_npu/_op_plugin_docs.py",
)

_TREE: dict[str, Path | str] = {}  # "root": the extracted tree, or "skip": why there is none


def torch_npu_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding the extracted `torch_npu/`: GRAPHMODE_TORCH_NPU_SRC's, or the wheel's, downloaded on the
    first call of this process. Skips the test when the wheel cannot be downloaded."""
    if "skip" in _TREE:
        pytest.skip(str(_TREE["skip"]))
    if "root" not in _TREE:
        ready = os.environ.get("GRAPHMODE_TORCH_NPU_SRC")
        if ready and all((Path(ready) / needed).exists() for needed in NEEDED):
            _TREE["root"] = Path(ready)
        else:
            _TREE["root"] = _download(tmp_path_factory)
    return Path(_TREE["root"])


def _download(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("torch_npu_wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "-d", str(work), f"torch-npu=={TORCH_NPU_VERSION}"], capture_output=True, text=True, timeout=600)
    wheels = list(work.glob("torch_npu-*.whl"))
    if proc.returncode != 0 or not wheels:
        _TREE["skip"] = f"could not download torch-npu=={TORCH_NPU_VERSION}: {proc.stderr.strip()[-300:]}"
        pytest.skip(str(_TREE["skip"]))
    dest = tmp_path_factory.mktemp("torch_npu_src")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(dest, members=[n for n in wheel.namelist() if n.endswith(".py") and n.startswith(NEEDED)])
    wheels[0].unlink()
    return dest
