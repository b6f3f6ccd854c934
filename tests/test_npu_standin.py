"""Code written for Ascend is analysed on CPU: `torch.npu` answered by a stand-in when torch_npu cannot be imported.

Each check runs in a process of its own: the stand-in is installed on the `torch` module, which the test process
must keep as it is.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from graphmode.runners.subprocess_run import run_worker

HUB = Path(__file__).parent / "fixtures" / "hub_remote_code"
ASCEND_LINES = (
    "import torch_npu\n"
    "DEVICE_NAME = torch.npu.get_device_name()  # what Ascend code asks at import\n"
    "torch.npu.set_compile_mode(jit_compile=False)\n"
)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_stand_in_answers_device_questions_and_refuses_npu_work_naming_the_line():
    done = _python(
        "from graphmode.runners import optional_imports\n"
        "optional_imports.install({'torch_npu': 'model.py:3'})\n"
        "import torch, torch_npu\n"
        "assert not torch.npu.is_available() and torch.npu.device_count() == 0 and torch.npu.current_device() == 0\n"
        "torch.npu.set_device(0); torch.npu.synchronize()\n"
        "with torch.npu.stream(torch.npu.Stream()):\n"
        "    torch.npu.current_stream().synchronize()\n"
        "torch.npu.config.allow_internal_format = False\n"
        "print(torch.npu.get_device_name())\n"
        "from graphmode.runners import npu_standin\n"
        "print(len(npu_standin.calls()))\n"
        "torch.npu.amp.autocast(dtype=torch.float16)\n"
    )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("CPU stand-in for torch.npu") and int(lines[1]) == 9
    assert done.returncode != 0
    assert "NpuStandInError: torch.npu.amp.autocast (called at <string>:12) needs an Ascend NPU" in done.stderr


def test_on_a_host_with_torch_npu_or_for_other_packages_nothing_is_stood_in():
    done = _python(
        "from graphmode.runners import optional_imports\n"
        "optional_imports.install({'flash_attn': 'model.py:3'})\n"
        "import torch\n"
        "print(hasattr(torch, 'npu'))\n"
    )
    assert done.returncode == 0 and done.stdout.strip() == "False"


@pytest.mark.slow
def test_remote_code_that_asks_torch_npu_at_import_is_traced_and_the_evidence_names_the_calls(tmp_path):
    from graphmode.agent.targets.hf import resolve, write_target

    hub = tmp_path / "hub_ascend"
    shutil.copytree(HUB, hub)
    modeling = hub / "modeling_tinylm.py"
    text = modeling.read_text()
    anchor = "from .configuration_tinylm import TinyLMConfig\n"
    modeling.write_text(text.replace(anchor, anchor + ASCEND_LINES))
    first = modeling.read_text().splitlines().index("import torch_npu") + 2  # the get_device_name line
    folder = write_target(resolve(str(hub), True, 64), hub, tmp_path / "target", 64)
    out = tmp_path / "evidence.json"
    run_worker("graphmode.runners.workers.evidence_worker",
               ["--folder", str(folder), "--steps", "2", "--out", str(out)],
               name="evidence", timeout_s=300, log_dir=tmp_path / "logs")
    stand_ins = json.loads(out.read_text())["npu_stand_ins"]
    source = next(s for s in json.loads(out.read_text())["sources"] if s.endswith("modeling_tinylm.py"))
    assert stand_ins == [["torch.npu.get_device_name", f"{source}:{first}"],
                         ["torch.npu.set_compile_mode", f"{source}:{first + 1}"]]
