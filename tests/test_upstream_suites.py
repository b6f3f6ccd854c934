"""Opt-in: a transformers release's own model tests pass on graphmode's adapted file (`pytest -m upstream`).

For each case `transformers==VERSION:MODEL` the test builds the corpus target (tests/corpus/core.py),
runs `graphmode adapt TARGET --yes --backend aot_eager --runs 1`, then runs the release's own
`tests/models/MODEL/test_modeling_MODEL.py` at tag vVERSION twice, CPU-only and one worker as upstream CI
does (tests/corpus/upstream.py): on the release's original modeling file and on the adapted one. Every test
the original passes must pass on the adapted file; the failure lists the tests that differ with the first
lines of their errors. Tests that already fail on the original are the baseline, not a finding.

Environment:
  GRAPHMODE_UPSTREAM       space-separated cases (default DEFAULT_CASES), `VERSION:MODEL` or
                           `transformers==VERSION:MODEL` as in GRAPHMODE_CORPUS
  GRAPHMODE_UPSTREAM_GIT   a git directory of transformers with its release tags (required: the PyPI
                           sdist has no tests/models/)
  GRAPHMODE_UPSTREAM_REFS  where that git has main's history but not the tags: `VERSION=COMMIT ...`, the
                           commit on main each release was branched from (tests/corpus/upstream.py)
  GRAPHMODE_CORPUS_CACHE   keeps wheels, sites, venvs (one per release), the tags' tests and each run's
                           tree, junit.xml and pytest.log (under upstream/); one JSON line per case is
                           appended to upstream/results.jsonl there

It needs PyPI (a venv per release) and minutes per suite, so it runs only when `-m` selects `upstream`.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from corpus import core, upstream

pytestmark = pytest.mark.upstream

ENV_VAR = "GRAPHMODE_UPSTREAM"
DEFAULT_CASES = ("transformers==4.34.1:llama transformers==4.36.2:llama,mistral transformers==4.44.2:gemma "
                 "transformers==4.46.3:llama transformers==4.48.3:llama")
CASES = core.parse_corpus(os.environ.get(ENV_VAR) or DEFAULT_CASES)


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    return upstream.cache_root(tmp_path_factory.mktemp("upstream"))


def _adapt(case: core.Case, cache: Path, tmp_path: Path) -> Path:
    """graphmode's adapted model.py for the case (the corpus target, adapted as a user would)."""
    target = core.build_target(case, cache, tmp_path / "targets")
    out = tmp_path / "out"
    done = core.graphmode("adapt", str(target), "--yes", "--backend", "aot_eager", "--runs", "1", "--out", str(out),
                          home=tmp_path / "home", cwd=tmp_path)
    adapted = out / target.name / "adapted" / "model.py"
    if not adapted.is_file():
        pytest.fail(f"{case.id}: `graphmode adapt` exited {done.returncode} without an adapted model.py:\n"
                    + "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:]), pytrace=False)
    return adapted


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_upstream_suite_passes_on_adapted_file(case: core.Case, cache: Path, tmp_path: Path):
    if case.error:
        pytest.fail(case.error, pytrace=False)
    if case.package != "transformers":
        pytest.fail(f"{case.id}: only transformers cases have an upstream suite here", pytrace=False)
    started = time.monotonic()
    try:
        adapted = _adapt(case, cache, tmp_path)
        adapt_seconds = round(time.monotonic() - started, 1)
        result = upstream.run_case(case.version, case.model, adapted, upstream.upstream_dir(cache), case.slug)
    except (core.CaseError, upstream.UpstreamError) as error:
        pytest.fail(f"{case.id}: cannot run the upstream suite: {error}", pytrace=False)
    record = {**result.record(), "adapt_seconds": adapt_seconds, "seconds": round(time.monotonic() - started, 1)}
    with open(upstream.upstream_dir(cache) / "results.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    regressions = result.comparison.regressions
    if regressions:
        pytest.fail(f"{case.id}: {len(regressions)} of the {result.original.counts()['passed']} tests that pass on "
                    f"the original fail on the adapted file ({result.test_file} at "
                    f"{'tag' if result.tagged else 'branch point'} {result.commit[:10]}; "
                    f"original {result.original.counts()}, "
                    f"adapted {result.adapted.counts()}; logs {result.adapted.log}):\n"
                    + result.comparison.summary(), pytrace=False)
