"""The order the suite runs in: the files with the most end-to-end tests (`slow`) first.

CI runs the suite on two pytest-xdist workers a whole file at a time (`-n 2 --dist loadfile`, so a file's
module-scoped fixtures, an adapt or a verify, are made once), handing out the files in this order
(`--no-loadscope-reorder`; xdist's own order would put the files with the most tests first, and those are the quick
ones). The end-to-end tests take a minute or more each where most others take a fraction of a second: the files that
hold them go first, and the run ends on quick files that the two workers share out, instead of one worker finishing a
long file while the other waits. A file's tests keep their own order.
"""
from __future__ import annotations

import pytest


def _slow_tests(items: list[pytest.Item]) -> int:
    return sum(1 for item in items if item.get_closest_marker("slow") is not None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    # sorted() is stable: files with as many slow tests keep their collection order, so every worker sees one order.
    ordered = sorted(by_file.values(), key=_slow_tests, reverse=True)
    items[:] = [item for tests in ordered for item in tests]
