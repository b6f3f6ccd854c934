"""runners/measure/decode_graph.py on real tiny models: what one Decode step does, counted on its captured graph(s).

No expected number is written down: each check compares two real captures (a hand-written RMSNorm against
F.rms_norm, a step with graph breaks against the same step without) or checks a property of one."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graphmode.runners.measure.decode_graph import capture_decode, count_graphs, layer_of, module_path_parts
from graphmode.runners.subprocess_run import run_worker

PROJECT_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = PROJECT_ROOT / "examples" / "legacy_llm"
HAND_ADAPTED_MODEL = Path(__file__).parent / "fixtures" / "adapted_tiny" / "model.py"


class Norm(nn.Module):
    def __init__(self, dim: int, fused: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.fused = fused

    def forward(self, x):
        if self.fused:
            return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-5)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class Block(nn.Module):
    def __init__(self, dim: int, fused: bool, breaks: bool):
        super().__init__()
        self.norm = Norm(dim, fused)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)
        self.breaks = breaks

    def forward(self, x):
        h = self.up(self.norm(x))
        if self.breaks:
            torch._dynamo.graph_break()
        return x + self.down(F.silu(h))


class Tiny(nn.Module):
    def __init__(self, fused: bool = False, breaks: bool = False, dim: int = 16, layers: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(dim, fused, breaks) for _ in range(layers))
        self.head = nn.Linear(dim, 8, bias=False)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _count(model: nn.Module):
    with torch.inference_mode():
        return capture_decode(model, (torch.randn(1, 1, 16),), model)


def test_fused_rms_norm_has_fewer_ops_and_intermediates_and_the_same_weights():
    hand, fused = _count(Tiny(fused=False)).to_dict(), _count(Tiny(fused=True)).to_dict()
    assert hand["layers"] == fused["layers"] == 2
    assert fused["ops"] < hand["ops"] and fused["ops_per_layer"] < hand["ops_per_layer"]
    assert fused["op_kinds"].get("rms_norm") == 2 and "rsqrt" not in fused["op_kinds"]
    assert fused["bytes_per_layer"]["intermediates"] < hand["bytes_per_layer"]["intermediates"]
    assert fused["bytes_per_layer"]["weights_read"] == hand["bytes_per_layer"]["weights_read"]
    # The parameters read are the layer's own, each once: the measured weights are their sizes.
    layer = Tiny().layers[0]
    assert hand["bytes_per_layer"]["weights_read"] == sum(p.numel() * p.element_size() for p in layer.parameters())
    assert hand["bytes_per_layer"]["times_layers"]["total"] == 2 * hand["bytes_per_layer"]["total"]
    assert hand["ops"] == 2 * hand["ops_per_layer"] + hand["ops_outside_layers"]


def test_graph_breaks_are_summed_over_every_run_of_each_fragment():
    whole, broken = _count(Tiny()), _count(Tiny(breaks=True))
    assert whole.graphs == whole.runs == 1
    # A fragment compiled for layer 0 runs again for layer 1: runs, not graphs, are counted.
    assert broken.runs > broken.graphs > 1
    assert (broken.ops_per_layer, broken.layers) == (whole.ops_per_layer, whole.layers)
    assert broken.layer_ops == whole.layer_ops
    # A break inside the loop makes Dynamo skip the loop's own frame: its own op (the head) runs in no graph.
    assert broken.ops_outside_layers < whole.ops_outside_layers
    # What crosses a break is written and read back like any intermediate: the bytes are the same.
    assert broken.bytes_per_layer() == whole.bytes_per_layer()


def test_bare_graphs_without_module_stacks_have_no_per_layer_figures():
    graphs = []

    def record(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    model = Tiny()
    with torch.inference_mode():
        torch._dynamo.reset()
        torch.compile(model, backend=record, dynamic=False)(torch.randn(1, 1, 16))
        torch._dynamo.reset()
    with_stacks = count_graphs(graphs).to_dict()
    assert with_stacks["layers"] == 2  # read off the stacks' path strings, no model given
    for node in graphs[0].graph.nodes:
        node.meta.pop("nn_module_stack", None)
    bare = count_graphs(graphs).to_dict()
    assert bare["ops"] == with_stacks["ops"] and bare["bytes_per_step"] == with_stacks["bytes_per_step"]
    assert bare["layers"] is None and bare["ops_per_layer"] is None and bare["bytes_per_layer"] is None
    assert bare["ops_outside_layers"] == bare["ops"]


def test_views_and_no_op_conversions_are_not_ops():
    def step(x):
        y = x.float().view(4, 4).transpose(0, 1).reshape(16)  # float32 already; reshape of a transpose copies
        return y.contiguous() + 1

    with torch.inference_mode():
        count = capture_decode(step, (torch.randn(16),))
    assert count.op_kinds == {"reshape": 1, "add": 1}


@pytest.mark.parametrize("path, parts, layer", [
    ("L['self'].layers[3].mlp", ("layers", "3", "mlp"), ("layers", 3)),
    ("L['self']._modules['model']._modules['layers']._modules['0']", ("model", "layers", "0"), ("model.layers", 0)),
    ("G['model'].h.1.attn", ("h", "1", "attn"), ("h", 1)),
    ("L['self'].norm", ("norm",), None),
])
def test_module_paths_name_their_layer(path, parts, layer):
    assert module_path_parts(path) == parts and layer_of(parts) == layer


@pytest.mark.slow
@pytest.mark.parametrize("side", ["original", "adapted"])
def test_worker_counts_the_decode_step_on_both_sides(tmp_path, side):
    folder = EXAMPLE
    if side == "adapted":
        folder = tmp_path / "adapted"
        folder.mkdir()
        shutil.copy(HAND_ADAPTED_MODEL, folder / "model.py")
        shutil.copy(EXAMPLE / "harness.py", folder / "harness.py")
    out = tmp_path / "r.json"
    run_worker("graphmode.runners.workers.verify_worker",
               ["--side", side, "--folder", str(folder), "--steps", "2",
                "--backend", "aot_eager", "--out", str(out), "--count-ops"],
               name=side, timeout_s=180, log_dir=tmp_path / "logs")
    counted = json.loads(out.read_text())["decode_graph"]
    assert counted["layers"] == 2 and counted["ops"] > 2 * counted["ops_per_layer"] > 0
    assert counted["op_kinds"]["linear"] >= 2 * 7  # q, k, v, o, gate, up, down in every layer
    per_layer = counted["bytes_per_layer"]
    assert per_layer["weights_read"] > per_layer["intermediates"] > 0 and per_layer["state"] > 0
    assert counted["inductor_kernels"] is None  # aot_eager generates no kernels
    estimate = counted["config_traffic"]
    assert estimate["sizes"]["layers"] == 2 and estimate["fusions"] == []
    # The tiny model's projections are all it has for weights: the estimate and the graph agree on them.
    assert abs(estimate["weights"] - per_layer["weights_read"]) <= 0.05 * per_layer["weights_read"]
    if side == "adapted":
        assert counted["op_kinds"]["index_copy_"] == 2 * 2  # K and V into the static cache, in every layer


@pytest.mark.slow
def test_worker_without_count_ops_leaves_decode_graph_empty(tmp_path):
    out = tmp_path / "r.json"
    run_worker("graphmode.runners.workers.verify_worker",
               ["--side", "original", "--folder", str(EXAMPLE), "--steps", "1",
                "--backend", "aot_eager", "--out", str(out)],
               name="original", timeout_s=120, log_dir=tmp_path / "logs")
    assert json.loads(out.read_text())["decode_graph"] == {}
