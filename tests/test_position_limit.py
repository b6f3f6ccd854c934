"""A branch on how far the positions reach (dynamic NTK rotary embeddings) settled by the static path's own limit:
the trace records the comparison (runners/evidence/model.py `PositionTest`), tensor_branches puts the limit in front of
it in the static twin, and the twin compiles whole and computes what the original does. Real torch, the tiny model
of tests/fixtures/evidence/ntk_rotary."""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
import torch

from adapted_files import import_adapted, write_adapted

from graphmode.agent.workflow.adaptation import position_tests
from graphmode.runners.evidence.collect import collect_evidence
from graphmode.runners.evidence.model import PositionTest, SourceLine
from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

FIXTURE = Path(__file__).parent / "fixtures" / "evidence" / "ntk_rotary"
TRAINED_LENGTH = 16  # the fixture model's default `trained_length`


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ntk") / "ntk_rotary"
    shutil.copytree(FIXTURE, folder)
    return folder, collect_evidence(folder, steps=3, timeout_s=300)


def branch_line() -> int:
    (line,) = [n for n, text in enumerate((FIXTURE / "model.py").read_text().splitlines(), 1)
               if "# EVIDENCE: ntk_branch" in text]
    return line


def adapted_module(folder: Path, evidence, tmp_path: Path):
    options = Options(entry_class="Model", traced=True, position_tests=position_tests(evidence))
    result = adapt_source((folder / "model.py").read_text(), "model.py", {"tensor_branches"}, options)
    path = tmp_path / "adapted_ntk.py"
    write_adapted(tmp_path, {path.name: result.adapted})
    return result, import_adapted(path, "adapted_ntk")


def on_static_path(model: torch.nn.Module, limit: int) -> None:
    """What `GraphmodeStaticPath` does for the entries (split_decode, not run here): one shared state, on."""
    state = {"on": True, "slots": None, "padding": None, "max_batch_size": 1, "max_seq_len": limit}
    for module in model.modules():
        module.graphmode_static_state = state


def test_the_trace_records_the_count_of_positions_against_the_bound(traced):
    _, evidence = traced
    entry = evidence.lines[SourceLine("model.py", branch_line())]
    assert entry.position_tests == [PositionTest("gt", 1, TRAINED_LENGTH)]
    assert [sync.kind for sync in entry.syncs] == ["branch"]
    assert position_tests(evidence) == (("model.py", branch_line(), "gt"),)


def test_the_twin_compiles_whole_and_keeps_the_meaning(traced, tmp_path):
    folder, evidence = traced
    result, module = adapted_module(folder, evidence, tmp_path)
    assert [edit.start_line for edit in result.edits] == [branch_line()]
    # As Python, not as text: the test may be wrapped to the file's own line limit.
    tests = [ast.unparse(node.test) for node in ast.walk(ast.parse(result.adapted)) if isinstance(node, ast.If)]
    assert "graphmode_position_limit(self) > self.trained_length and count > self.trained_length" in tests

    torch.manual_seed(0)
    model = module.Model().eval()
    tokens = torch.randint(0, 64, (1, 1))
    within = torch.tensor([[TRAINED_LENGTH - 1]])
    with torch.no_grad():
        expected = model(tokens, within)[0]  # the original body: the static state is not on yet
        on_static_path(model, limit=TRAINED_LENGTH)
        compiled = torch.compile(model, backend="eager", fullgraph=True)  # a graph break raises
        torch.testing.assert_close(compiled(tokens, within)[0], expected, rtol=0, atol=0)

        # A static path sized past the bound keeps the test on the device, and takes the branch where the
        # original does (the frequencies are rescaled for a position past the trained length).
        past = torch.tensor([[TRAINED_LENGTH + 3]])
        original, twin = module.Model().eval(), module.Model().eval()
        twin.load_state_dict(original.state_dict())
        on_static_path(twin, limit=2 * TRAINED_LENGTH)
        torch.testing.assert_close(twin(tokens, past)[0], original(tokens, past)[0], rtol=0, atol=0)
        assert not torch.equal(twin.rotary.inv_freq, module.Model().rotary.inv_freq)
