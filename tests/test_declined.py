"""A failure on a line a declined change would have rewritten is named with that change in the report (issue 26):
the example adapted with its host-check hoist (hoist_item) declined keeps the `assert ....item()` in the static
path's `forward`, where Decode breaks its graph. The codemod chain runs for real; the verification that saw the
break is written by hand, at the adapted line the assert really is on."""
from __future__ import annotations

import json
from pathlib import Path

from test_fusion_report import _designed, _state

from graphmode.agent.targets.sources import read_source
from graphmode.agent.workflow import nodes
from graphmode.agent.workflow.repair.failures import declined_causes
from graphmode.agent.workflow.report.write import write_report

ASSERT = "assert tokens.max().item() < self.args.vocab_size"


def _declining_the_hoist(tmp_path: Path):
    state = _designed(tmp_path)
    hoist = next(c for c in state.plan if c.codemod == "hoist_item")
    state = state.model_copy(update={"approved": [c.id for c in state.plan if c.id != hoist.id]})
    state = state.model_copy(update=nodes.implement(state))
    adapted = (Path(state.adapted_dir) / "model.py").read_text().splitlines()
    # The last copy of the assert is the static path's (`forward_static`, after `forward`): the one Decode runs.
    adapted_line = max(i for i, text in enumerate(adapted, start=1) if ASSERT in text)
    original = read_source(Path(state.options.target), "model.py").splitlines()
    original_line = next(i for i, text in enumerate(original, start=1) if ASSERT in text)
    return state, hoist, adapted_line, original_line


def test_a_graph_break_on_a_line_the_declined_change_rewrites_names_that_change(tmp_path):
    state, hoist, adapted_line, original_line = _declining_the_hoist(tmp_path)
    broke = {"reason": "Data-dependent branching / .item()", "file": "model.py", "line": adapted_line,
             "function": "forward_static"}
    problem = f"1 graph break(s) in Decode at model.py:{adapted_line} (lines of the adapted sources)"
    finished = _state(tmp_path, {}, passed=False, graph_breaks=1, break_reasons=[broke], problems=[problem])
    finished = finished.model_copy(update={"plan": state.plan, "approved": state.approved,
                                           "adapted_dir": state.adapted_dir, "applied": state.applied})
    causes = declined_causes(finished)
    assert causes == [{"change": hoist.id, "codemod": "hoist_item", "title": hoist.title, "path": "model.py",
                       "line": original_line, "adapted_line": adapted_line, "what": "graph break"}]
    text = write_report(finished).read_text()
    assert f"**{hoist.id} (`hoist_item`), which you declined, rewrites `model.py:{original_line}`**" in text
    assert f"broke its graph (line {adapted_line} of the adapted file)" in text
    report = json.loads((Path(finished.options.run_dir) / "report.json").read_text())
    assert report["declined_causes"] == causes


def test_a_break_elsewhere_or_in_library_code_names_no_declined_change(tmp_path):
    state, _, adapted_line, _ = _declining_the_hoist(tmp_path)
    elsewhere = [{"reason": "r", "file": "model.py", "line": 1, "function": ""},  # the module docstring
                 {"reason": "r", "file": "/usr/lib/torch/functional.py", "line": adapted_line, "function": ""}]
    finished = _state(tmp_path, {}, passed=False, graph_breaks=2, break_reasons=elsewhere, problems=["breaks"])
    finished = finished.model_copy(update={"plan": state.plan, "approved": state.approved,
                                           "adapted_dir": state.adapted_dir})
    assert declined_causes(finished) == []
    assert "which you declined" not in write_report(finished).read_text()
