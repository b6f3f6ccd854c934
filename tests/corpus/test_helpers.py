"""Fast checks of the corpus test bed's pure helpers (ordinary CI: no network, no downloads).

The corpus itself (`pytest -m corpus`, tests/test_corpus.py) needs PyPI and minutes per case; these
check what it is built from: GRAPHMODE_CORPUS parsing, the per-model tiny configs, the import
rewriting of copied sources, the generated harnesses, and the xformers / fairscale stand-ins.
"""
from __future__ import annotations

import ast
import sys

import pytest
import torch

from corpus import core, hf, harness_support


# -- GRAPHMODE_CORPUS ------------------------------------------------------------------------------
def test_default_and_short_transformers_form():
    assert [c.id for c in core.parse_corpus(None)] == ["transformers==4.36.2:llama", "transformers==4.36.2:mistral"]
    cases = core.parse_corpus("4.34.1:llama transformers==4.40.2:qwen2,falcon")
    assert [(c.package, c.version, c.model) for c in cases] == [
        ("transformers", "4.34.1", "llama"), ("transformers", "4.40.2", "qwen2"), ("transformers", "4.40.2", "falcon")]
    assert all(c.error is None for c in cases)


def test_other_packages_and_the_testbed():
    cases = core.parse_corpus("litgpt==0.4.10:llama x-transformers==1.42.0:decoder")
    assert [c.id for c in cases] == ["litgpt==0.4.10:llama", "x-transformers==1.42.0:decoder"]
    bed = core.parse_corpus("testbed")
    assert len(bed) >= 20 and all(c.error is None for c in bed)
    assert {c.package for c in bed} == set(core.FAMILIES)
    assert len({c.id for c in bed}) == len(bed)
    # a case named twice runs once
    assert len(core.parse_corpus("testbed 4.36.2:llama")) == len(bed)


@pytest.mark.parametrize("text, fragment", [
    ("", "set but empty"),
    ("llama", "is not [PACKAGE==]VERSION:MODEL"),
    ("4.36.2:", "is not [PACKAGE==]VERSION:MODEL"),
    ("nosuchlib==1.0:x", "no family for package 'nosuchlib'"),
    ("banana:llama", "'banana' is not a version"),
    ("4.36.2:llama,bad-name", "'bad-name' is not a model name"),
])
def test_malformed_entries_fail_with_a_reason(text, fragment):
    errors = [c.error for c in core.parse_corpus(text) if c.error]
    assert errors and fragment in errors[0]


def test_runs_from_env(monkeypatch):
    monkeypatch.delenv("GRAPHMODE_CORPUS_RUNS", raising=False)
    assert core.runs_from_env() == 3
    monkeypatch.setenv("GRAPHMODE_CORPUS_RUNS", "1")
    assert core.runs_from_env() == 1
    monkeypatch.setenv("GRAPHMODE_CORPUS_RUNS", "0")
    with pytest.raises(ValueError):
        core.runs_from_env()


# -- tiny configs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("model",
                         sorted({c.model for c in core.parse_corpus("testbed") if c.package == "transformers"}))
def test_every_transformers_model_of_the_bed_is_tiny(model):
    config = hf.tiny_config(model)
    sizes = set(config.values())
    assert 64 in sizes and core.VOCAB_SIZE in sizes and 2 in sizes and 4 in sizes
    assert config["tie_word_embeddings"] is False
    names = {"hidden_size", "n_embd", "d_model"} & set(config)
    assert len(names) == 1 and config[names.pop()] == 64


def test_gemma_adds_to_the_llama_names_and_gpt2_replaces_them():
    assert hf.tiny_config("gemma")["head_dim"] == 16 and hf.tiny_config("gemma")["hidden_size"] == 64
    assert "hidden_size" not in hf.tiny_config("gpt2") and hf.tiny_config("gpt2")["n_positions"] == 64


def test_the_harness_names_the_cache_as_the_release_does():
    legacy = ("class LlamaForCausalLM:\n"
              "    def forward(self, input_ids=None, past_key_values=None, **kwargs): ...\n")
    renamed = ("class LlamaForCausalLM:\n"
               "    @deprecate_kwarg(\"past_key_values\", \"5.40.0\", new_name=\"cache\")\n"
               "    @can_return_tuple\n"
               "    def forward(self, input_ids=None, cache=None, **kwargs): ...\n")
    assert hf.cache_keyword(legacy, "LlamaForCausalLM") == "past_key_values"
    assert hf.cache_keyword(renamed, "LlamaForCausalLM") == "cache"
    assert hf.cache_keyword(renamed, "OtherForCausalLM") == "past_key_values"


# -- source rewriting ------------------------------------------------------------------------------
def test_localize_keeps_lines_and_points_imports_at_the_copies():
    source = ("from ..api import ModelArgs\n"
              "from torchtune.modules.kv_cache import KVCache\n"
              "from torchtune.modules import MultiHeadAttention\n"
              "from torchtune.modules import RMSNorm, MultiHeadAttention\n"
              "from .rope import apply  # kept\n")
    out = core.localize(source, "torchtune.modules.attention",
                        {"torchtune.modules.kv_cache": "kv_cache", "torchtune.modules.attention": "attention"},
                        {("torchtune.modules", "MultiHeadAttention"): "torchtune.modules.attention"})
    assert out.splitlines() == [
        "from torchtune.api import ModelArgs",
        "from kv_cache import KVCache",
        "from attention import MultiHeadAttention",
        "from torchtune.modules import RMSNorm, MultiHeadAttention",  # mixed: left alone
        "from torchtune.modules.rope import apply  # kept",
    ]


def test_a_relative_import_above_the_package_is_a_case_error():
    with pytest.raises(core.CaseError):
        core.localize("from ...x import y\n", "a.b")


def test_assigned_literal_reads_split_lists(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('pkgs = "python tqdm numpy".split()\nother = ["a", "b"]\ncomputed = f()\n')
    assert core.assigned_literal(path, "pkgs") == ["python", "tqdm", "numpy"]
    assert core.assigned_literal(path, "other") == ["a", "b"]
    assert core.assigned_literal(path, "computed") is None


def test_parse_tokens_takes_the_last_tokens_line():
    assert core.parse_tokens("model x Y\ntokens [[1, 2]]\n") == [[1, 2]]
    assert core.parse_tokens("no tokens here\n") is None


# -- harnesses -------------------------------------------------------------------------------------
@pytest.mark.parametrize("package", sorted(core.FAMILIES))
def test_every_family_harness_is_valid_python_with_the_contract(package, tmp_path):
    module = core.family(package)

    class Names(dict):
        def __missing__(self, key):
            return "X"

    try:  # the bodies formatted per case (class names, the config)
        body = module.BODY.format_map(Names())
    except (KeyError, ValueError, IndexError):  # a plain body (its braces are dict displays)
        body = module.BODY
    case = core.Case(package, "1.0", "m")
    text = core.harness_text(case, family_name=module.__name__, site=tmp_path, sources=["model.py"],
                             description="d", body=body, top_modules=("x",))
    tree = ast.parse(text)
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"build_model", "make_prompt", "prefill", "decode", "generate"} <= functions
    assigned = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    assert {"SOURCES", "MAX_SEQ_LEN", "SITE"} <= assigned


def test_init_parameters_sets_everything_from_the_seed():
    def build():
        torch.manual_seed(123)  # whatever the module's own init did must not matter
        return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 3))
    a = harness_support.init_parameters(build())
    torch.manual_seed(7)
    b = harness_support.init_parameters(build())
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert torch.equal(a[1].weight, torch.ones(4)) and torch.equal(a[1].bias, torch.zeros(4))
    assert not a.training


# -- stand-ins -------------------------------------------------------------------------------------
@pytest.fixture()
def shim_path(monkeypatch):
    for folder in ("xformers", "fairscale"):
        monkeypatch.syspath_prepend(str(core.SHIMS / folder))
    for name in [n for n in sys.modules if n.split(".")[0] in ("xformers", "fairscale")]:
        monkeypatch.delitem(sys.modules, name)


def test_xformers_stand_in_masks_match_causal_attention(shim_path):
    from xformers.ops.fmha import memory_efficient_attention
    from xformers.ops.fmha.attn_bias import (BlockDiagonalCausalMask,
                                             BlockDiagonalCausalWithOffsetPaddedKeysMask)

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 5, 2, 8) for _ in range(3))
    mask = BlockDiagonalCausalMask.from_seqlens([5]).make_local_attention(64)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert torch.allclose(memory_efficient_attention(q, k, v, mask), want, atol=1e-6)

    # Decode: one query at position 5 of a padded block of 8 keys sees keys 0..5.
    padded = BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(q_seqlen=[1], kv_padding=8, kv_seqlen=[6])
    row = padded.materialize((1, 8))
    assert torch.equal(row == 0, torch.tensor([[True] * 6 + [False] * 2]))
    # A sliding window of 3 from the bottom right.
    local = BlockDiagonalCausalMask.from_seqlens([4]).make_local_attention(3).materialize((4, 4)) == 0
    assert local.tolist() == [[True, False, False, False], [True, True, False, False],
                              [True, True, True, False], [False, True, True, True]]


def test_fairscale_stand_in_layers_are_plain_torch(shim_path):
    from fairscale.nn.model_parallel import initialize
    from fairscale.nn.model_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    assert initialize.get_model_parallel_world_size() == 1
    assert ColumnParallelLinear(4, 6, bias=False, gather_output=False, init_method=lambda x: x).weight.shape == (6, 4)
    assert RowParallelLinear(6, 4, bias=False, input_is_parallel=True).bias is None
    assert VocabParallelEmbedding(10, 4, init_method=lambda x: x).weight.shape == (10, 4)
