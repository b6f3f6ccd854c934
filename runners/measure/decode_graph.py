"""What one Decode step does, counted on the FX graph(s) Dynamo captures of it: ops, ops per layer, bytes moved.

The capture compiles the step afresh with a recording backend (it keeps each GraphModule and runs its own forward,
eagerly) and fullgraph=False, so a step with graph breaks is the sum of its fragments. It counts graph *runs*, not
graphs: Dynamo compiles a fragment inside a layer once and runs the same code for every layer (the parameters are
graph inputs), so one compiled fragment may stand for 32 runs.

What counts as an op, in one place (`op_role`): a call_function/call_method/call_module node that writes a new
tensor. Views and metadata reads write nothing (VIEW_OPS, METADATA_OPS); neither does plumbing over Python values
(a getitem on a tuple). Some ops write a new tensor only sometimes (MAYBE_COPY_OPS): `reshape` of a tensor that
cannot be viewed, `contiguous` of a non-contiguous one, a conversion (`float`, `to`, `type_as`) that changes the
dtype or device, a getitem with a tensor index (a gather). Those are ops exactly when their example value (the fake
tensor Dynamo propagated) does not alias their input: `x.float()` of a float32 `x` is `x` itself, launches nothing
in eager, and is not counted.

Bytes, "one op = one kernel": every op reads each tensor input whole and writes its output whole, as eager runs it.
That is the accounting fusion changes: an op folded into its neighbour no longer writes its result for the next op
to read back. Inductor fuses within a kernel on its own, which this does not model (its kernel count is reported
beside it). Each read is filed under what it reads:
- weights: a parameter, or a buffer the step does not write (a rotary table, a mask);
- state: a tensor from outside the step that it writes in place (a static KV cache) or that is neither a
  parameter nor a buffer (a KV cache passed in a tuple, the token ids, the positions);
- intermediates: a tensor the step itself made, in this fragment or an earlier one (an activation that crosses a
  graph break is written and read back all the same).
Writes go to intermediates, except an in-place op's (`index_copy_`, `setitem`, `copy_`), which goes to what it
writes into; a scatter-like in-place op (SCATTER_OPS) writes only the values it copies in (one position's K and V in
Decode), not the whole destination, and does not read the destination.

Layers: a node's module is the deepest entry of its `meta["nn_module_stack"]` (Dynamo keys it by the module's id(),
which names it in the model). The repeated layer is the numbered child (`layers.0`, `h.1`) of the container with the
most numbers. A node with no module entry sits in the frame's own forward: it takes the layer whose parameters that
run reads, when they are all of one layer; a run that reads no parameters at all (a fragment between two graph
breaks) takes the layer of the runs on both sides of it when they agree. Anything else is outside the layers.
Without the model (`count_graphs` on bare GraphModules) the module paths are read from the stack's strings; with no
nn_module_stack anywhere the per-layer figures are None rather than a guess.
"""
from __future__ import annotations

import operator
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.fx

# Ops that only describe other memory: they write nothing and launch nothing.
VIEW_OPS = frozenset({
    "view", "view_as", "transpose", "t", "permute", "unsqueeze", "squeeze", "expand", "expand_as", "narrow",
    "select", "unbind", "split", "chunk", "tensor_split", "unflatten", "movedim", "swapaxes", "swapdims", "as_strided",
    "diagonal", "detach", "alias", "real", "imag", "view_as_real", "view_as_complex", "unfold",
})
# Reads of shapes and other metadata, and Python plumbing around tensors.
METADATA_OPS = frozenset({
    "size", "dim", "stride", "numel", "shape", "is_contiguous", "element_size", "get_device", "data_ptr",
    "storage_offset", "is_floating_point", "getattr", "len", "_assert", "_assert_async",
})
# Ops that write a new tensor only when their output does not alias their input (see the module's docstring).
MAYBE_COPY_OPS = frozenset({
    "reshape", "flatten", "contiguous", "getitem", "to", "type", "type_as", "float", "half", "bfloat16",
    "double", "int", "long", "bool", "cpu", "cuda",
})
# In-place ops that write only the values they copy in, not their whole destination.
SCATTER_OPS = frozenset({"setitem", "index_copy_", "index_put_", "copy_", "scatter_", "masked_scatter_", "index_add_"})
# operator's augmented assignments are in place on a tensor.
IN_PLACE_OPERATORS = frozenset({"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior"})

WEIGHTS, STATE, INTERMEDIATES = "weights", "state", "intermediates"


def op_name(node: torch.fx.Node, graph: torch.fx.GraphModule | None = None) -> str:
    """A short name for what the node calls: `linear`, `mul`, `index_copy_`, a module's class name."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_module":
        module = graph.get_submodule(node.target) if graph is not None else None
        return type(module).__name__ if module is not None else str(node.target)
    target = node.target
    if target in (operator.getitem, operator.setitem):
        return target.__name__
    return getattr(target, "__name__", str(target)).removeprefix("_")


def _value(node: Any) -> Any:
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None


def _aliases(output: Any, source: Any) -> bool:
    if not isinstance(output, torch.Tensor) or not isinstance(source, torch.Tensor):
        return False
    if output is source:
        return True
    return output._base is not None and output._base is (source._base if source._base is not None else source)


def _is_in_place(name: str, node: torch.fx.Node) -> bool:
    if name in IN_PLACE_OPERATORS or name == "setitem":
        return True
    return node.op == "call_method" and name.endswith("_") and not name.startswith("_")


def op_role(node: torch.fx.Node, graph: torch.fx.GraphModule | None = None) -> str:
    """ "op" (writes a tensor), "view" (passes its first input's memory on) or "none" (no tensor memory at all)."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return "none"
    name = op_name(node, graph)
    if name in METADATA_OPS:
        return "none"
    if name in VIEW_OPS:
        return "view"
    if name in MAYBE_COPY_OPS:
        return _maybe_copy_role(node)
    if node.op != "call_module" and not _is_in_place(name, node) and not _holds_tensor(_value(node)):
        return "none"  # arithmetic on Python numbers or sizes
    return "op"


def _maybe_copy_role(node: torch.fx.Node) -> str:
    """A reshape, getitem or cast is a view when its output shares its input's memory, and a copy otherwise."""
    first = _value(node.args[0]) if node.args else None
    if not isinstance(first, torch.Tensor):  # a getitem on a tuple, a size, a list
        return "none"
    return "view" if _aliases(_value(node), first) else "op"


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(isinstance(item, torch.Tensor) for item in value)


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(item) for item in value)
    return 0


# --- layers -----------------------------------------------------------------------------------------------------

_PATH_PART = re.compile(r"\.(\w+)|\[['\"]?([^\]'\"]+)['\"]?\]")
_PATH_NOISE = {"_modules", "_parameters", "_buffers"}


def module_path_parts(path: str) -> tuple[str, ...]:
    """`L['self'].layers[0].mlp` or `L['self']._modules['layers']._modules['0']` -> ("layers", "0", "mlp"): the
    frame's own base (`L['self']`, `G['model']`) dropped."""
    base = re.match(r"^[LG]\[['\"][^'\"]*['\"]\]", path)
    rest = path[base.end():] if base else path
    if not base:
        rest = "." + rest
    parts = [a or b for a, b in _PATH_PART.findall(rest)]
    return tuple(part for part in parts if part not in _PATH_NOISE)


def layer_of(parts: Iterable[str]) -> tuple[str, int] | None:
    """The outermost numbered child in a module path: ("layers", 3) for layers.3.mlp.up; None outside any."""
    parts = list(parts)
    for index, part in enumerate(parts):
        if part.isdigit() and index > 0:
            return ".".join(parts[:index]), int(part)
    return None


# --- counting -----------------------------------------------------------------------------------------------------

@dataclass
class Traffic:
    weights: int = 0
    state: int = 0
    intermediates: int = 0

    def add(self, category: str, nbytes: int) -> None:
        setattr(self, category, getattr(self, category) + nbytes)

    @property
    def total(self) -> int:
        return self.weights + self.state + self.intermediates


@dataclass
class _Op:
    name: str
    node: torch.fx.Node
    module: str | None      # key of the deepest nn_module_stack entry, None without one
    module_path: str | None  # that entry's path string
    reads: list[tuple[torch.fx.Node, int]]
    writes: int
    into: torch.fx.Node | None  # the tensor an in-place op writes into (through views: its root)


@dataclass
class _Graph:
    module: torch.fx.GraphModule
    placeholders: list[torch.fx.Node]
    ops: list[_Op]
    roots: dict[torch.fx.Node, torch.fx.Node]  # a view -> the node whose memory it shows


def _analyse(graph: torch.fx.GraphModule) -> _Graph:
    roots: dict[torch.fx.Node, torch.fx.Node] = {}
    ops: list[_Op] = []
    placeholders = [node for node in graph.graph.nodes if node.op == "placeholder"]
    for node in graph.graph.nodes:
        role = op_role(node, graph)
        first = _node_arg(node)
        if role == "view" and first is not None:
            roots[node] = roots.get(first, first)
        if role != "op":
            continue
        op = _make_op(graph, node, roots)
        ops.append(op)
        if op.into is not None:
            roots[node] = op.into
    return _Graph(graph, placeholders, ops, roots)


def _node_arg(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node's first argument when that is a node: the tensor a view shows or an in-place op writes into."""
    return node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None


def _make_op(graph: torch.fx.GraphModule, node: torch.fx.Node, roots: dict[torch.fx.Node, torch.fx.Node]) -> _Op:
    """One tensor-writing node: its module, the bytes it reads (a module call: its weights too) and writes."""
    name = op_name(node, graph)
    stack = node.meta.get("nn_module_stack") or {}
    key, (path, _) = next(reversed(stack.items())) if stack else (None, (None, None))
    first = _node_arg(node)
    into = roots.get(first, first) if first is not None and _is_in_place(name, node) else None
    if into is not None and name in SCATTER_OPS:
        reads, writes = _scatter_traffic(node, first)
    else:
        reads = [(arg, _nbytes(_value(arg))) for arg in _tensor_inputs(node)]
        writes = _nbytes(_value(node))
    if node.op == "call_module":
        weights = graph.get_submodule(node.target)
        reads += [(node, sum(p.numel() * p.element_size() for p in weights.parameters()))]
    return _Op(name, node, key, path, reads, writes, into)


def _tensor_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    return [arg for arg in node.all_input_nodes if isinstance(_value(arg), torch.Tensor)]


def _scatter_traffic(node: torch.fx.Node, destination: torch.fx.Node) -> tuple[list[tuple[torch.fx.Node, int]], int]:
    """A scatter writes and reads the values it copies in; index tensors are read too, the destination is not."""
    sources = [arg for arg in _tensor_inputs(node) if arg is not destination]
    reads = [(arg, _nbytes(_value(arg))) for arg in sources]
    values = [arg for arg in sources if _value(arg).is_floating_point() or _value(arg).is_complex()]
    writes = sum(_nbytes(_value(arg)) for arg in values) if values else sum(n for _, n in reads)
    return reads, writes


@dataclass
class DecodeCount:
    """What one Decode step did, counted on its captured graph(s); `to_dict` is the worker's `decode_graph`."""
    ops: int = 0
    op_kinds: Counter = field(default_factory=Counter)
    graphs: int = 0
    runs: int = 0
    layer_ops: dict[int, int] = field(default_factory=dict)
    layer_traffic: dict[int, Traffic] = field(default_factory=dict)
    ops_outside_layers: int = 0
    traffic: Traffic = field(default_factory=Traffic)
    placed: bool = False  # whether layers could be told at all (some node had an nn_module_stack)

    @property
    def layers(self) -> int | None:
        return len(self.layer_ops) if self.placed and self.layer_ops else None

    @property
    def ops_per_layer(self) -> float | None:
        return float(statistics.median(self.layer_ops.values())) if self.layers else None

    def bytes_per_layer(self) -> dict[str, Any] | None:
        if not self.layers:
            return None

        def median(category: str) -> int:
            return int(statistics.median(getattr(t, category) for t in self.layer_traffic.values()))

        per_layer = {"weights_read": median(WEIGHTS), "state": median(STATE),
                     "intermediates": median(INTERMEDIATES)}
        per_layer["total"] = sum(per_layer.values())
        per_layer["times_layers"] = {key: value * self.layers for key, value in per_layer.items()}
        return per_layer

    def to_dict(self) -> dict[str, Any]:
        return {"ops": self.ops, "ops_per_layer": self.ops_per_layer, "layers": self.layers,
                "ops_outside_layers": self.ops_outside_layers if self.layers else self.ops,
                "op_kinds": dict(self.op_kinds.most_common()), "bytes_per_layer": self.bytes_per_layer(),
                "bytes_per_step": self.traffic.total,
                "bytes_per_step_by_kind": {WEIGHTS: self.traffic.weights, STATE: self.traffic.state,
                                           INTERMEDIATES: self.traffic.intermediates},
                "graphs": self.graphs, "graph_runs": self.runs}


class _Names:
    """The model's parameters, buffers (by storage) and modules (by id()), named by their dotted path."""

    def __init__(self, model: torch.nn.Module | None):
        self.parameters: dict[int, str] = {}
        self.buffers: dict[int, str] = {}
        self.modules: dict[str, str] = {}
        if model is None:
            return
        for name, parameter in model.named_parameters(remove_duplicate=False):
            self.parameters.setdefault(storage_of(parameter), name)
        for name, buffer in model.named_buffers(remove_duplicate=False):
            self.buffers.setdefault(storage_of(buffer), name)
        self.modules = {str(id(module)): name for name, module in model.named_modules(remove_duplicate=False)}

    def tensor(self, tensor: torch.Tensor) -> str | None:
        """The parameter's or buffer's dotted name, None for a tensor that is neither."""
        storage = storage_of(tensor)
        return self.parameters.get(storage) or self.buffers.get(storage)


def count_graphs(graphs: list[torch.fx.GraphModule], runs: list[tuple[int, list[Any]]] | None = None,
                 model: torch.nn.Module | None = None, outputs: list[Any] | None = None) -> DecodeCount:
    """Count captured graphs. `runs`: (graph index, the real arguments) per run of a graph in the step, in order
    (each graph once without them); `outputs`: what each run returned, so a later fragment's input can be told
    to be this step's own result; `model`: names parameters, buffers and modules."""
    analysed = [_analyse(graph) for graph in graphs]
    runs = runs if runs is not None else [(index, []) for index in range(len(graphs))]
    names = _Names(model)
    made_here = _storages_returned(outputs or [])
    written = _written_storages(analysed, runs)
    count = DecodeCount(graphs=len(graphs), runs=len(runs))
    placed_runs: list[list[_Placed]] = []
    run_layers: list[tuple[str, int] | None | str] = []
    first_runs: dict[int, list[Any]] = {}
    for index, args in runs:
        graph = analysed[index]
        categories = _input_categories(graph, args, names, made_here, written)
        # Dynamo compiled the graph for its first run: its module stack names that run's layers, and a later run of
        # the same graph (the next layer's) reads the parameters of another. Map one to the other through them.
        moved = _layers_moved(graph, first_runs.setdefault(index, args), args, names)
        placed_runs.append(_place_ops(graph, categories, moved, names))
        count.op_kinds.update(op.name for op in graph.ops)
        count.placed = count.placed or any(op.module is not None for op in graph.ops)
        run_layers.append(_run_layer(graph, args, names))
    _settle_runs_between(run_layers)
    _add_runs(count, placed_runs, run_layers)
    return count


# An op of one run: the op, the layer it belongs to (None outside any), the bytes it moves by category.
_Placed = tuple[_Op, tuple[str, int] | None, dict[str, int]]


def _storages_returned(outputs: list[Any]) -> set[int]:
    """The storages of what the step's runs returned: an input found there is this step's own result."""
    return {storage_of(t) for out in outputs for t in _tensors(out)}


def _input_categories(graph: _Graph, args: list[Any], names: _Names, made_here: set[int],
                      written: set[int]) -> dict[torch.fx.Node, str]:
    """What each of the graph's inputs is in this run (weights, state or intermediates), from its real argument."""
    return {node: _input_category(node, args[i] if i < len(args) else None, names, made_here, written)
            for i, node in enumerate(graph.placeholders)}


def _place_ops(graph: _Graph, categories: dict[torch.fx.Node, str], moved: dict[Any, Any],
               names: _Names) -> list[_Placed]:
    """Each op of one run with the layer it ran for (through `moved`: this run's layer, not the first run's)."""
    placed = []
    for op in graph.ops:
        layer = _op_layer(op, names)
        placed.append((op, moved.get(layer, layer), _op_traffic(graph, op, categories)))
    return placed


def _op_traffic(graph: _Graph, op: _Op, categories: dict[torch.fx.Node, str]) -> dict[str, int]:
    """The bytes one op reads and writes, by category: its inputs' categories, and the tensor it writes into."""
    traffic: dict[str, int] = Counter()
    for source, nbytes in op.reads:
        root = graph.roots.get(source, source)
        category = WEIGHTS if source is op.node else categories.get(root, INTERMEDIATES)
        traffic[category] += nbytes
    target = categories.get(op.into, INTERMEDIATES) if op.into is not None else INTERMEDIATES
    traffic[STATE if target == WEIGHTS else target] += op.writes  # a written buffer is state
    return traffic


def _main_container(placed_runs: list[list[_Placed]], run_layers: list[Any]) -> str | None:
    """The module list most layered ops and runs belong to (`layers` of model.layers.3): the model's layers."""
    container = Counter(layer[0] for placed in placed_runs for _, layer, _ in placed if layer)
    container.update(layer[0] for layer in run_layers if isinstance(layer, tuple))
    return container.most_common(1)[0][0] if container else None


def _add_runs(count: DecodeCount, placed_runs: list[list[_Placed]], run_layers: list[Any]) -> None:
    """Count every op of every run; an op no module stack places belongs to its run's layer."""
    main = _main_container(placed_runs, run_layers)
    for placed, own_layer in zip(placed_runs, run_layers):
        for op, layer, traffic in placed:
            _add_op(count, traffic, layer if layer is not None or op.module is not None else own_layer, main)


def _add_op(count: DecodeCount, traffic: dict[str, int], layer: Any, main: str | None) -> None:
    """Count one op into the step's totals, and into its layer's when it is in one of the main container's."""
    count.ops += 1
    for category, nbytes in traffic.items():
        count.traffic.add(category, nbytes)
    if not (isinstance(layer, tuple) and layer[0] == main):
        count.ops_outside_layers += 1
        return
    count.layer_ops[layer[1]] = count.layer_ops.get(layer[1], 0) + 1
    layer_traffic = count.layer_traffic.setdefault(layer[1], Traffic())
    for category, nbytes in traffic.items():
        layer_traffic.add(category, nbytes)


def storage_of(tensor: torch.Tensor) -> int:
    """Where a tensor's memory starts: a view and its base share it."""
    return tensor.untyped_storage().data_ptr()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _written_storages(analysed: list[_Graph], runs: list[tuple[int, list[Any]]]) -> set[int]:
    """Storages of the inputs some run writes in place: a buffer written in the step is state, not weights."""
    written: set[int] = set()
    for index, args in runs:
        graph = analysed[index]
        for op in graph.ops:
            if op.into in graph.placeholders:
                position = graph.placeholders.index(op.into)
                if position < len(args) and isinstance(args[position], torch.Tensor):
                    written.add(storage_of(args[position]))
    return written


def _input_category(node: torch.fx.Node, arg: Any, names: _Names, made_here: set[int], written: set[int]) -> str:
    if isinstance(arg, torch.Tensor):
        pointer = storage_of(arg)
        if pointer in written:
            return STATE
        if pointer in names.parameters or pointer in names.buffers or isinstance(arg, torch.nn.Parameter):
            return WEIGHTS
        return INTERMEDIATES if pointer in made_here else STATE
    # Bare graphs: Dynamo names a lifted parameter or buffer placeholder after its source.
    name = str(node.target)
    if "_parameters_" in name or "_buffers_" in name:
        return WEIGHTS
    return STATE


def _op_layer(op: _Op, names: _Names) -> tuple[str, int] | None:
    if op.module is None:
        return None
    name = names.modules.get(op.module)
    parts = tuple(name.split(".")) if name else module_path_parts(op.module_path or "")
    return layer_of(parts)


def _run_layer(graph: _Graph, args: list[Any], names: _Names) -> tuple[str, int] | None | str:
    """The layer of all the parameters and buffers a run reads; "none read" when it reads none."""
    layers = set()
    for node, arg in zip(graph.placeholders, args):
        if isinstance(arg, torch.Tensor):
            name = names.tensor(arg)
            if name is not None:
                layers.add(layer_of(name.split(".")))
    if not layers:
        return "none read"
    return layers.pop() if len(layers) == 1 else None


def _layers_moved(graph: _Graph, first_run: list[Any], run: list[Any], names: _Names) -> dict[Any, Any]:
    """Layer in the graph's first run -> layer in this run, paired through the parameters each read."""
    moved = {}
    for then, now in zip(first_run, run):
        if isinstance(then, torch.Tensor) and isinstance(now, torch.Tensor):
            then_name, now_name = names.tensor(then), names.tensor(now)
            if then_name is not None and now_name is not None:
                moved[layer_of(then_name.split("."))] = layer_of(now_name.split("."))
    return moved


def _settle_runs_between(run_layers: list[Any]) -> None:
    """A run that reads no parameters takes the layer of the runs on both sides of it, when they agree."""
    for index, layer in enumerate(run_layers):
        if layer != "none read":
            continue
        before = next((x for x in reversed(run_layers[:index]) if x != "none read"), None)
        after = next((x for x in run_layers[index + 1:] if x != "none read"), None)
        run_layers[index] = before if before == after and isinstance(before, tuple) else None


# --- capture ------------------------------------------------------------------------------------------------------

class _Recorder:
    """A Dynamo backend that keeps each graph and runs its forward eagerly, noting every run."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.runs: list[tuple[int, list[Any]]] = []
        self.outputs: list[Any] = []

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        index = len(self.graphs)
        self.graphs.append(graph)

        def run(*args: Any) -> Any:
            # The arguments and results stay referenced until the count: no storage is freed and reused meanwhile,
            # so a storage names one tensor for the whole step.
            self.runs.append((index, list(args)))
            out = graph.forward(*args)
            self.outputs.append(out)
            return out
        return run


def capture_decode(step: Callable[..., Any], args: tuple[Any, ...], model: torch.nn.Module | None = None
                   ) -> DecodeCount:
    """Run `step(*args)` once under a recording backend on a fresh Dynamo state and count what it did.

    It resets Dynamo before and after: the capture must neither reuse nor leave compiled code, so call it after
    the timed steps (whose compiled code it discards). The step really runs (eagerly, through the graphs' own
    forwards): give it arguments whose effects do not matter any more (the last step again). The recompile
    limits are lifted for the capture, so a fragment recompiled per layer is still captured, not run uncounted.
    """
    recorder = _Recorder()
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(recompile_limit=100_000, accumulated_recompile_limit=100_000):
            compiled = torch.compile(step, backend=recorder, fullgraph=False, dynamic=False)
            compiled(*args)
        return count_graphs(recorder.graphs, recorder.runs, model, recorder.outputs)
    finally:
        torch._dynamo.reset()


def inductor_kernels_before() -> None:
    """Zero Inductor's kernel counter before the compile whose kernels are to be counted."""
    from torch._inductor import metrics

    metrics.reset()


def inductor_kernels_after() -> int | None:
    """Kernels Inductor generated since `inductor_kernels_before`; None when it generated none, which is what an
    FX graph cache hit looks like (the kernels were compiled in an earlier process, not counted here)."""
    from torch._inductor import metrics

    return metrics.generated_kernel_count or None
