"""A model split over two files (tests/fixtures/targets/split_files: the layers in layers.py, the model class and
the mask it builds in model.py, as Hunyuan-A13B's Hub folder splits modeling_hunyuan.py and hunyuan.py): the cache
made static in one file and its mask in the other change together (transforms.pipeline.adapt_files), and the pair
gives the original's tokens from one compiled Decode graph."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch._dynamo.testing import CompileCounter

from adapted_files import write_adapted

from graphmode.runners.harness import load_harness
from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_files, adapt_source

TARGET = Path(__file__).parent / "fixtures" / "targets" / "split_files"
FILES = ("layers.py", "model.py")
OPTIONS = Options(entry_class="SplitLM", max_seq_len=64)
STEPS = 10


def _texts() -> list[tuple[str, str]]:
    return [(name, (TARGET / name).read_text()) for name in FILES]


def test_each_file_alone_changes_nothing_of_the_cache():
    # Alone, the layers' file has a cache and no mask, and the model's file a mask and no cache: neither changes.
    alone = {name: adapt_source(text, name, None, OPTIONS) for name, text in _texts()}
    assert "cache_object" not in alone["layers.py"].applied and "cache_object" not in alone["model.py"].applied
    assert any("no mask helper" in m.reason for m in alone["layers.py"].manual)


def test_the_cache_and_its_mask_in_two_files_change_together():
    adapted = adapt_files(_texts(), None, lambda name: OPTIONS)
    assert "cache_object" in adapted["layers.py"].applied
    assert {"cache_object", "split_decode"} <= set(adapted["model.py"].applied)
    assert "self.kv_cache.update(" in adapted["layers.py"].adapted
    assert "graphmode_padded_rows(self, self.causal_mask, graphmode_slots(self))" in adapted["model.py"].adapted
    # Where the mask cannot follow (its call is not one graphmode rewrites), neither side changes.
    texts = dict(_texts())
    assert texts["model.py"].count("(batch_size, seq_length), inputs_embeds") == 1
    texts["model.py"] = texts["model.py"].replace("(batch_size, seq_length), inputs_embeds",
                                                  "input_ids.shape, inputs_embeds")
    kept = adapt_files(texts.items(), None, lambda name: OPTIONS)
    assert "cache_object" not in kept["layers.py"].applied and "cache_object" not in kept["model.py"].applied


def test_the_adapted_pair_gives_the_original_tokens_from_one_graph(tmp_path):
    adapted = adapt_files(_texts(), None, lambda name: OPTIONS)
    write_adapted(tmp_path, {name: adapted[name].adapted for name in FILES})
    saved_path, saved = list(sys.path), {name: sys.modules.pop(name, None) for name in ("layers", "model", "harness")}
    try:
        harness = load_harness(TARGET)
        original, prompt = harness.build_model(), harness.make_prompt()
        for name in ("layers", "model"):
            sys.modules.pop(name, None)
        sys.path.insert(0, str(tmp_path))
        import model as adapted_model  # the adapted pair, from tmp_path

        model = adapted_model.SplitLM(adapted_model.Config()).eval()
        model.load_state_dict(original.state_dict())
        counter = CompileCounter()
        with torch.inference_mode():
            want = _own_loop(original, prompt)
            got = _static_loop(model, prompt, counter)
    finally:
        torch.compiler.set_stance("default")
        torch._dynamo.reset()
        sys.path[:] = saved_path
        for name, module in saved.items():
            sys.modules.pop(name, None)
            if module is not None:
                sys.modules[name] = module
    assert torch.equal(got[0], want[0]), (got[0], want[0])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got[1], want[1]))
    assert counter.frame_count == 1  # one graph for every Decode step
    assert len(set(want[0][0].tolist())) > 1  # the tokens vary: equal tokens prove something


def _own_loop(model, prompt):
    logits, cache = model(prompt, use_cache=True)
    chosen, seen = [], [logits[:, -1]]
    for _ in range(STEPS):
        chosen.append(seen[-1].argmax(-1, keepdim=True))
        logits, cache = model(chosen[-1], past_key_values=cache, use_cache=True)
        seen.append(logits[:, -1])
    return torch.cat(chosen, 1), seen


def _static_loop(model, prompt, counter):
    decode = torch.compile(model.decode, backend=counter, fullgraph=True, dynamic=False)
    length = prompt.shape[1]
    model.setup_caches(max_batch_size=1, max_seq_length=64)
    seen, chosen = [model.prefill(prompt, torch.arange(length))[0][:, -1]], []
    for step in range(STEPS):
        chosen.append(seen[-1].argmax(-1, keepdim=True))
        seen.append(decode(chosen[-1], torch.tensor([length + step]))[:, -1])
        if step == 0:
            torch.compiler.set_stance("fail_on_recompile")
    return torch.cat(chosen, 1), seen
