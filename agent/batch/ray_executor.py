"""Batch jobs as Ray tasks: each asks the cluster for one device and runs agent.batch.job.run_job there.

Ray is an optional extra (`pip install -e ".[ray]"`), imported only when a batch asks for it. `ray.init()` joins
the cluster RAY_ADDRESS names, or starts one on this machine. Every node needs graphmode installed; the outcome
(report.json's contents included) comes back to this process, which writes the summary, so per-target files stay
on the node that ran the target unless the output folder is shared.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from graphmode.agent.batch.job import BatchJob, JobOutcome, run_job


class RayMissing(RuntimeError):
    """Ray is not installed; the message says how to get it."""


def _ray():
    try:
        import ray
    except ImportError:
        raise RayMissing("--executor ray needs Ray: pip install -e \".[ray]\" (or pip install 'ray>=2.9')") from None
    return ray


def task_options(cluster: dict[str, float]) -> dict[str, Any]:
    """What one task asks for: a GPU where the cluster has GPUs (Ray then sets CUDA_VISIBLE_DEVICES), an NPU where
    it has NPUs (a resource Ray sets ASCEND_RT_VISIBLE_DEVICES for), else one CPU. Never retried: a target that
    crashed its worker would only crash it again."""
    if cluster.get("GPU", 0) >= 1:
        return {"num_gpus": 1, "max_retries": 0}
    if cluster.get("NPU", 0) >= 1:
        return {"resources": {"NPU": 1}, "num_cpus": 1, "max_retries": 0}
    return {"num_cpus": 1, "max_retries": 0}


def _start_more(waiting: list[BatchJob], in_flight: dict[Any, BatchJob], remote, on_start: Callable[[BatchJob], None],
                max_in_flight: int | None) -> None:
    """Starts waiting jobs, in order, until `max_in_flight` are running (None: every one)."""
    while waiting and (max_in_flight is None or len(in_flight) < max_in_flight):
        job = waiting.pop(0)
        on_start(job)
        in_flight[remote.remote(job)] = job


def _outcome(ray, ref, job: BatchJob) -> JobOutcome:
    """A finished task's outcome; where the task itself failed (its node went away, ...), that target's error."""
    try:
        return ray.get(ref)
    except Exception as error:
        return JobOutcome(name=job.name, exit_code=None,
                          error=f"the Ray task failed: {type(error).__name__}: {str(error)[:300]}")


def run_on_ray(jobs: list[BatchJob], on_start: Callable[[BatchJob], None], on_done: Callable[[JobOutcome], None],
               max_in_flight: int | None = None) -> str:
    """Runs every job as a Ray task, at most `max_in_flight` at a time (None: as many as the cluster takes), and
    hands each outcome to `on_done` as it arrives; returns what each task asked for, in words. Ctrl-C cancels the
    tasks (their processes die with their Ray workers) and is raised again."""
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False, include_dashboard=False)
    options = task_options(ray.cluster_resources())
    remote = ray.remote(**options)(run_job)
    waiting, in_flight = list(jobs), {}
    try:
        while waiting or in_flight:
            _start_more(waiting, in_flight, remote, on_start, max_in_flight)
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in ready:
                on_done(_outcome(ray, ref, in_flight.pop(ref)))
    except KeyboardInterrupt:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started_here:
            ray.shutdown()
    return ", ".join(f"{k}={v}" for k, v in options.items() if k != "max_retries")
