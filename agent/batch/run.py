"""`graphmode batch`: every target of a manifest through `graphmode adapt`, each in its own process, resumable.

What is done is read from the store first: a target whose key (its spec and options) has a finished row is
skipped, and only failures are repeated, with --retry-failed. A finished manifest therefore runs nothing and
imports no torch: it only rewrites the summary. The batch holds its output folder's lock while it works, so a row
left `running` is one a killed batch left behind, and is pending again.
"""
from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from rich.console import Console
from rich.markup import escape

from graphmode.agent.batch import store as batch_store
from graphmode.agent.batch.device_slots import job_slots
from graphmode.agent.batch.job import LOG_NAME, BatchJob, JobOutcome, run_job
from graphmode.agent.batch.manifest import BatchTarget, Manifest
from graphmode.agent.batch.summary import (FailOn, failed, make_row, pending_row, speedup_text, status_of,
                                           write_summary)
from graphmode.agent.errors import UserError
from graphmode.agent.output import run_folder_lock
from graphmode.runners.measure.shared_cores import LOCK_ENV

TARGET_FILE = "graphmode.toml"
CORES_LOCK = ".cores.lock"  # runners.measure.shared_cores: targets sharing this machine's cores time one at a time
EXIT_INTERRUPTED = 130


@dataclass
class BatchOptions:
    jobs: int | None = None  # None: 1 here; with Ray, as many as the cluster takes
    retry_failed: bool = False
    executor: str = "local"  # or "ray"
    fail_on: list[FailOn] | None = None


def run(manifest: Manifest, options: BatchOptions, console: Console) -> int:
    """Runs what is not done yet, writes the summary, and returns the exit status: 0 every target verified and no
    --fail-on condition breached, 1 otherwise, 130 interrupted (the targets then running are pending again)."""
    out = manifest.out
    with run_folder_lock(out, f"batch {manifest.path} (pid {os.getpid()})"):
        batch_store.forget_running(out)  # a killed batch's leftovers: under this lock, no other batch runs them
        done = batch_store.finished_rows(out)
        todo, skipped = _todo_and_skipped(manifest.targets, done, options.retry_failed)
        console.print(f"graphmode batch: {len(manifest.targets)} target(s), {len(skipped)} done earlier, "
                      f"{len(todo)} to run -> {out}", soft_wrap=True)
        for target in skipped:
            said = done[target.name][1].replace("_", " ")
            console.print(f"[dim]skipped (done earlier): {escape(target.name)}: {said}[/]", soft_wrap=True)
        conditions = options.fail_on or []
        interrupted = False
        if todo:
            interrupted = _run_targets(manifest, todo, options, console, conditions)
        rows = _rows(manifest)
        summary = write_summary(manifest, rows, conditions, chart=bool(todo) or not (out / "speedups.png").exists())
    _print_summary(console, out, rows, summary)
    if interrupted:
        console.print("[yellow]graphmode batch: interrupted.[/] Finished targets are kept; run the same command to "
                      "carry on.", soft_wrap=True)
        return EXIT_INTERRUPTED
    return 1 if any(failed(row) for row in rows) or summary["fail_on_breaches"] else 0


def _todo_and_skipped(targets: list[BatchTarget], done: dict[str, tuple[Any, Any, Any]],
                      retry_failed: bool) -> tuple[list[BatchTarget], list[BatchTarget]]:
    """The targets to run (never finished with their present key, or failed and --retry-failed) and those done."""
    todo, skipped = [], []
    for target in targets:
        key, status, _ = done.get(target.name, (None, None, None))
        again = key != target.key or (status != batch_store.VERIFIED and retry_failed)
        (todo if again else skipped).append(target)
    return todo, skipped


def _print_summary(console: Console, out: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """The table of every target, where the summary (and its chart) went, and the --fail-on breaches."""
    _print_table(console, rows)
    console.print(f"Summary: [bold]{out / 'summary.md'}[/]" + (f" (chart: {out / summary['chart']})"
                                                                 if summary["chart"] else ""), soft_wrap=True)
    for breach in summary["fail_on_breaches"]:
        console.print(f"[red]fail-on:[/] {escape(breach)}", soft_wrap=True)


def _rows(manifest: Manifest) -> list[dict[str, Any]]:
    """One row per target, in the manifest's order: its finished row, or pending (never run, interrupted, or run
    with other options than the manifest now gives it)."""
    done = batch_store.finished_rows(manifest.out)
    return [done[t.name][2] if t.name in done and done[t.name][0] == t.key else pending_row(t)
            for t in manifest.targets]


def _job(manifest: Manifest, target: BatchTarget) -> BatchJob:
    folder = manifest.out / target.name
    args = ["-m", "graphmode.agent.cli", "adapt", str(folder / TARGET_FILE), "--out", str(folder)]
    if target.run.get("yes", True):
        args.append("--yes")
    # COLUMNS: adapt's progress lines are read back from its log (its error line, its session), so no wrapping.
    return BatchJob(name=target.name, folder=str(folder), args=args, files={TARGET_FILE: target.target_file_text()},
                    timeout_s=target.target_timeout, env={"COLUMNS": "200"})


def _run_targets(manifest: Manifest, todo: list[BatchTarget], options: BatchOptions, console: Console,
                 conditions: list[FailOn]) -> bool:
    """Runs the targets; each outcome is recorded and printed as it comes, and the summary rewritten. Returns
    whether it was interrupted."""
    by_name = {t.name: t for t in todo}
    finished = [0]
    lock = threading.Lock()

    def on_start(job: BatchJob) -> None:
        batch_store.mark_running(manifest.out, job.name, by_name[job.name].key)
        with lock:
            console.print(f"[dim]  {escape(job.name)}: analyze… (its log: {Path(job.folder) / LOG_NAME})[/]",
                          soft_wrap=True)

    def on_progress(name: str, line: str) -> None:
        said = step_line(line)
        if said is not None:
            with lock:
                console.print(f"[dim]  {escape(name)}: {escape(said)}[/]", soft_wrap=True)

    def on_done(outcome: JobOutcome) -> None:
        target = by_name[outcome.name]
        status = status_of(outcome)
        with lock:
            if status is None:  # stopped by the batch's own interruption: it has yet to run
                batch_store.forget_running(manifest.out, [target.name])
                return
            row = make_row(target, outcome, status, manifest.out, options.executor)
            batch_store.record(manifest.out, target.name, target.key, status, row)
            finished[0] += 1
            console.print(_line(row, finished[0], len(todo)), soft_wrap=True)
            write_summary(manifest, _rows(manifest), conditions, chart=False)

    jobs = [_job(manifest, target) for target in todo]
    try:
        if options.executor == "ray":
            _on_ray(jobs, on_start, on_done, options.jobs, console)
        else:
            _here(jobs, on_start, on_done, options.jobs or 1, console, manifest.out / CORES_LOCK, on_progress)
    except KeyboardInterrupt:
        batch_store.forget_running(manifest.out, list(by_name))
        return True
    return False


def _on_ray(jobs: list[BatchJob], on_start: Callable[[BatchJob], None], on_done: Callable[[JobOutcome], None],
            max_in_flight: int | None, console: Console) -> None:
    from graphmode.agent.batch.ray_executor import RayMissing, run_on_ray

    console.print(f"executor ray: {len(jobs)} task(s), each asking the cluster for one device", soft_wrap=True)
    try:
        asked = run_on_ray(jobs, on_start, on_done, max_in_flight)
    except RayMissing as error:
        raise UserError(str(error)) from None
    console.print(f"ray: each task asked for {asked}", soft_wrap=True)


def _here(jobs: list[BatchJob], on_start: Callable[[BatchJob], None], on_done: Callable[[JobOutcome], None],
          count: int, console: Console, cores_lock: Path,
          on_progress: Callable[[str, str], None] = lambda name, line: None) -> None:
    """The jobs on this machine, `count` at a time, one slot per device where there are devices. Where the slots
    share the cores (no devices), every target's timing runs wait for the cores alone (runners.measure.shared_cores):
    the other work overlaps, the figures the reports quote do not. Ctrl-C (or SIGTERM, which the command line raises as
    Ctrl-C) stops every running target's processes before it returns."""
    envs = _slot_envs(len(jobs), count, console, cores_lock)
    free: SimpleQueue[dict[str, str]] = SimpleQueue()
    for env in envs:
        free.put(env)
    stop = threading.Event()

    def work(job: BatchJob) -> JobOutcome | None:
        if stop.is_set():
            return None  # never started
        env = free.get()
        try:
            if stop.is_set():
                return None
            on_start(job)
            return run_job(replace(job, env={**job.env, **env}), stop,
                           progress=lambda line: on_progress(job.name, line))
        finally:
            free.put(env)

    pool = ThreadPoolExecutor(max_workers=len(envs), thread_name_prefix="graphmode-batch")
    futures: set[Future] = {pool.submit(work, job) for job in jobs}
    try:
        while futures:
            # A timed wait, so Ctrl-C reaches this thread between waits.
            ready, futures = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in ready:
                outcome = future.result()
                if outcome is not None:
                    on_done(outcome)
    except BaseException:
        stop.set()  # the running jobs stop their processes (SIGTERM, then SIGKILL) and return as interrupted
        pool.shutdown(wait=True, cancel_futures=True)
        for future in futures:  # any that finished by itself meanwhile is a result like any other
            if _finished_with_outcome(future):
                on_done(future.result())
        raise
    pool.shutdown(wait=True)


def _slot_envs(jobs: int, count: int, console: Console, cores_lock: Path) -> list[dict[str, str]]:
    """What each of the `count` slots adds to its job's environment: its device, or, where the slots share the cores
    and more than one job runs at once, the lock their timing runs take."""
    slots = job_slots(count)
    if slots.note:
        console.print(f"[yellow]note:[/] {slots.note}", soft_wrap=True)
    if slots.shared_cores and len(slots.envs) > 1 and jobs > 1:
        console.print(f"{len(slots.envs)} targets at a time share this machine's cores: each one's timing runs "
                      "wait until they have the cores to themselves", soft_wrap=True)
        return [{**env, LOCK_ENV: str(cores_lock)} for env in slots.envs]
    return slots.envs


def _finished_with_outcome(future: Future) -> bool:
    """A job's future that finished by itself, with an outcome (not one the stop kept from starting)."""
    return future.done() and not future.cancelled() and future.exception() is None and bool(future.result())


def step_line(line: str) -> str | None:
    """What a target's `graphmode adapt` says of its steps, as adapt prints it when not at a terminal: a step
    finished ("✓ verify (41.0 s): ...") or a run inside one ("verify: eager (original) run 1 of 3: done in 8.1 s");
    None for its other lines. The batch shows these per target, so a long target is seen at its current step."""
    text = line.strip()
    if text.startswith("✓ ") or re.match(r"(analyze|design|implement|verify|repair|report): ", text):
        return text
    return None


def _line(row: dict[str, Any], n: int, total: int) -> str:
    """One progress line for a finished target."""
    head = escape(f"[{n}/{total}] {row['name']}: ")
    if row["status"] == batch_store.VERIFIED:
        return (f"[green]✓[/] {head}verified in {row['seconds']:.0f} s: {row['graph_breaks']} graph breaks, "
                f"{row['recompiles']} recompiles, tokens equal, Decode {speedup_text(row)}, warm-up "
                f"{row['warmup_s']:.1f} s, {row['manual_items']} item(s) left for a person")
    status = row["status"].replace("_", " ")
    return f"[red]✗[/] {head}{status} in {row['seconds']:.0f} s: {escape(row.get('problem') or '')}"


def _print_table(console: Console, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from graphmode.agent.batch.summary import COLUMNS, cells

    table = Table(title="graphmode batch")
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*cells(row))
    if console.is_terminal:
        console.print(table)
    else:  # piped or redirected (CI logs): one target per line, tab-separated, nothing cut
        for line in (COLUMNS, *(cells(row) for row in rows)):
            console.file.write("\t".join(line) + "\n")  # not console.print: rich would expand the tabs
