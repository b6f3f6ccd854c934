"""MLA at real sizes (issue 36): transformers' DeepSeek-V2 file caches the keys and values `kv_b_proj` expands the
latent to; the static path caches the latent and the rope key instead and absorbs `kv_b_proj`
(transforms/codemods/caches/absorbed_mla.py).

The release's own modeling files (transformers 4.57.1: its DeepSeek-V2 and V3 cache the expanded keys, which 5.x's
files no longer do, and loop over their experts on the host; the wheel unzipped into the corpus cache,
tests/corpus/hf.py) are adapted by the whole chain and run at a tiny fp32 size in a process of their own
(tests/mla_release_check.py), against the files as released: the cache held is the latent's size, the greedy tokens
are the original's and the logits equal to float tolerance, with Decode compiled fullgraph, no graph break and no
recompile. Without the wheel (no network and no cache) that test is
skipped; the helper's arithmetic is checked in test_helper_code.py, the rewrite's text in the fixture tests
(tests/fixtures/codemods/absorbed_mla).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corpus import hf
from corpus.core import CaseError
from mla_release_check import MAX_SEQ_LEN

ROOT = Path(__file__).resolve().parents[1]
RELEASE = "4.57.1"


@pytest.fixture(scope="module")
def site() -> Path:
    cache = Path(os.environ.get("GRAPHMODE_CORPUS_CACHE", Path.home() / ".cache" / "graphmode-corpus"))
    try:
        return hf.prepare_site(RELEASE, cache)
    except (CaseError, OSError) as error:
        pytest.skip(f"transformers=={RELEASE} could not be prepared: {error}")


def _check(site: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "mla_release_check.py"), *args], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("model, q_lora_rank, moe", [("deepseek_v2", None, True), ("deepseek_v2", 16, False),
                                                     ("deepseek_v3", 16, True)],
                         ids=["v2-lite-like-moe", "v2-q-lora", "v3-moe"])
def test_the_adapted_release_file_caches_the_latent_and_gives_the_originals_tokens(site, model, q_lora_rank, moe):
    row = _check(site, "--model", model, *([] if q_lora_rank is None else ["--q-lora-rank", str(q_lora_rank)]),
                 *(["--moe"] if moe else []))
    config = row["config"]
    # (a) per layer the latent and the rope key, one row per token shared by every head: nothing of the head count.
    expected = {}
    for layer in range(config["num_hidden_layers"]):
        expected[f"model.layers.{layer}.self_attn.kv_cache.k_cache"] = [1, 1, MAX_SEQ_LEN, config["kv_lora_rank"]]
        expected[f"model.layers.{layer}.self_attn.kv_cache.v_cache"] = [1, 1, MAX_SEQ_LEN, config["qk_rope_head_dim"]]
    assert row["held"] == expected
    # (b) the original's greedy tokens, logits equal to float tolerance (the absorbed products are associated the
    # other way, so not bit for bit), one graph for every Decode step: with `--moe` the release's expert loop (over
    # a tensor of counts in V2, `torch.where` rows in V3) is replaced by the static dispatch, routed at batch 1.
    assert row["got"] == row["expected"]
    assert row["largest_logit_difference"] <= 1e-4 * max(1.0, row["largest_logit"])
    assert (row["graph_breaks"], row["recompiles"]) == (0, 0)
