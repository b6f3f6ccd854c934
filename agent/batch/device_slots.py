"""Job slots for running targets side by side on one machine: one slot per accelerator, each seeing only its own.

Read from the environment and /dev, never from torch: the batch command must not import it (a second run of a
finished manifest only rewrites its summary).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# (environment variable that selects devices, the device files one per device) for each kind of accelerator.
_KINDS = (("ASCEND_RT_VISIBLE_DEVICES", re.compile(r"davinci(\d+)\Z")),
          ("CUDA_VISIBLE_DEVICES", re.compile(r"nvidia(\d+)\Z")))


@dataclass
class Slots:
    envs: list[dict[str, str]] = field(default_factory=list)  # one per slot: what a job in it adds to its env
    note: str = ""  # said when the slots differ from what was asked
    shared_cores: bool = False  # no device per slot: the jobs compute on the same cores


def visible_devices(dev: Path = Path("/dev")) -> tuple[str, list[str]] | None:
    """(the variable, the device ids) of the accelerators this process may use, or None on a CPU-only host. An
    id list already set in the environment is kept: the batch shares out what it was given."""
    for variable, pattern in _KINDS:
        given = os.environ.get(variable)
        if given is not None:  # set, even empty (which hides every device of the kind): the files do not count
            ids = [part.strip() for part in given.split(",") if part.strip()]
        else:
            ids = _device_files(dev, pattern)
        if ids:
            return variable, ids
    return None


def _device_files(dev: Path, pattern: re.Pattern[str]) -> list[str]:
    """The ids of the device files of one kind under `dev` (/dev/nvidia0 -> "0"), in numeric order."""
    try:
        found = sorted(int(m.group(1)) for entry in os.listdir(dev) if (m := pattern.match(entry)))
    except OSError:
        found = []
    return [str(n) for n in found]


def job_slots(jobs: int, dev: Path = Path("/dev")) -> Slots:
    """`jobs` slots; on an accelerator host, at most one per device, each job seeing only its slot's device."""
    devices = visible_devices(dev)
    if devices is None:
        return Slots(envs=[{} for _ in range(jobs)], shared_cores=True)
    variable, ids = devices
    used = min(jobs, len(ids))
    note = (f"{jobs} jobs asked for, {len(ids)} device(s) visible ({variable}): running {used}, one per device"
            if used < jobs else "")
    return Slots(envs=[{variable: ids[n]} for n in range(used)], note=note)
