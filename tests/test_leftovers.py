"""Which leftover items the adapted Decode runs: the line tracer, and the mapping from original lines."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

from graphmode.agent.workflow import nodes
from graphmode.agent.workflow.leftovers import mark_decode_runs
from graphmode.agent.workflow.state import Baseline, RunOptions, RunState, Verification
from graphmode.runners.evidence.line_trace import lines_run
from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source, fixed_by
from graphmode.transforms.rules import scan_source

MODEL = '''import torch


def step(x, flash=False):
    if flash:
        return x.sum().item()  # another path
    y = x * 2
    return y + 1
'''


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def test_the_tracer_records_the_lines_run_in_the_folder_only(tmp_path):
    (tmp_path / "tiny_model.py").write_text(MODEL)
    module = _load(tmp_path / "tiny_model.py")
    result, lines = lines_run(lambda: module.step(torch.ones(2)), tmp_path)
    assert torch.equal(result, torch.full((2,), 3.0))
    assert set(lines) == {"tiny_model.py"}  # torch's own files are not traced
    run = set(lines["tiny_model.py"])
    assert {5, 7, 8} <= run and 6 not in run


def test_items_are_marked_through_the_adapted_line_numbers(tmp_path):
    target, adapted = tmp_path / "target", tmp_path / "adapted"
    target.mkdir(), adapted.mkdir()
    (target / "model.py").write_text(MODEL)
    # The adapted copy has two lines inserted at the top: original line N is adapted line N + 2.
    (adapted / "model.py").write_text("# added\n# added\n" + MODEL)
    manual = [{"path": "model.py", "line": 6, "kind": "finding"}, {"path": "model.py", "line": 7, "kind": "finding"}]
    marked = mark_decode_runs(manual, {"model.py": [7, 9, 10]}, target, adapted)
    assert [m["decode_runs"] for m in marked] == [False, True]
    assert [m["decode_runs"] for m in mark_decode_runs(manual, {}, target, adapted)] == [None, None]


# A default Python-int position (GM501, and static_positions' note on why it leaves it) and two `.item()`
# calls on one line (GM101 twice, the same message): lines left for a person for more than one reason.
TWICE_LEFT = '''import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, past_key_values_length=0):
        positions = torch.arange(past_key_values_length, past_key_values_length + x.shape[1])
        h = self.proj(x) + positions[None, :, None]
        return h + x.sum().item() + x.sum().item()
'''


def test_each_line_is_left_for_a_person_once_with_every_reason(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "model.py").write_text(TWICE_LEFT)
    findings = scan_source(TWICE_LEFT, "model.py")
    state = RunState(session_id="leftovers", options=RunOptions(target=str(target), run_dir=str(tmp_path / "run")),
                     sources=["model.py"], findings=findings,
                     baseline=Baseline(entry_class="Model", max_seq_len=32,
                                       headline="not probed: this test is about the items left", steps=8))
    # What is left before merging: the findings no codemod fixes and the codemods' own items.
    adaptation = adapt_source(TWICE_LEFT, "model.py", None, Options(entry_class="Model", max_seq_len=32))
    left = [(f.line, f.code, f.message) for f in findings if fixed_by(f, adaptation.edits) is None]
    left += [(m.line, m.codemod, m.reason) for m in adaptation.manual]
    assert len({line for line, _, _ in left}) < len(left), "the source must leave some line twice"

    designed = nodes.design(state)
    manual = designed["manual"]
    assert sorted(m["line"] for m in manual) == sorted({line for line, _, _ in left})
    for line, code, text in left:
        item = next(m for m in manual if m["line"] == line)
        reasons = [(r.get("code") or r.get("codemod"), r.get("message") or r.get("reason")) for r in item["reasons"]]
        assert (code, text) in reasons and len(reasons) == len(set(reasons))
    assert any({r["kind"] for r in m["reasons"]} == {"finding", "codemod"} for m in manual)

    section = Path(designed["design_path"]).read_text().split("## Left for a person")[1].split("\n## ")[0]
    for m in manual:
        assert section.count(f"`model.py:{m['line']}`") == 1
    assert all(text in section for _, _, text in left)

    # The report of a run that could not verify lists the same items, once each, with every code.
    state = RunState.model_validate({**state.model_dump(), **designed, "approved": [],
                                     "verification": Verification(ran=False, problems=["x"])})
    reported = nodes.report(state)
    detail = json.loads((tmp_path / "run" / "report.json").read_text())["manual_items_detail"]
    assert [(d["line"], d["codes"]) for d in detail] == [
        (m["line"], [r.get("code") or r.get("codemod") for r in m["reasons"]]) for m in manual]
    text = Path(reported["report_path"]).read_text()
    assert all(text.count(f"`model.py:{m['line']}`") == 1 for m in manual)
    assert all(message in text for _, _, message in left)


def test_the_first_item_on_decodes_path_is_named_with_its_words():
    from graphmode.agent.workflow.report.write import first_on_decode

    def item(line, decode_runs, *reasons):
        return {"path": "m.py", "line": line, "decode_runs": decode_runs, "reasons": list(reasons)}

    off = {"kind": "finding", "code": "GM201", "message": "a tensor built per step", "trace": "not-run"}
    cache = {"kind": "finding", "code": "GM303", "message": "the KV cache is an object", "trace": "seen"}
    note = {"kind": "codemod", "codemod": "split_decode", "reason": "no entries"}
    # Not run (no entries): the unmodified Decode's trace says which finding it ran.
    assert first_on_decode([item(3, None, off), item(7, None, note, cache), item(9, None, note)]) == {
        "at": "m.py:7", "code": "GM303", "reason": "the KV cache is an object"}
    # Run: the adapted Decode's own trace decides, and an item it does not run is never named.
    assert first_on_decode([item(7, False, cache), item(9, True, note)]) == {
        "at": "m.py:9", "code": "split_decode", "reason": "no entries"}
    assert first_on_decode([item(3, None, off)]) is None


COUNTED_FIXTURE = Path(__file__).parent / "fixtures" / "codemods" / "cache_object" / "counted_positions.in.py"
COUNTED = COUNTED_FIXTURE.read_text() + '''

class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.decoder = Decoder(config)

    def forward(self, input_ids=None, cache=None, attention_mask=None, use_cache=None):
        return self.decoder(input_ids, cache=cache, attention_mask=attention_mask)
'''


def test_a_run_without_entries_names_why_its_cache_was_not_made_static(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "model.py").write_text(COUNTED)
    state = RunState(session_id="no-entries", options=RunOptions(target=str(target), run_dir=str(tmp_path / "run")),
                     sources=["model.py"], findings=scan_source(COUNTED, "model.py"),
                     baseline=Baseline(entry_class="Model", max_seq_len=32,
                                       headline="not probed: this test is about the verdict", steps=8))
    designed = nodes.design(state)
    state = RunState.model_validate({**state.model_dump(), **designed, "approved": [], "applied": []})
    why = nodes._why_no_entries(state)
    # The cause (positions counted from the cache's length, with its line) comes before the consequence (no
    # entries), and the item that only points at another is left out.
    counted_line = next(number for number, line in enumerate(COUNTED.splitlines(), 1)
                        if line.strip().startswith("cache_length = "))
    assert why.startswith("`Model` has no prefill or decode entry points, as the design says: `create_causal_mask`")
    assert f"counts positions from the cache's length (`cache.get_seq_length()`, line {counted_line})" in why
    assert why.index("counts positions") < why.index("write `prefill`/`decode` by hand")
    assert "another part of it" not in why
    # The design leads with the same list, in order, before a person approves anything.
    summary = Path(designed["design_path"]).read_text().split("## Summary")[1].split("\n## ")[0]
    assert "**No prefill or decode entry points can be added**" in summary
    assert summary.index("1. `create_causal_mask` builds the mask") < summary.index("2. ")


def test_where_no_codemod_recognised_the_cache_the_traced_cache_lines_name_it():
    from graphmode.agent.workflow.state import ManualItem

    def item(line, **reason):
        return ManualItem(kind=reason.get("kind", "finding"), path="m.py", line=line, reasons=[reason])

    written = "`setitem` writes at Python-int bounds that change every Decode step"
    state = RunState(session_id="phi-2-like", options=RunOptions(target="t", run_dir="r"),
                     baseline=Baseline(entry_class="Model", headline="not probed: this test is about the verdict"),
                     applied=[], manual=[
                         item(304, kind="finding", code="GM302", message="a slice bounded by `seqlen_offset`",
                              source="static"),
                         item(542, kind="finding", code="GM302", message=written, source="trace"),
                         item(543, kind="finding", code="GM302", message=written, source="trace"),
                         item(90, kind="codemod", codemod="split_decode", reason="none are added")])
    assert nodes._why_no_entries(state) == ("`Model` has no prefill or decode entry points, as the design says: "
                                            f"{written} (m.py:542, m.py:543); none are added (m.py:90)")
    # A run whose entries were added says nothing.
    assert nodes._why_no_entries(state.model_copy(update={"applied": ["split_decode"]})) is None
