"""The equivalence battery (runners/workers/battery_worker.py): one test per row, each on a file the row must pass and
on one it must catch.

The file to catch is graphmode's rewrite put in place of the original (`FileAdaptation.static_view`), which is what
earlier releases wrote: the harness's one greedy sequence verified on it, while padded batches, a second
conversation and a batch of three did not behave as the original.
"""
from __future__ import annotations

import inspect
import shutil
import sys
from pathlib import Path

import pytest
import torch

from adapted_files import write_adapted

from graphmode.runners.backends import resolve
from graphmode.runners.harness import load_harness
from graphmode.runners.workers.battery_worker import FAILED, HELD, NOT_APPLICABLE, Battery
from graphmode.transforms.codemods import Options
from graphmode.transforms.codemods.lib.helper_code import helper_module_text
from graphmode.transforms.output.helper_module import MODULE_NAME
from graphmode.transforms.pipeline import adapt_source

ROOT = Path(__file__).parents[1]
HF_EXAMPLE = ROOT / "examples" / "hf_cache_api"


def _folder(tmp: Path, name: str, model_source: str) -> Path:
    folder = tmp / name
    shutil.copytree(HF_EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    write_adapted(folder, {"model.py": model_source})
    return folder


def _built(folder: Path):
    path = list(sys.path)
    try:
        harness = load_harness(folder)
        return harness, harness.build_model()
    finally:
        sys.path[:] = path


@pytest.fixture(scope="module")
def batteries(tmp_path_factory):
    """{"adapted": the battery on graphmode's output, "in_place": on the rewrite put in place of the original}."""
    tmp = tmp_path_factory.mktemp("battery")
    adaptation = adapt_source((HF_EXAMPLE / "model.py").read_text(), "model.py", None,
                              Options(entry_class="ForCausalLM"))
    backend, _ = resolve("aot_eager")
    original = _built(HF_EXAMPLE)
    made = {}
    # In place, with the slots read off the positions of row 0, as earlier releases wrote them (no entry sets them).
    in_place = adaptation.static_view.replace("graphmode_slots(self)", "position_ids[0]")
    for name, source in (("adapted", adaptation.adapted), ("in_place", in_place)):
        made[name] = Battery(*original, *_built(_folder(tmp, name, source)), backend)
    yield made
    for name in ("harness", "model", "cache", "masks"):
        sys.modules.pop(name, None)


def _row(battery: Battery, method: str):
    with torch.inference_mode():
        return getattr(battery, method)()


def test_a_left_padded_batch_with_its_mask(batteries):
    assert _row(batteries["adapted"], "padded_batch").status == HELD
    caught = _row(batteries["in_place"], "padded_batch")
    assert caught.status == FAILED and "index_copy_" in caught.detail  # static buffers of one sequence


def test_the_models_own_loop_with_three_sequences(batteries):
    assert _row(batteries["adapted"], "own_loop_batch").status == HELD
    caught = _row(batteries["in_place"], "own_loop_batch")
    assert caught.status == FAILED, caught  # static buffers of one sequence


def test_two_conversations_interleaved(batteries):
    held = _row(batteries["adapted"], "two_conversations")
    assert held.status == HELD and held.path == "own"
    caught = _row(batteries["in_place"], "two_conversations")
    assert caught.status == FAILED and "tokens differ" in caught.detail  # one module-held cache, overwritten


def test_generate_where_the_model_has_none_is_not_applicable(batteries):
    row = _row(batteries["adapted"], "generate_strategies")
    assert row.status == NOT_APPLICABLE and "generate" in row.detail


def test_the_static_path_up_to_the_last_slot(batteries):
    row = _row(batteries["adapted"], "near_sized_length")
    assert row.status == HELD and row.path == "static" and "the last slot of 64" in row.name


def test_a_prompt_past_the_sized_length_is_refused_by_name(batteries, tmp_path):
    row = _row(batteries["adapted"], "past_sized_length")
    assert row.status == HELD and "setup_caches(" in row.detail
    # Without the check graphmode puts at the top of `prefill`, the write fails deep in attention: caught.
    battery = batteries["adapted"]
    source = (Path(battery.adapted_harness.__file__).parent / "model.py").read_text()
    assert source.count("graphmode_fits(self, input_ids, input_pos)\n") == 1
    unchecked = _folder(tmp_path, "unchecked", source.replace("graphmode_fits(self, input_ids, input_pos)\n", "pass\n"))
    blind = Battery(battery.original_harness, battery.original, *_built(unchecked), battery.backend)
    caught = _row(blind, "past_sized_length")
    assert caught.status == FAILED and "not refused" in caught.detail


def test_generate_strategies_run_on_a_transformers_model():
    transformers = pytest.importorskip("transformers")
    from graphmode.runners.hf_driver import StaticCacheDecoder, reinitialise, tiny_config_overrides

    def build():
        config = transformers.LlamaConfig(**tiny_config_overrides(transformers.LlamaConfig),
                                          max_position_embeddings=64)
        torch.manual_seed(0)
        return StaticCacheDecoder(reinitialise(transformers.LlamaForCausalLM(config)), 64)

    class Harness:  # the battery reads make_prompt and MAX_SEQ_LEN only for this row
        MAX_SEQ_LEN = 64

        @staticmethod
        def make_prompt():
            return torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))

    backend, _ = resolve("aot_eager")
    row = _row(Battery(Harness, build(), Harness, build(), backend), "generate_strategies")
    assert row.status == HELD, row


def test_two_conversations_on_the_static_path_held_and_restored(batteries):
    row = _row(batteries["adapted"], "two_static_conversations")
    assert row.status == HELD and row.path == "static", row
    # Without holding and restoring, the second conversation's Prefill overwrites the first one's cache.
    battery = batteries["adapted"]

    class Forgetful:
        hold = staticmethod(lambda model: {})
        restore = staticmethod(lambda model, held: None)

    prompts = [battery.prompt, battery.prompt.flip(-1)]
    with torch.inference_mode():
        kept = battery._interleaved_static(prompts, inspect.getmodule(type(battery.adapted)).GraphmodeStaticPath)
        lost = battery._interleaved_static(prompts, Forgetful)
    assert kept[0]["tokens"] != lost[0]["tokens"]


def test_a_left_padded_batch_on_the_static_path(batteries, tmp_path):
    row = _row(batteries["adapted"], "padded_static_batch")
    assert row.status == HELD and row.path == "static", row
    battery = batteries["adapted"]
    source = (Path(battery.adapted_harness.__file__).parent / "model.py").read_text()
    # Mask rows that drop the padding mask (in graphmode_static.py beside the model): the padded rows read their
    # padding, and the row catches it.
    applied = "    if padding is None:\n        return rows\n"
    assert helper_module_text().count(applied) == 1
    # Under a name of its own: the process keeps the helper module it loaded first (runners.harness).
    blind_helpers = f"{MODULE_NAME}_blind"
    folder = _folder(tmp_path, "blind", source.replace(f"from {MODULE_NAME} import", f"from {blind_helpers} import"))
    (folder / f"{blind_helpers}.py").write_text(helper_module_text().replace(applied, "    return rows\n"))
    blind = Battery(battery.original_harness, battery.original, *_built(folder), battery.backend)
    caught = _row(blind, "padded_static_batch")
    assert caught.status == FAILED and "differ" in caught.detail, caught
    # Entries that take no padding mask do not offer the row: it says so instead of failing.
    entries = "def prefill(self, input_ids, input_pos, attention_mask=None):"
    assert source.count(entries) == 1
    plain = Battery(battery.original_harness, battery.original,
                    *_built(_folder(tmp_path, "plain",
                                    source.replace(entries, "def prefill(self, input_ids, input_pos):"))),
                    battery.backend)
    offered = _row(plain, "padded_static_batch")
    assert offered.status == NOT_APPLICABLE and "not offered" in offered.detail


def test_the_static_padded_row_counts_positions_as_generate_does(tmp_path):
    """Hub code whose `forward` counts positions from 0 at every call when given none (stable-code-3b's) runs right
    only under generate(), which passes positions counted from the mask: the row's reference loop passes them too."""
    counted = "past_key_values_length, seq_length + past_key_values_length, dtype=torch.long"
    source = (HF_EXAMPLE / "model.py").read_text()
    assert source.count(counted) == 1
    from_zero = source.replace(counted, "0, seq_length, dtype=torch.long")
    row = _padded_static_row(tmp_path, original=from_zero, adapted_from=from_zero)
    assert row.status == HELD and row.path == "static", row


def test_an_original_that_drops_padding_in_decode_is_not_the_reference(tmp_path):
    """Where the original's own padded loop is wrong (GIT widens its Decode mask by image tokens a text-only cache
    does not hold; here Decode drops the padding mask), each row run alone, unpadded, is the reference: the static
    path that gives those rows holds, and the row says why the padded loop was set aside."""
    branch = '        if self.config.attn_implementation == "sdpa":\n'
    source = (HF_EXAMPLE / "model.py").read_text()
    assert source.count(branch) == 1
    dropped = "        if past_key_values_length > 0:\n            attention_mask = None\n"
    blind = source.replace(branch, dropped + branch)
    # The adaptation of the correct file, against the original that drops the mask.
    row = _padded_static_row(tmp_path, original=blind, adapted_from=source)
    assert row.status == HELD and "as each row run alone, unpadded" in row.detail, row
    assert "whose own padded loop gives other tokens" in row.detail


def _padded_static_row(tmp_path: Path, original: str, adapted_from: str):
    """The left-padded static row of the example's harness with `original` as its model.py, against graphmode's
    adaptation of `adapted_from`."""
    original_folder = tmp_path / "original"
    shutil.copytree(HF_EXAMPLE, original_folder, ignore=shutil.ignore_patterns("__pycache__"))
    (original_folder / "model.py").write_text(original)
    adaptation = adapt_source(adapted_from, "model.py", None, Options(entry_class="ForCausalLM"))
    backend, _ = resolve("aot_eager")
    try:
        battery = Battery(*_built(original_folder), *_built(_folder(tmp_path, "adapted", adaptation.adapted)),
                          backend)
        return _row(battery, "padded_static_batch")
    finally:
        for name in ("harness", "model", "cache", "masks"):
            sys.modules.pop(name, None)
