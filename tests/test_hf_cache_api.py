"""The Hugging Face 4.36-style example (examples/hf_cache_api): a cache object passed through forward
(`past_key_value.update` / `get_usable_length`), the 4-D mask built per call by a helper from another
module, and a ForCausalLM whose forward takes every argument by keyword. Adapted statically and end to
end with real torch, so the ordinary tests cover what the opt-in transformers corpus test covers."""
from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adapted_files import write_adapted

from graphmode.runners.harness import load_harness
from graphmode.runners.verify.verify import verify
from graphmode.transforms.codemods import CODEMODS, Options
from graphmode.transforms.pipeline import adapt_source, fixed_by
from graphmode.transforms.rules import scan_source

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "hf_cache_api"
OPTIONS = Options(entry_class="ForCausalLM")

WRITE = "key_states, value_states = self.kv_cache.update(graphmode_slots(self), key_states, value_states)\n"
MASK_ROWS = ("attention_mask = graphmode_padded_rows(self, self.causal_mask, graphmode_slots(self))"
             ".expand(batch_size, 1, seq_length, -1)\n")
MASK_BUFFER = "self.causal_mask = GraphmodeCausalMask(sliding_window=self.config.sliding_window)\n"
CACHE = "self.kv_cache = StaticKVCache(self.num_key_value_heads, self.head_dim, seq_dim=2)\n"
ENTRY = ("return self.forward(input_ids=input_ids, position_ids=graphmode_row_positions(input_pos, attention_mask), "
         "use_cache=False, return_dict=False)[0]\n")


def _source() -> str:
    return (EXAMPLE / "model.py").read_text()


def _calls(source: str) -> set[str]:
    """The dotted names of everything called in the source (docstrings and comments aside)."""
    return {ast.unparse(node.func) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)}


@pytest.fixture(scope="module")
def adapted_example():
    """model.py adapted with every codemod (the libcst chain takes seconds: run it once for the module)."""
    return adapt_source(_source(), "model.py", None, OPTIONS)


def test_the_cache_object_and_the_mask_helper_are_replaced(adapted_example):
    source = _source()
    findings = scan_source(source, "model.py")
    assert {"GM303", "GM502"} <= {f.code for f in findings}
    result = adapted_example
    assert {"cache_object", "split_decode"} <= set(result.applied)
    assert not result.manual
    # Every cache use and mask helper in the attention classes and the mask building is fixed by cache_object.
    attention_and_mask = [f for f in findings if f.code == "GM502" or (f.code == "GM303" and "past_key_value." in
                                                                       source.splitlines()[f.line - 1])]
    assert len(attention_and_mask) == 6
    assert {fixed_by(f, result.edits) for f in attention_and_mask} == {"cache_object"}

    adapted = result.static_view  # what the static path runs; the file keeps the original bodies beside it
    assert adapted.count(WRITE) == 2  # eager and SDPA attention
    assert adapted.count("kv_seq_len = self.kv_cache.max_seq_len\n") == 2
    assert "GRAPHMODE_MAX_SEQ_LEN = " not in adapted  # sized by setup_caches, not by constants of the file
    assert adapted.count(CACHE) == 1  # in Attention.__init__ only: SdpaAttention inherits it
    assert adapted.count(MASK_ROWS) == 2  # the eager and the SDPA mask helper
    assert adapted.count(MASK_BUFFER) == 1
    assert {"past_key_value.update", "past_key_value.get_usable_length", "_prepare_4d_causal_attention_mask",
            "_prepare_4d_causal_attention_mask_for_sdpa"} <= _calls(source)
    # The static path calls none of them; the original bodies beside it still do (tests/test_drop_in.py).
    assert not {"past_key_value.get_usable_length", "_prepare_4d_causal_attention_mask",
                "_prepare_4d_causal_attention_mask_for_sdpa"} & _calls(result.static_view)
    assert {"_prepare_4d_causal_attention_mask", "_prepare_4d_causal_attention_mask_for_sdpa"} <= _calls(result.adapted)
    # A caller that carries the cache object still gets it grown (its own loop counts positions from it), but
    # attention no longer reads what the object returns.
    assert "= past_key_value.update(" not in adapted and adapted.count("    past_key_value.update(") == 2
    assert "def prefill(self, input_ids, input_pos, attention_mask=None):" in adapted
    assert "def decode(self, input_ids, input_pos, attention_mask=None):" in adapted
    assert adapted.count(ENTRY) == 2

    again = adapt_source(result.adapted, "model.py", None, OPTIONS)
    assert again.adapted == result.adapted and not again.edits and not again.manual


def test_declining_the_cache_object_leaves_no_entries():
    # The keyword entries pass no cache in or out, so without the buffers there is nothing correct to call.
    source = _source()
    result = adapt_source(source, "model.py", set(CODEMODS) - {"cache_object"}, OPTIONS)
    assert "cache_object" not in result.applied and "split_decode" not in result.applied
    assert "split_decode" in {m.codemod for m in result.manual}
    assert "def prefill(" not in result.adapted and "def decode(" not in result.adapted
    assert "past_key_value.update" in _calls(result.adapted)


def _fingerprint(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.py"))}


def _tokens_of(folder: Path) -> list[list[int]]:
    """Greedy tokens of the folder's harness, in this process (load_harness evicts another folder's `model`)."""
    path = list(sys.path)
    try:
        harness = load_harness(folder)
        return harness.generate(harness.build_model()).tolist()
    finally:  # leave no `harness`/`model`/`cache`/`masks` of this folder behind for other tests
        sys.path[:] = path
        for name in ("harness", *(p.stem for p in folder.glob("*.py"))):
            file = getattr(sys.modules.get(name), "__file__", None)
            if file and Path(file).resolve().parent == folder.resolve():
                del sys.modules[name]


@pytest.mark.slow
def test_adapt_yes_verifies_the_hf_example_and_leaves_it_untouched(tmp_path):
    before = _fingerprint(EXAMPLE)
    env = {**os.environ, "GRAPHMODE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "graphmode.agent.cli", "adapt", str(EXAMPLE), "--yes", "--backend", "aot_eager",
         "--runs", "1", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "out" / "hf_cache_api"
    report = json.loads((run / "report.json").read_text())
    assert report["tokens_equal"] is True
    assert report["graph_breaks"] == 0 and report["recompiles"] == 0
    assert report["baseline"]["recompiles"] > 0, "the unmodified code must show why it needed adapting"
    assert {"cache_object", "split_decode"} <= set(report["changes_applied"])
    # What is left for a person lies off the traced Decode path (the rotary table builder runs in __init__).
    assert report["manual_items"] == len(report["manual_items_detail"])
    assert report["manual_items_run_by_decode"] == 0
    tokens = report["tokens"]["eager"][0]
    assert len(tokens) == 32 and len(set(tokens)) > 8, "greedy tokens of the tiny model must not be degenerate"
    adapted = (run / "adapted" / "model.py").read_text()
    assert "def decode(self, input_ids, input_pos, attention_mask=None)" in adapted and WRITE in adapted
    # The library modules travel with the adapted copy unchanged.
    for library in ("cache.py", "masks.py"):
        assert (run / "adapted" / library).read_bytes() == (EXAMPLE / library).read_bytes()
    assert _fingerprint(EXAMPLE) == before


@pytest.mark.slow
def test_eager_attention_with_a_sliding_window_verifies(tmp_path, adapted_example):
    # Eager attention and a window of 16 over prompt 8 + 32 steps: the window slides for most of Decode, so
    # equal tokens show that the mask buffer built once hides the same keys as the per-call helper.
    original = tmp_path / "original"
    shutil.copytree(EXAMPLE, original, ignore=shutil.ignore_patterns("__pycache__"))
    harness = (original / "harness.py").read_text()
    config = "max_position_embeddings=MAX_SEQ_LEN)"
    assert harness.count(config) == 1
    (original / "harness.py").write_text(harness.replace(
        config, 'max_position_embeddings=MAX_SEQ_LEN,\n              attn_implementation="eager", sliding_window=16)'))
    windowed = _tokens_of(original)
    assert windowed != _tokens_of(EXAMPLE), "the window must change what the model generates"

    # Only the harness differs: the adapted model.py is the one the static test checks.
    adapted = tmp_path / "adapted"
    shutil.copytree(original, adapted)
    write_adapted(adapted, {"model.py": adapted_example.adapted})

    verified = verify(original, adapted, "aot_eager", steps=32, timeout_s=300, runs=1)
    assert verified.tokens_equal, verified.problems
    assert verified.original["tokens"] == windowed
    assert verified.graph_breaks == 0 and verified.recompiles == 0, verified.problems
    assert verified.passed, verified.problems
