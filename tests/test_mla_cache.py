"""Caches described by what the trace saw, not by names (issue 23): a DeepSeek-V2-style model whose multi-head latent
attention writes keys and values of different head sizes through a cache object, with no KV head count in `__init__`.

tests/fixtures/targets/mla_cache runs under the installed transformers (its cache object is its own, as the 4.36-4.55
`DynamicCache` was). The trace records each layer's keys and values apart; cache_object shapes the static buffers
from the writes, along the dims the trace saw them grow (the Cache API's -2 when it did not trace). The adapted file is
a drop-in: the model's own loop gives the original's logits bit for bit, and prefill plus a compiled decode its tokens.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch

from adapted_files import write_adapted

from graphmode.agent.workflow.adaptation import evidence_cache_writes, evidence_caches
from graphmode.runners.evidence.collect import collect_evidence
from graphmode.runners.evidence.model import Evidence
from graphmode.transforms.codemods import Options
from graphmode.transforms.output.helper_module import MODULE_NAME as HELPER_MODULE
from graphmode.transforms.pipeline import adapt_source

TARGET = Path(__file__).parent / "fixtures" / "targets" / "mla_cache"
STEPS = 3  # Decode steps traced
GREEDY_STEPS = 10


def _load(folder: Path, name: str):
    """A folder's harness, with its model module imported from that folder under a name of its own."""
    sys.path.insert(0, str(folder))
    before = set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_model", folder / "model.py")
        model = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(model)
        sys.modules["model"] = model  # what the harness imports
        spec = importlib.util.spec_from_file_location(f"{name}_harness", folder / "harness.py")
        harness = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(harness)
    finally:
        sys.path.remove(str(folder))
        # The model and its siblings (`cache`, `masks`) leave with it: another folder's files share those names. But
        # graphmode's helper module stays, as it does in a harness's process: Dynamo imports a traced function's
        # module by name, and the module is the same text in every folder.
        for sibling in set(sys.modules) - before - {HELPER_MODULE}:
            if Path(getattr(sys.modules[sibling], "__file__", None) or "/").parent == folder:
                sys.modules.pop(sibling)
    return harness


@pytest.fixture(scope="module")
def evidence():
    return collect_evidence(TARGET, steps=STEPS)


def _update_line() -> int:
    lines = (TARGET / "model.py").read_text().splitlines()
    (line,) = [n for n, text in enumerate(lines, 1) if "= past_key_value.update(" in text]
    return line


def _options(evidence: Evidence | None) -> Options:
    if evidence is None:
        return Options(entry_class="MLAForCausalLM")
    return Options(entry_class="MLAForCausalLM", traced=True, evidence_caches=evidence_caches(evidence),
                   evidence_cache_writes=evidence_cache_writes(evidence))


def _adapted(tmp_path: Path, evidence: Evidence | None) -> Path:
    folder = tmp_path / "adapted"
    shutil.copytree(TARGET, folder, ignore=shutil.ignore_patterns("__pycache__"))
    result = adapt_source((TARGET / "model.py").read_text(), "model.py", None, _options(evidence))
    assert {"cache_object", "split_decode"} <= set(result.applied), result.manual
    assert not [item for item in result.manual if item.codemod == "cache_object"]
    write_adapted(folder, {"model.py": result.adapted})
    return folder


def _greedy(harness, model, prompt):
    """The harness's own loop: every step's logits, the tokens and the cache it carries at the end."""
    with torch.no_grad():
        logits, state = harness.prefill(model, prompt)
        steps, tokens = [logits], []
        for _ in range(GREEDY_STEPS):
            tokens.append(logits.argmax(-1, keepdim=True))
            logits, state = harness.decode(model, tokens[-1], state)
            steps.append(logits)
    return steps, torch.cat(tokens, 1), state[0]


def test_the_trace_records_each_layers_keys_and_values_apart(evidence):
    harness = _load(TARGET, "traced")
    config = harness.build_model().config
    length = harness.make_prompt().shape[1] + STEPS
    keys = (1, config.num_attention_heads, length, config.qk_nope_head_dim + config.qk_rope_head_dim)
    values = (1, config.num_attention_heads, length, config.v_head_dim)
    layers = config.num_hidden_layers
    # The cats run in cache.py, two lines of it: attributed to the model line that called update().
    assert evidence_cache_writes(evidence) == (("model.py", _update_line(), (2, 2), ((keys,) * layers,
                                                                                    (values,) * layers)),)
    assert not evidence_caches(evidence)  # no cat of the model's own grows a cache


@pytest.mark.parametrize("traced, constructed", [(True, "StaticKVCache(seq_dim=2)"),
                                                 (False, "StaticKVCache(seq_dim=-2)")])
def test_the_static_cache_is_shaped_by_the_writes_where_no_name_describes_it(tmp_path, evidence, traced,
                                                                             constructed):
    """Before issue 23 this model got a manual item: its `__init__` names no KV head count."""
    adapted = (_adapted(tmp_path, evidence if traced else None) / "model.py").read_text()
    assert adapted.count(f"self.kv_cache = {constructed}\n") == 1
    harness = _load(tmp_path / "adapted", "sized")
    model = harness.build_model()
    model.setup_caches(max_batch_size=1, max_seq_length=32)
    prompt = harness.make_prompt()
    with torch.no_grad():
        model.prefill(prompt, torch.arange(prompt.shape[1]))
    config = model.config
    shapes = [(tuple(m.kv_cache.k_cache.shape), tuple(m.kv_cache.v_cache.shape)) for m in model.modules()
              if hasattr(m, "kv_cache")]
    assert shapes == [((1, config.num_attention_heads, 32, config.qk_nope_head_dim + config.qk_rope_head_dim),
                       (1, config.num_attention_heads, 32, config.v_head_dim))] * config.num_hidden_layers


def test_the_adapted_model_is_a_drop_in_and_its_compiled_decode_gives_the_originals_tokens(tmp_path, evidence):
    original_harness = _load(TARGET, "original")
    adapted_harness = _load(_adapted(tmp_path, evidence), "adapted")
    original, adapted = original_harness.build_model(), adapted_harness.build_model()
    adapted.load_state_dict(original.state_dict())
    prompt = original_harness.make_prompt()

    # Through forward with its own cache object, as generate() calls it: the original's logits, bit for bit.
    expected_steps, expected, expected_cache = _greedy(original_harness, original, prompt)
    got_steps, got, got_cache = _greedy(adapted_harness, adapted, prompt)
    assert all(torch.equal(a, b) for a, b in zip(got_steps, expected_steps))
    assert [(k.shape, v.shape) for k, v in got_cache] == [(k.shape, v.shape) for k, v in expected_cache]

    # The static path: prefill eagerly, then one compiled graph for every Decode step.
    adapted.setup_caches(max_batch_size=1, max_seq_length=32)
    torch._dynamo.reset()
    decode = torch.compile(adapted.decode, backend="aot_eager", fullgraph=True)
    length = prompt.shape[1]
    with torch.no_grad():
        logits = adapted.prefill(prompt, torch.arange(length))[:, -1]
        tokens = []
        for step in range(GREEDY_STEPS):
            tokens.append(logits.argmax(-1, keepdim=True))
            logits = decode(tokens[-1], torch.tensor([length + step]))[:, -1]
    assert torch.equal(torch.cat(tokens, 1), expected)
