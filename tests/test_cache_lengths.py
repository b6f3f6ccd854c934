"""Positions counted from the carried cache's length (Qwen-7B's first remote code), on the static path.

tests/fixtures/targets/length_positions counts `kv_seq_len` from `layer_past[0].shape[1]`, sets a dynamic-NTK alpha
from it in Prefill, builds its rotary table for that many rows and keeps the last ones, and scales the queries by
log-n rows cut at the key length. Its 12-token prompt is past the 8 it was "trained" at, so the alpha is 3 and the
log-n scale differs from 1. The static path carries no cache, so those lengths must come from the positions
(transforms/codemods/lib/cache_lengths.py); where they cannot, the cache is not made static either.

The adaptation is planned from a real traced run of the fixture, as the workflow plans it; the adapted model runs
`prefill` eagerly and `decode` compiled with `fullgraph=True` and `dynamic=False`, after its first call under
`fail_on_recompile`.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from torch._dynamo.testing import CompileCounter

from adapted_files import import_adapted, write_adapted

from graphmode.agent.workflow.adaptation import evidence_options
from graphmode.runners.evidence.collect import collect_evidence
from graphmode.runners.harness import load_harness
from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

TARGET = Path(__file__).parent / "fixtures" / "targets" / "length_positions"
STEPS = 12
# The same model, with its rotary rows taken from an offset counted off the cache's length instead of a table
# built for that length: `kv_seq_len - cur_len` is no value the static path can stand for.
TABLE_AT_LENGTH = """        rotary_pos_emb = self.rotary_emb(kv_seq_len, ntk_alpha=ntk_alpha)

        # the table's last rows are the new tokens'
        cur_len = query.shape[1]
        rotary_pos_emb = rotary_pos_emb[:, -cur_len:, :, :]
"""
ROWS_FROM_OFFSET = """        cur_len = query.shape[1]
        rotary_pos_emb = self.rotary_emb(cur_len, offset=kv_seq_len - cur_len, ntk_alpha=ntk_alpha)
"""


def _adapt(folder: Path):
    """The adaptation the workflow plans from one traced run of the folder's harness."""
    evidence = collect_evidence(folder, steps=3)
    options = evidence_options(Options(entry_class="LengthPositionsLM", max_seq_len=64), evidence)
    return adapt_source((folder / "model.py").read_text(), "model.py", None, options)


def _own_loop(model, prompt):
    """The model's own way: the cache carried in and out of `forward`, no positions."""
    logits, cache = model(input_ids=prompt, use_cache=True)
    chosen, all_logits = [], [logits[:, -1]]
    for _ in range(STEPS):
        chosen.append(all_logits[-1].argmax(-1, keepdim=True))
        logits, cache = model(input_ids=chosen[-1], past_key_values=cache, use_cache=True)
        all_logits.append(logits[:, -1])
    return torch.cat(chosen, 1), all_logits


def _static_loop(model, prompt, counter):
    decode = torch.compile(model.decode, backend=counter, fullgraph=True, dynamic=False)
    length = prompt.shape[1]
    model.setup_caches(max_batch_size=1, max_seq_length=64)
    all_logits = [model.prefill(prompt, torch.arange(length))[0][:, -1]]
    chosen = []
    try:
        for step in range(STEPS):
            chosen.append(all_logits[-1].argmax(-1, keepdim=True))
            all_logits.append(decode(chosen[-1], torch.tensor([length + step]))[0][:, -1])
            if step == 0:
                torch.compiler.set_stance("fail_on_recompile")
    finally:
        torch.compiler.set_stance("default")
    return torch.cat(chosen, 1), all_logits


def test_lengths_read_off_the_cache_come_from_the_positions(tmp_path):
    result = _adapt(TARGET)
    assert {"carried_cache", "split_decode"} <= set(result.applied)
    # The attention's static twin, the code `prefill` and `decode` run.
    static = result.adapted.split("    def forward_static(")[1].split("\nclass ")[0]
    assert "kv_seq_len = graphmode_key_slots(self, position_ids[0])" in static
    assert "self.rotary_emb(graphmode_position_limit(self), ntk_alpha=ntk_alpha)" in static
    assert "rotary_pos_emb[:, position_ids[0], :, :]" in static
    assert "self.logn_tensor[:, position_ids[0], :, :]" in static
    assert "layer_past[0].shape[1]" not in static
    write_adapted(tmp_path, {"model.py": result.adapted})
    harness = load_harness(TARGET)
    original, prompt = harness.build_model(), harness.make_prompt()
    adapted_module = import_adapted(tmp_path / "model.py", "length_positions_adapted")
    adapted = adapted_module.LengthPositionsLM(adapted_module.Config()).eval()
    adapted.load_state_dict(original.state_dict())
    counter = CompileCounter()
    with torch.inference_mode():
        want, want_logits = _own_loop(original, prompt)
        got, got_logits = _static_loop(adapted, prompt, counter)
        # `forward` called directly runs the model's own code, cache and all.
        direct, _ = _own_loop(adapted, prompt)
    torch._dynamo.reset()
    assert torch.equal(got, want) and torch.equal(direct, want)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got_logits, want_logits))
    # One graph for every Decode step: the table was built for every slot in Prefill, not grown by a Decode step.
    assert counter.frame_count == 1
    # The controls: the prompt set an NTK alpha above 1 on both sides, and the tokens vary.
    assert original.h[0].attn._ntk_cached == adapted.h[0].attn._ntk_cached == 3
    assert len(set(want[0].tolist())) > 1


def test_a_length_the_positions_cannot_give_leaves_the_cache_as_it_is(tmp_path):
    """A design never applies a change that breaks a line it leaves for a person: the cache stays a carried tuple,
    and the line reading its length and the cat both go to a person."""
    folder = tmp_path / "target"
    shutil.copytree(TARGET, folder, ignore=shutil.ignore_patterns("__pycache__"))
    source = (folder / "model.py").read_text()
    assert TABLE_AT_LENGTH in source
    source = source.replace(TABLE_AT_LENGTH, ROWS_FROM_OFFSET)
    (folder / "model.py").write_text(source)
    result = _adapt(folder)
    assert "carried_cache" not in result.applied and "StaticKVBuffers" not in result.adapted
    lines = source.splitlines()
    left = {m.line: m.reason for m in result.manual if m.codemod == "carried_cache"}
    assert [lines[line - 1].strip() for line in sorted(left)] == [
        "kv_seq_len += layer_past[0].shape[1]", "key = torch.cat((past_key, key), dim=1)"]
    length_line, cat_line = sorted(left)
    offset_line = next(i for i, text in enumerate(lines, 1) if "offset=kv_seq_len - cur_len" in text)
    assert f"makes positions of it at line {offset_line}" in left[length_line]
    assert f"reads its length at line {length_line}" in left[cat_line]
