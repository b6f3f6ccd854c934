"""Each planned change's own part of the diff: what the person reads before approving that change alone."""
from __future__ import annotations

from pathlib import Path

from graphmode.agent.workflow.diffs import change_diffs
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


def test_the_design_keeps_each_changes_diff_on_disk_not_in_the_session(tmp_path: Path):
    """The checkpoint holds a path per change; the diff text is in changes/<id>.diff beside design.md, and it is the
    hunks the person is shown."""
    from graphmode.agent.workflow import nodes
    from graphmode.agent.workflow.state import Baseline, RunOptions, RunState

    example = Path(__file__).parents[1] / "examples" / "legacy_llm"
    state = RunState(session_id="diffs", options=RunOptions(target=str(example), run_dir=str(tmp_path / "run")),
                     sources=["model.py"], baseline=Baseline(entry_class="Transformer", max_seq_len=64))
    designed = RunState.model_validate({**state.model_dump(), **nodes.design(state)})
    with_lines = [c for c in designed.plan if c.diff_path]
    assert with_lines
    for change in with_lines:
        assert Path(change.diff_path) == tmp_path / "run" / "changes" / f"{change.id}.diff"
        assert change.diff().startswith("--- a/model.py") and "\n@@ " in change.diff()
    saved = designed.model_dump_json()
    assert "\n@@ " not in saved and "@@ -" not in saved
