"""Bloom-lineage attention on the static path (tests/fixtures/codemods/carried_cache/offset_windows): the cache
grows `if use_cache:` by the last row of the new keys, and the rotary tables are cut at the past length read off
the carried cache. The static copy writes the buffers whatever `use_cache` says and hands the helper the tables'
rows at the slots; compiled whole, its Decode gives the original's outputs. Real torch, a tiny layer."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from adapted_files import import_adapted

FIXTURE = Path(__file__).parent / "fixtures" / "codemods" / "carried_cache" / "offset_windows"
PROMPT, STEPS, SLOTS = 5, 3, 32


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_static_copy_compiled_whole_gives_the_originals_decode():
    original = _load(FIXTURE.with_name(FIXTURE.name + ".in.py"), "offset_windows_original")
    adapted = import_adapted(FIXTURE.with_name(FIXTURE.name + ".out.py"), "offset_windows_adapted")
    torch.manual_seed(0)
    reference, static = original.Attention(16, 2), adapted.Attention(16, 2)
    static.load_state_dict(reference.state_dict(), strict=False)  # the buffers of the static cache are its own
    # What GraphmodeStaticPath and setup_caches do for the entries (split_decode, not run on this fixture).
    state = {"on": True, "slots": None, "padding": None, "max_batch_size": 1, "max_seq_len": SLOTS}
    for module in static.modules():
        module.graphmode_static_state = state
    static.kv_cache.graphmode_resize(1, SLOTS)
    step = torch.compile(static, backend="eager", fullgraph=True)  # a graph break raises
    prompt = torch.randn(PROMPT, 1, 16)
    with torch.no_grad():
        _, past = reference(prompt, None, use_cache=True)
        state["slots"] = torch.arange(PROMPT)
        static(prompt, None, use_cache=False)  # Prefill, eagerly: writes the prompt's keys and values
        for position in range(PROMPT, PROMPT + STEPS):
            token = torch.randn(1, 1, 16)
            expected, past = reference(token, past, use_cache=True)
            state["slots"] = torch.tensor([position])
            got, _ = step(token, None, use_cache=False)
            torch.testing.assert_close(got, expected)
