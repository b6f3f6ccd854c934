"""Opt-in: graphmode on real modeling files from released transformers wheels (`pytest -m corpus`).

Cases come from GRAPHMODE_CORPUS, space-separated VERSION:MODEL,MODEL entries (default
"4.36.2:llama,mistral"); a MODEL is a folder under transformers/models/. Each case downloads the wheel
(`pip download --no-deps`), extracts it into a temporary folder, builds a tiny random target
(tests/corpus/hf.py), checks that the original runs, then runs `graphmode adapt TARGET --yes --backend
inductor` and expects 0 graph breaks, 0 recompiles and identical tokens. A case that cannot be built
fails and says why. Set GRAPHMODE_CORPUS_CACHE to a folder to keep the downloads between runs.

It needs the network (PyPI) and minutes per case, so it only runs when `-m` selects `corpus`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corpus import hf

pytestmark = pytest.mark.corpus

CASES = hf.corpus_cases()
ORIGINAL_STEPS = 4


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory) -> Path:
    cache = os.environ.get("GRAPHMODE_CORPUS_CACHE")
    if cache:
        root = Path(cache).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
        return root
    return tmp_path_factory.mktemp("corpus")


_sites: dict[str, Path | hf.CaseError] = {}


def _site(version: str, root: Path) -> Path:
    """One extracted release per version and session; a failure is remembered for its other models."""
    if version not in _sites:
        try:
            _sites[version] = hf.prepare_site(version, root)
        except hf.CaseError as error:
            _sites[version] = error
    site = _sites[version]
    if isinstance(site, hf.CaseError):
        raise site
    return site


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_adapts_and_verifies(case: hf.Case, corpus_root: Path, tmp_path: Path):
    if case.error:
        pytest.fail(case.error, pytrace=False)
    try:
        site = _site(case.version, corpus_root)
        target = hf.build_target(case, site, tmp_path / "targets")
    except hf.CaseError as error:
        pytest.fail(f"{case.id}: cannot build the case: {error}", pytrace=False)

    original = hf.run_original(target, ORIGINAL_STEPS)
    if original.returncode != 0:
        pytest.fail(f"{case.id}: cannot build the case: the original model does not run "
                    f"(python {target / 'harness.py'}):\n{_tail(original.stderr)}", pytrace=False)

    out = tmp_path / "out"
    done = hf.graphmode("adapt", str(target), "--yes", "--backend", "inductor", "--out", str(out),
                        home=tmp_path / "home", cwd=tmp_path)
    run = out / target.name
    report_path = run / "report.json"
    if not report_path.is_file():
        design = run / "design.md"
        where = f" (design: {design})" if design.is_file() else f" (logs: {run / 'logs'})"
        pytest.fail(f"{case.id}: `graphmode adapt` exited {done.returncode} without a report{where}:\n"
                    f"{_tail(done.stdout + done.stderr)}", pytrace=False)
    report = json.loads(report_path.read_text())
    summary = (f"{case.id}: graph_breaks={report['graph_breaks']} recompiles={report['recompiles']} "
               f"tokens_equal={report['tokens_equal']} applied={report['changes_applied']} "
               f"manual_items={report['manual_items']} problems={report['problems']} (report: {run / 'report.md'})")
    assert report["graph_breaks"] == 0, summary
    assert report["recompiles"] == 0, summary
    assert report["tokens_equal"], summary
    assert done.returncode == 0, summary + "\n" + _tail(done.stdout + done.stderr)
