"""Targets sharing the cores: shared claims overlap, a claim alone overlaps nothing and is not starved."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from graphmode.runners.measure.shared_cores import LOCK_ENV, WAIT_ENV, claim, waits_given_up, without_claim
from graphmode.runners.measure.timing import speedup_unstable


def _holder(lock: str, alone: bool, events: list[str], name: str, go: threading.Event, hold_s: float) -> None:
    go.wait()
    with claim(alone=alone, environ={LOCK_ENV: lock}) as claimed:
        assert claimed
        events.append(f"{name} in")
        time.sleep(hold_s)
        events.append(f"{name} out")


def _start(*args) -> threading.Thread:
    thread = threading.Thread(target=_holder, args=args)
    thread.start()
    return thread


def test_shared_claims_overlap_and_a_claim_alone_waits_for_them_and_goes_before_later_ones(tmp_path):
    lock, events = str(tmp_path / "cores.lock"), []
    first, second, timing, late = (threading.Event() for _ in range(4))
    threads = [_start(lock, False, events, "a", first, 0.6), _start(lock, False, events, "b", second, 0.6)]
    first.set()
    time.sleep(0.1)
    second.set()  # b joins a while a still works: shared claims overlap
    time.sleep(0.1)
    threads.append(_start(lock, True, events, "t", timing, 0.5))
    timing.set()  # the timing run waits for a and b to end
    time.sleep(0.1)
    threads.append(_start(lock, False, events, "c", late, 0.1))
    late.set()  # c asks after the timing run: it waits behind it instead of starving it
    for thread in threads:
        thread.join(10)
    assert events.index("b in") < events.index("a out")
    assert events.index("t in") > max(events.index("a out"), events.index("b out"))
    assert events.index("t out") == events.index("t in") + 1  # nothing entered while it timed
    assert events.index("c in") > events.index("t out")


def test_without_the_variable_nothing_waits_and_workers_never_see_it(tmp_path):
    with claim(alone=True, environ={}) as claimed:
        assert claimed is None
    environ = {LOCK_ENV: str(tmp_path / "cores.lock"), "PATH": "/bin"}
    assert without_claim(environ) == {"PATH": "/bin"}


def test_a_claim_alone_in_another_process_holds_off_a_shared_one(tmp_path):
    lock = str(tmp_path / "cores.lock")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom graphmode.runners.measure.shared_cores import claim, LOCK_ENV\n"
         f"with claim(alone=True, environ={{LOCK_ENV: {lock!r}}}):\n    print('in', flush=True)\n"
         "    time.sleep(1.0)\n"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "in"
    started = time.monotonic()
    with claim(alone=False, environ={LOCK_ENV: lock}):
        waited = time.monotonic() - started
    holder.wait(10)
    assert waited > 0.5, waited


def test_a_claim_alone_that_waits_out_its_limit_runs_anyway_and_is_counted(tmp_path):
    lock, events, go = str(tmp_path / "cores.lock"), [], threading.Event()
    neighbour = _start(lock, False, events, "hung", go, 1.5)
    go.set()
    time.sleep(0.2)
    before = waits_given_up()
    started = time.monotonic()
    with claim(alone=True, environ={LOCK_ENV: lock, WAIT_ENV: "0.3"}) as held:
        assert held is False and "hung out" not in events
    assert 0.3 <= time.monotonic() - started < 1.2
    assert waits_given_up() == before + 1
    neighbour.join(10)
    with claim(alone=True, environ={LOCK_ENV: lock, WAIT_ENV: "0.3"}) as held:
        assert held is True  # the turnstile was let go: the next claim is not stuck behind the one that gave up


def test_a_speedup_is_unstable_when_its_runs_spread_past_the_limit():
    assert not speedup_unstable({"median": 2.0, "min": 1.9, "max": 2.2}, [])
    assert speedup_unstable({"median": 2.0, "min": 0.5, "max": 230.0}, [])
    assert speedup_unstable({"median": 2.0, "min": 1.9, "max": 2.2}, ["graph.tpot_ms"])
    assert not speedup_unstable({"median": 2.0, "min": 1.9, "max": 2.2}, ["eager.prefill_ms"])
    assert not speedup_unstable({}, [])  # one run per side: no spread was measured
