"""Each planned change's own part of the diff: what the person reads before approving that change alone."""
from __future__ import annotations

from pathlib import Path

from graphmode.agent.diffs import change_diffs
from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

STATIC_READY = Path(__file__).parent / "fixtures" / "targets" / "static_ready" / "model.py"


def test_a_change_that_adds_methods_shows_them_and_not_its_neighbours_lines():
    """gpt-fast style: `hoist_item` guards an assert at the top of `forward`; `split_decode` adds the entry points
    after it. Each change's diff is its own hunk, the added `decode` under the change that adds it."""
    options = Options(entry_class="Transformer", entry_roles=(("idx", "tokens"), ("input_pos", "positions")))
    adaptation = adapt_source(STATIC_READY.read_text(), "model.py", None, options)
    assert {"hoist_item", "split_decode"} <= set(adaptation.applied)
    edits: dict[str, list[dict]] = {}
    for edit in adaptation.edits:
        edits.setdefault(edit.codemod, []).append({"path": "model.py", **edit.to_dict()})
    parts = change_diffs({"model.py": adaptation.static_diff()}, edits)
    assert "+    def decode(self" in parts["split_decode"] and "is_compiling" not in parts["split_decode"]
    assert "+        if not torch.compiler.is_compiling():" in parts["hoist_item"]
    assert "def decode" not in parts["hoist_item"]
