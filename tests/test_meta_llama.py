"""The Meta-reference-style example (examples/meta_llama): module-held KV caches sliced at a Python-int
position and rotary tables precomputed in `__init__` and sliced by it, adapted statically and end to end."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphmode.transforms.codemods import Options
from graphmode.transforms.codemods.lib.helper_code import helper_names
from graphmode.transforms.pipeline import adapt_source, fixed_by
from graphmode.transforms.rules import scan_source

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "meta_llama"
OPTIONS = Options(entry_class="Transformer")


def _source() -> str:
    return (EXAMPLE / "model.py").read_text()


def test_every_finding_is_fixed_by_the_chain():
    source = _source()
    findings = scan_source(source, "model.py")
    assert {f.code for f in findings} == {"GM201", "GM302", "GM401", "GM501"}
    result = adapt_source(source, "model.py", None, OPTIONS)
    # Then the fusions (OPTIONS: CUDA's, every portable one): the norm, the attention and the projections.
    assert result.applied == ["hoist_item", "sliced_tables", "static_mask", "sliced_kv_cache",
                              "static_positions", "fused_rms_norm", "fused_attention", "merged_projections",
                              "split_decode"]
    assert not result.manual
    assert [f for f in findings if fixed_by(f, result.edits) is None] == []
    assert {fixed_by(f, result.edits) for f in findings if f.code == "GM302"} == {"sliced_tables", "sliced_kv_cache"}
    adapted = result.static_view  # the static path; the file keeps the original bodies beside it
    assert "start_pos" not in adapted
    assert "self.cache_k[:bsz].index_copy_(1, input_pos, xk)" in adapted
    assert "keys = self.cache_k[:bsz]\n" in adapted
    assert "freqs_cis = self.freqs_cis[input_pos]" in adapted
    # The model's own table and caches, as it builds them, made buffers that setup_caches reads or sizes.
    assert "self.freqs_cis = precompute_freqs_cis(" in result.adapted and "GRAPHMODE_MAX_SEQ_LEN" not in result.adapted
    assert 'graphmode_table_buffers(self, ("freqs_cis",))' in result.adapted
    assert 'graphmode_cache_buffers(self, ("cache_k", "cache_v"), seq_dim=1)' in result.adapted
    # The only length branch built the mask, so nothing the rules flag is left on the static path, and the
    # original bodies beside it are no step of the entries.
    # (The static view still holds graphmode's helpers pasted in, which the written file imports from
    # graphmode_static.py: the mask rows' `torch.arange` over the slots is theirs, a fixed shape.)
    assert [f for f in scan_source(adapted, "model.py") if f.function not in helper_names()] == []
    assert scan_source(result.adapted, "model.py") == []
    again = adapt_source(result.adapted, "model.py", None, OPTIONS)
    assert again.adapted == result.adapted and not again.edits and not again.manual


def test_positions_alone_refuse_the_slices():
    # Without the slice rewrites the position parameter still bounds slices: nothing may change.
    source = _source()
    result = adapt_source(source, "model.py", {"static_positions"}, OPTIONS)
    assert result.adapted == source and result.applied == []
    assert {m.codemod for m in result.manual} == {"static_positions"}


def test_declining_the_mask_drops_the_cache_rewrite():
    # Reading the whole cache is only correct under the causal mask, so the cache rewrite needs it.
    source = _source()
    selected = {"sliced_tables", "sliced_kv_cache", "static_positions"}
    result = adapt_source(source, "model.py", selected, OPTIONS)
    assert "sliced_kv_cache" not in result.applied


def _fingerprint(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.py"))}


@pytest.mark.slow
def test_adapt_yes_verifies_the_meta_example_and_leaves_it_untouched(tmp_path):
    before = _fingerprint(EXAMPLE)
    env = {**os.environ, "GRAPHMODE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "graphmode.agent.cli", "adapt", str(EXAMPLE), "--yes", "--backend", "aot_eager",
         "--runs", "1", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "out" / "meta_llama"
    report = json.loads((run / "report.json").read_text())
    assert report["tokens_equal"] is True
    assert report["graph_breaks"] == 0 and report["recompiles"] == 0
    assert report["baseline"]["recompiles"] > 0, "the unmodified code must show why it needed adapting"
    adapted = (run / "adapted" / "model.py").read_text()
    assert "def decode(self, tokens, input_pos)" in adapted and "index_copy_" in adapted
    assert _fingerprint(EXAMPLE) == before
