"""A KV cache added to models that keep none (transforms/codemods/caches/added_cache.py), run for real; and the trace no
longer takes a growing mask beside one new token for a model that recomputes its sequence.

The adapted models run their `prefill` eagerly and their `decode` compiled with `fullgraph=True` (no graph break)
and, after its first call, under `fail_on_recompile`; the tokens and logits must be the original's, computed by
feeding the whole sequence every step as the model's own loop does.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from adapted_files import import_adapted, write_adapted

from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

FIXTURES = Path(__file__).parent / "fixtures"
NO_CACHE = FIXTURES / "targets" / "no_cache" / "model.py"
NANOGPT_STYLE = FIXTURES / "codemods" / "added_cache" / "is_causal.in.py"
NOT_CAUSAL = FIXTURES / "codemods" / "added_cache" / "not_causal.in.py"
STEPS = 10


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _adapted(source: Path, entry_class: str, tokens: str, tmp_path: Path):
    """The original module and the module graphmode writes for it, as the workflow's options would give them."""
    options = Options(entry_class=entry_class, recomputes_sequence=True, traced=True,
                      entry_roles=((tokens, "tokens"),))
    result = adapt_source(source.read_text(), "model.py", None, options)
    assert {"added_cache", "split_decode"} <= set(result.applied) and not result.manual
    write_adapted(tmp_path, {"adapted.py": result.adapted})
    return _module(source, f"original_{tmp_path.name}"), import_adapted(tmp_path / "adapted.py",
                                                                        f"adapted_{tmp_path.name}")


def _build(module, name: str, config, fused: bool, monkeypatch):
    """nanoGPT picks fused attention or its causal buffer at construction, by whether torch has the former."""
    with monkeypatch.context() as patch:
        if not fused:
            patch.delattr(torch.nn.functional, "scaled_dot_product_attention")
        torch.manual_seed(0)
        return getattr(module, name)(config).eval()


def _logits(output) -> torch.Tensor:
    return (output[0] if isinstance(output, tuple) else output)[:, -1, :]


def _original_loop(model, prompt):
    """The model's own way: the whole sequence again every step."""
    sequence, chosen, logits = prompt, [], []
    for _ in range(STEPS + 1):
        logits.append(_logits(model(sequence)))
        chosen.append(logits[-1].argmax(-1, keepdim=True))
        sequence = torch.cat([sequence, chosen[-1]], dim=1)
    return torch.cat(chosen, 1), logits


def _static_loop(model, prompt):
    """prefill, then `decode` fed the new token alone, compiled whole; a second shape of call would recompile."""
    decode = torch.compile(model.decode, backend="eager", fullgraph=True)
    length = prompt.shape[1]
    model.setup_caches(max_batch_size=1, max_seq_length=32)
    logits = [_logits(model.prefill(prompt, torch.arange(length)))]
    chosen = [logits[-1].argmax(-1, keepdim=True)]
    for step in range(STEPS):
        logits.append(_logits(decode(chosen[-1], torch.tensor([length + step]))))
        chosen.append(logits[-1].argmax(-1, keepdim=True))
        if step == 0:
            torch.compiler.set_stance("fail_on_recompile")
    torch.compiler.set_stance("default")
    return torch.cat(chosen, 1), logits


CASES = {
    "causal buffer (minGPT style)": (NO_CACHE, "GPT", True),
    "is_causal=True (nanoGPT, fused)": (NANOGPT_STYLE, "Model", True),
    "causal buffer (nanoGPT, without fused attention)": (NANOGPT_STYLE, "Model", False),
}


@pytest.mark.parametrize("case", CASES)
def test_an_added_cache_gives_the_original_tokens_and_logits_with_one_graph(case, tmp_path, monkeypatch):
    source, entry_class, fused = CASES[case]
    original_module, adapted_module = _adapted(source, entry_class, "idx", tmp_path)
    config = original_module.GPTConfig() if hasattr(original_module, "GPTConfig") else SimpleNamespace(
        block_size=32, vocab_size=96, n_layer=2, n_head=4, n_embd=32, bias=True, dropout=0.0)
    prompt = torch.randint(0, config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    original, adapted = (_build(m, entry_class, config, fused, monkeypatch) for m in (original_module, adapted_module))
    adapted.load_state_dict(original.state_dict())
    with torch.inference_mode():
        want, want_logits = _original_loop(original, prompt)
        got, got_logits = _static_loop(adapted, prompt)
        # `forward` called directly is the original's: it still recomputes the whole sequence.
        direct, _ = _original_loop(adapted, prompt)
    torch._dynamo.reset()
    assert torch.equal(got, want) and torch.equal(direct, want)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got_logits, want_logits))
    # The controls: the tokens vary, and Decode was fed one token at a time (the static path kept the rest).
    assert len(set(want[0].tolist())) > 1


def test_the_position_rows_hide_later_and_unwritten_slots():
    """What stands for `is_causal=True` over the cache: a token at position p reads slots 0..p, whatever the
    slots after p hold (later tokens' keys in Prefill, zeros not written yet in Decode)."""
    from graphmode.transforms.codemods.caches.added_cache import POSITION_ROWS
    from graphmode.transforms.codemods.lib.helper_code import helper_source

    namespace = {"torch": torch}
    exec(helper_source(POSITION_ROWS), namespace)
    attention = SimpleNamespace(graphmode_static_state={"slots": torch.tensor([2, 3])})
    rows = namespace[POSITION_ROWS](attention, torch.zeros(1, 4, 6, 8))  # keys: (batch, heads, 6 slots, dim)
    assert rows.dtype is torch.bool
    assert rows.tolist() == [[True, True, True, False, False, False], [True, True, True, True, False, False]]


def test_attention_without_a_causal_mask_gets_no_cache_and_says_why():
    result = adapt_source(NOT_CAUSAL.read_text(), "model.py", None,
                          Options(entry_class="Model", recomputes_sequence=True, traced=True,
                                  entry_roles=(("tokens", "tokens"),)))
    assert result.adapted == NOT_CAUSAL.read_text()
    reasons = {m.codemod: m.reason for m in result.manual}
    assert "without a causal mask a token's keys would depend on later tokens" in reasons["added_cache"]
    assert "Decode is given the whole sequence every step" in reasons["split_decode"]


def test_verify_repeats_the_designs_reason_when_no_entries_were_added(tmp_path):
    """verify does not report a missing `prefill` method: it says what the design said about the entries."""
    from graphmode.agent.workflow.nodes import design, verify
    from graphmode.agent.workflow.state import Baseline, RunOptions, RunState
    from graphmode.runners.evidence.entry_calls import EntryCalls, ParameterUse
    from graphmode.runners.evidence.model import Evidence, SourceLine

    target = tmp_path / "target"
    target.mkdir()
    shutil.copy(NOT_CAUSAL, target / "model.py")
    (target / "harness.py").write_text("SOURCES = ['model.py']\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tokens = ParameterUse("tokens", "tokens", in_prefill=True, in_decode=True, positional=True,
                          summary="int tensor whose last dim grows 5 -> 6, 7, 8")
    evidence = Evidence(folder=str(target), sources=["model.py"], steps=3, prompt_shape=[1, 5], new_tokens=1,
                        recomputes_sequence=SourceLine("model.py", 30),
                        entry_calls=EntryCalls("Model", 5, [tokens]).to_dict())
    state = RunState(session_id="added-cache", options=RunOptions(target=str(target), run_dir=str(run_dir)),
                     sources=["model.py"], baseline=Baseline(entry_class="Model"),
                     evidence={**evidence.to_dict(), "summary": evidence.summary()})
    state = RunState.model_validate({**state.model_dump(), **design(state)})  # as the workflow merges a step's fields
    designed = [r["reason"] for item in state.manual for r in item.reasons if r.get("codemod") == "added_cache"]
    assert designed and designed[0] in (run_dir / "design.md").read_text()
    verification = verify(state.model_copy(update={"applied": []}))["verification"]
    (problem,) = verification.problems
    assert not verification.ran and designed[0] in problem and "is this an adapted folder" not in problem


def test_a_growing_mask_beside_one_new_token_is_no_missing_cache(tmp_path):
    """generate()'s way of feeding a model with a cache: one token, the cache, and a 2-D mask one column longer
    every step. Only a token input that grows means the sequence is recomputed; the mask is a finding of its own."""
    from graphmode.runners.evidence.collect import collect_evidence
    from graphmode.runners.evidence.findings import evidence_findings

    folder = tmp_path / "growing_mask"
    shutil.copytree(FIXTURES / "evidence" / "growing_mask", folder)
    evidence = collect_evidence(folder, steps=3, timeout_s=300)
    roles = {p["name"]: (p["role"], p["summary"]) for p in evidence.entry_calls["parameters"]}
    assert roles["input_ids"] == ("tokens", "int tensor [1, 1] (new tokens)")
    assert roles["attention_mask"][0] == "state" and "grows" in roles["attention_mask"][1]
    assert evidence.recomputes_sequence is None and "no KV cache" not in evidence.summary()
    findings = evidence_findings(evidence)
    assert not [f for f in findings if f.message.startswith("no KV cache")]
    mask_line = next(n for n, text in enumerate((folder / "model.py").read_text().splitlines(), 1)
                     if "# EVIDENCE: mask" in text)
    (mask,) = [f for f in findings if f.line == mask_line]
    assert mask.code == "GM201" and "a mask the caller grows" in mask.message
    # The cache it does keep is still seen as one.
    assert [f.code for f in findings if "KV cache grows" in f.message] == ["GM301", "GM301"]
