"""Gives a mixture-of-experts layer a dispatch whose shapes do not depend on the routing.

MoE code routes each token to its top-k experts, then runs a Python loop over the experts in which each expert
takes the tokens routed to it: picked by counts read on the host (DeepSeek's `tokens_per_expert.cpu().numpy()`,
slices of the sorted tokens), by `torch.where` of a one-hot mask (Mixtral, Qwen2-MoE), or by boolean indexing.
Each pick has a length only the device knows, so Decode waits for it and its graph breaks there. Here

    expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
    for expert_idx in range(self.num_experts):
        idx, top_x = torch.where(expert_mask[expert_idx])
        ...
        final_hidden_states.index_add_(0, top_x, current_hidden_states)

becomes

    if not torch.compiler.is_compiling():
        graphmode_stack_experts(self.experts)
        <the same statements>
    else:
        final_hidden_states = graphmode_moe(self.experts, hidden_states, selected_experts, routing_weights)

The routing (scores, top-k, normalisation) is left as written; only the dispatch after it is replaced. Eager calls
(Prefill) keep the loop and its cost, and stack the experts' weights into one [experts, ...] tensor per parameter
(the experts' parameters become views of it: no memory is added). The compiled Decode (helper-code `graphmode_moe`)
chooses by shapes alone, so the choice is fixed for a batch size:
- routed, when the step routes fewer (token, expert) pairs than there are experts (Decode of a few sequences):
  each token's top-k experts' weights are gathered from the stack by their ids and only those are read, as
  gpt-fast's Mixtral does. A dense dispatch would read every expert's weights each step: 4x at Mixtral's 2 of 8,
  32x at DeepSeek-V3's 8 of 256, where Decode's time is the weights it reads;
- dense otherwise (many tokens, few experts): every expert runs over every token and each token keeps its top-k
  outputs times their weights, reading each expert's weights once for all the tokens.
Either gives the loop's sum up to float rounding (the matmuls see other row counts), summed in expert order.

What is replaced is found from the code's structure, not from names:
- an expert loop: a `for` at the top of a step function's body whose body calls a module of one `self.<list>`;
- a pick of data-dependent size in the dispatch (`.cpu()`, `.numpy()`, `.tolist()`, `.item()`, `nonzero`, one-argument
  `torch.where`), or a statement the traced run saw read the device on the host;
- the routing: `weights, ids = torch.topk(...)` in the function, or else the parameters the dispatch uses as expert
  ids (`one_hot`, `scatter` index, `argsort`, `== expert`) and as factors (`*`, `mul`);
- the dispatch: the loop, the statements before it that work on the ids or allocate what it fills, and the ones
  after it up to the product with the routing weights (an assignment or a `return`); it must hand on one result and
  nothing else. The tokens are the one name it indexes that it does not set.
A loop that has such a pick but not the rest is left as it is, with the reason. So is a loop over experts whose
weights are one tensor sliced per expert (DBRX's `self.mlp.w1.view(...)[expert_idx]`, JetMoE's `self.weight[i]` on a
`split` of the tokens at sizes read on the host), with an item saying what to write; a class transformers dispatches
itself (`@use_experts_implementation`) is not reported. Loops under `if self.training` are training code and left
alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from graphmode.transforms.analysis.host_reads import COPY_METHODS, SYNC_METHODS
from graphmode.transforms.codemods.base import Edit, StepCodemod
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import GUARD
from graphmode.transforms.codemods.lib.module import defined_at_top, insert_after_imports
from graphmode.transforms.cstutil import calls_in, code_of, dotted_name, is_docstring, names_in, nodes_of_type, \
    short_code, single_assignment, walk

HELPER = "graphmode_moe"  # the static dispatch: routed experts only, or every expert (the two below)
STACKER = "graphmode_stack_experts"  # the experts' weights stacked, in eager calls, for the routed form
_DISPATCH_HELPERS = (HELPER, "graphmode_moe_dense", "graphmode_moe_routed", STACKER)
_COMMENT = (
    "# graphmode: static expert dispatch. The loop picks each expert's tokens in shapes only the device knows,",
    "# so it runs in eager calls (Prefill), which also stack the experts' weights; a compiled Decode reads",
    "# only its tokens' top-k experts (or runs every expert where that reads less), weighted as the loop weights.",
)
# Calls whose result has a size or a value read off the device: the host reads GM101/GM103 report
# (transforms.analysis.host_reads, here by name whatever the arguments), and calls sized by the values.
_HOST_READS = SYNC_METHODS | COPY_METHODS | frozenset({"nonzero", "argwhere", "masked_select"})
_IN_PLACE_COLLECTIONS = frozenset({"append", "extend", "insert"})
_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like",
                        "new_zeros", "new_ones", "new_empty", "new_full"})
_IDS_INDEXING = frozenset({"scatter", "scatter_", "scatter_add", "scatter_add_"})
_VIEWS = frozenset({"unsqueeze", "view", "reshape", "to", "type", "float", "squeeze", "expand"})


def _last_name(call: cst.Call) -> str:
    """`torch.nn.functional.one_hot(...)` -> "one_hot"; `x.view(-1).argsort()` -> "argsort"."""
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""


def _target_names(target: cst.BaseExpression) -> set[str]:
    """Names an assignment target sets: `a`, `a, b`, and `a` of `a[i]` (written in place)."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(e.value) for e in target.elements))
    if isinstance(target, cst.Subscript):
        return _target_names(target.value)
    return set()


def _written(stmt: cst.CSTNode) -> set[str]:
    """Every name the statement sets or changes in place (`x.scatter_(...)`, `outputs.append(...)`, `x[i] = ...`)."""
    names: set[str] = set()
    for node in walk(stmt):
        if isinstance(node, cst.AssignTarget):
            names |= _target_names(node.target)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            names |= _target_names(node.target)
        elif isinstance(node, (cst.For, cst.CompFor)):
            names |= _target_names(node.target)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and isinstance(node.func.value, cst.Name):
            method = node.func.attr.value
            if (method.endswith("_") and not method.startswith("_")) or method in _IN_PLACE_COLLECTIONS:
                names.add(node.func.value.value)
    return names


def _reads_host(node: cst.CSTNode) -> bool:
    """A call whose size or value is read off the device: `.cpu()`, `.tolist()`, `nonzero`, `torch.where(mask)`."""
    for call in calls_in(node):
        name = _last_name(call)
        if name in _HOST_READS or (name == "where" and len(call.args) == 1):
            return True
    return False


def _is_allocation(stmt: cst.BaseStatement) -> bool:
    """`name = <literal>` or `name = torch.zeros(...)`-like: a name set up for the dispatch to fill."""
    assigned = single_assignment(stmt)
    if assigned is None:
        return False
    name, value = assigned
    if isinstance(value, (cst.Integer, cst.Float, cst.List, cst.Tuple, cst.Dict)) or \
            (isinstance(value, cst.Name) and value.value == "None"):
        return True
    return isinstance(value, cst.Call) and _last_name(value) in _FACTORIES and name not in names_in(value)


def _experts_called(loop: cst.For) -> set[str]:
    """The `self.<list>` collections whose modules the loop body calls: `self.experts[i](x)`, `expert(x)` after
    `expert = self.experts[i]`, or the loop's own `expert` over `enumerate(self.experts)`."""
    def own_collection(node: cst.BaseExpression) -> str | None:
        name = dotted_name(node)
        return name if name is not None and name.startswith("self.") else None

    bound: dict[str, str] = {}
    iterated = loop.iter
    if isinstance(iterated, cst.Call) and dotted_name(iterated.func) == "enumerate" and iterated.args \
            and isinstance(loop.target, cst.Tuple) and len(loop.target.elements) == 2:
        collection, target = own_collection(iterated.args[0].value), loop.target.elements[1].value
    else:
        collection, target = own_collection(iterated), loop.target
    if collection is not None and isinstance(target, cst.Name):
        bound[target.value] = collection
    for node in walk(loop.body):
        assigned = single_assignment(node) if isinstance(node, cst.SimpleStatementLine) else None
        if assigned and isinstance(assigned[1], cst.Subscript) and own_collection(assigned[1].value):
            bound[assigned[0]] = own_collection(assigned[1].value)
    found: set[str] = set()
    for call in calls_in(loop.body):
        if isinstance(call.func, cst.Subscript) and own_collection(call.func.value):
            found.add(own_collection(call.func.value))
        elif isinstance(call.func, cst.Name) and call.func.value in bound:
            found.add(bound[call.func.value])
    return found


def _topk_routing(statements: list[cst.BaseStatement]) -> tuple[str, str] | None:
    """(weights, ids) of the last `weights, ids = torch.topk(...)` (or `x.topk(...)`) among the statements."""
    found = None
    for stmt in statements:
        for node in walk(stmt):
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call) \
                    and _last_name(node.value) == "topk" and isinstance(node.targets[0].target, cst.Tuple):
                elements = [e.value for e in node.targets[0].target.elements]
                if len(elements) == 2 and all(isinstance(e, cst.Name) for e in elements):
                    found = (elements[0].value, elements[1].value)
    return found


def _routing_parameters(function: cst.FunctionDef, dispatch: list[cst.BaseStatement], loop: cst.For
                        ) -> tuple[str, str] | None:
    """(weights, ids) among the parameters, by how the dispatch uses them: one used as expert ids, one as a factor."""
    params = {p.name.value for p in function.params.params} - {"self"}
    ids: set[str] = set()
    factors: set[str] = set()
    loop_names = _target_names(loop.target)
    assigned = dict(filter(None, (single_assignment(node) for stmt in dispatch for node in walk(stmt)
                                  if isinstance(node, cst.SimpleStatementLine))))

    def weighted_by(operand: cst.BaseExpression) -> set[str]:
        """The parameters a factor reads: itself, or rows of it taken in the loop (`w = weights[rows, slots]`)."""
        found = names_in(operand) & params
        base = _viewed_name(operand)
        for _ in range(4):  # a short chain of views of a local
            if base is None or base in params or base not in assigned:
                break
            base = _viewed_name(assigned[base])
        return found | ({base} if base in params else set())
    for stmt in dispatch:
        for node in walk(stmt):
            if isinstance(node, cst.Call):
                name = _last_name(node)
                if name == "one_hot" and node.args:
                    ids |= names_in(node.args[0].value) & params
                elif name in _IDS_INDEXING and len(node.args) >= 2:
                    index = next((a for a in node.args if a.keyword and a.keyword.value == "index"), node.args[1])
                    ids |= names_in(index.value) & params
                elif name in ("argsort", "sort") and isinstance(node.func, cst.Attribute):
                    ids |= names_in(node.func.value) & params
                elif name in ("mul", "mul_"):
                    factors |= set().union(*(weighted_by(a.value) for a in node.args))
            elif isinstance(node, cst.Comparison) and names_in(node) & loop_names:
                ids |= names_in(node) & params
            elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
                factors |= weighted_by(node.left) | weighted_by(node.right)
    factors -= ids
    return (factors.pop(), ids.pop()) if len(ids) == 1 and len(factors) == 1 else None


def _routing(function: cst.FunctionDef, body: list[cst.BaseStatement], at: int) -> tuple[str, str] | None:
    """(weights, ids) of the routing the expert loop `body[at]` dispatches: a top-k before it, else parameters."""
    return _topk_routing(body[:at]) or _routing_parameters(function, body, body[at])


def _iterates_routed_values(function: cst.FunctionDef, body: list[cst.BaseStatement], at: int) -> bool:
    """The expert loop `body[at]` iterates a tensor computed from the expert ids (`for i, n in
    enumerate(tokens_per_expert)`, transformers' DeepSeek files of 2025): each item is a device value the loop reads
    on the host (`if n == 0`, a slice to `start + n`), a pick as `.cpu().numpy()` of the counts would be."""
    iterated = body[at].iter
    if isinstance(iterated, cst.Call) and dotted_name(iterated.func) == "enumerate" and iterated.args:
        iterated = iterated.args[0].value
    routing = _routing(function, body, at) if isinstance(iterated, cst.Name) else None
    return routing is not None and iterated.value in _derived_from(routing[1], body[:at])


def _viewed_name(node: cst.BaseExpression) -> str | None:
    """The name an expression takes rows or a view of: `w` of `w`, `w[i, j]`, `w.unsqueeze(-1)`, `w[i].to(x)`."""
    while True:
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _VIEWS:
            node = node.func.value
        else:
            return None


def _library_dispatched(cls: cst.ClassDef) -> bool:
    """`@use_experts_implementation` (transformers 5.x): the library swaps the class's `forward` for the experts
    implementation the config names, which compiles; the loop written in the class runs only when asked for."""
    return any((dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or "")
               .rsplit(".", 1)[-1] == "use_experts_implementation" for d in cls.decorators)


def _sliced_per_expert(loop: cst.For) -> cst.Subscript | None:
    """The first slice in the loop's body of a tensor of the module by the loop's variable (or a name set from it):
    `self.weight[i]`, `self.mlp.w1.view(shape)[expert_idx]`."""
    if not isinstance(loop.body, cst.IndentedBlock):
        return None
    indexes = _target_names(loop.target) | _written(loop.body)
    return next((node for node in walk(loop.body) if isinstance(node, cst.Subscript)
                 and (dotted_name(_sliced_root(node.value)) or "").startswith("self.")
                 and names_in(node.slice[0]) & indexes), None)


def _split_at_sizes(statements: list[cst.BaseStatement]) -> cst.Call | None:
    """`x.split(sizes, ...)` with the sizes a name (a list counted elsewhere, not a fixed chunk size)."""
    return next((call for stmt in statements for call in calls_in(stmt) if _last_name(call) == "split"
                 and call.args and isinstance(call.args[0].value, cst.Name)), None)


def _sliced_root(node: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor a per-expert slice is taken of: `self.mlp.w1` of `self.mlp.w1.view(shape)`, itself otherwise."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _VIEWS:
        node = node.func.value
    return node


def _listed(names: set[str]) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names)) or "none"


def _returned(stmt: cst.BaseStatement) -> bool:
    """`return <expression>` on a line of its own."""
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Return) \
        and stmt.body[0].value is not None


def _derived_from(ids: str, statements: list[cst.BaseStatement]) -> set[str]:
    """The names whose values the statements compute, directly or not, from the expert ids."""
    derived = {ids}
    for stmt in statements:
        if names_in(stmt) & derived:
            derived |= _written(stmt)
    return derived


def _not_for_decode(loop: cst.CSTNode, parents) -> bool:
    """The loop runs only in training (`if self.training:`) or in eager calls (`if not torch.compiler.is_compiling():`,
    this codemod's own output among them)."""
    node = parents(loop)
    while node is not None and not isinstance(node, cst.FunctionDef):
        if isinstance(node, cst.If):
            names = {n.value for n in walk(node.test) if isinstance(n, cst.Name)} | \
                {n.attr.value for n in walk(node.test) if isinstance(n, cst.Attribute)}
            if "training" in names or code_of(node.test).strip() == GUARD:
                return True
        node = parents(node)
    return False


@dataclass(frozen=True)
class _Dispatch:
    """One expert loop's dispatch, as found: the statements it spans (indices into the function's body) and the
    helper call that replaces them."""

    start: int
    end: int
    result: str | None  # the name the dispatch sets; None where it returns the mixture
    experts: str
    tokens: str
    ids: str
    weights: str

    def call(self) -> str:
        mixture = f"{HELPER}({self.experts}, {self.tokens}, {self.ids}, {self.weights})"
        return f"return {mixture}\n" if self.result is None else f"{self.result} = {mixture}\n"


class StaticMoE(StepCodemod):
    NAME = "static_moe"
    TITLE = "Dispatch MoE experts with static shapes"
    DESCRIPTION = (
        "A mixture-of-experts dispatch that picks each expert's tokens by the routing (counts read on the host with "
        "`.cpu().numpy()`/`.tolist()`, `torch.where` of an expert mask, boolean indexing) gets a static form for "
        "compiled calls (`graphmode_moe`). Where a step routes fewer (token, expert) pairs than there are experts, "
        "as Decode does with few sequences, each token's top-k experts' weights are gathered from a stack built in "
        "the eager calls, and only those are read (Mixtral at batch 1: 2 of 8 experts; DeepSeek-V3: 8 of 256). "
        "Elsewhere every expert runs over the step's tokens and each token keeps its top-k outputs, which reads "
        "each expert's weights once for all the tokens. The routing and its weights are unchanged and the sum "
        "is the same up to float rounding; Decode no longer waits for the device or breaks its graph there; eager "
        "calls (Prefill) keep the loop."
    )
    SKILL = "static-moe"
    FIXES = frozenset({"GM101", "GM102", "GM103", "GM401", "GM402"})
    IDIOM_IN_ONE_FUNCTION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        picks = not words.isdisjoint(_HOST_READS | {"where", "enumerate", "split"}) or bool(options.host_sync_lines)
        return ":For" in words and picks

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._synced = {line for file, line in self.options.host_sync_lines if file == self.context.filename}
        module = super().transform_module_impl(tree)
        for name in reversed(_DISPATCH_HELPERS):
            if self.edits and not defined_at_top(module, name):
                module = insert_after_imports(module, helper_statements(name))
        return module

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef):
        if not self.in_step_code(original_node) or not isinstance(original_node.body, cst.IndentedBlock):
            return updated_node
        body = list(original_node.body.body)
        parents = lambda node: self.get_metadata(cst.metadata.ParentNodeProvider, node, None)  # noqa: E731
        for loop in nodes_of_type(original_node.body, cst.For):
            if _not_for_decode(loop, parents):
                continue
            if not _experts_called(loop):
                self._packed_experts(loop, body)
                continue
            at = next((i for i, stmt in enumerate(body) if stmt is loop), None)
            # The picks may sit before the loop (counts read on the host, then slices of them inside it).
            iterates = at is not None and _iterates_routed_values(original_node, body, at)
            picks = iterates or self._picks(loop) or any(map(self._picks, body[:at] if at is not None else body))
            if not picks:
                continue  # its shapes do not depend on the routing: nothing to do
            if at is None:
                if _topk_routing(body):
                    self.record_manual(loop, "this expert loop picks tokens by the routing inside a nested block; "
                                             "only a dispatch at the top of a function's body is replaced")
                continue
            found = self._dispatch(original_node, body, at)
            if found is None:
                continue
            if isinstance(found, str):
                self.record_manual(loop, f"this expert loop picks each expert's tokens by the routing, but {found}; "
                                         "write its dispatch with static shapes by hand (skill static-moe)")
                continue
            if not iterates and not any(map(self._picks, body[found.start:found.end + 1])):
                continue  # the host reads lie outside the dispatch; its own shapes are static
            return self._rewrite(original_node, updated_node, found)
        return updated_node

    def _packed_experts(self, loop: cst.For, body: list[cst.BaseStatement]) -> None:
        """A loop over experts whose weights are one tensor of the module, sliced per expert (`self.w1.view(...)[i]`,
        `self.weight[i]`), with tokens picked in sizes only the device knows: by a host read in or before the loop,
        or by a split at sizes the caller passes (`inputs.split(expert_size)`, read on the host where they were
        counted). This codemod replaces loops over a list of expert modules only; the item says what to write."""
        if any(_library_dispatched(node) for node in self._enclosing_classes(loop)):
            return  # transformers replaces this forward by its own experts implementation (grouped_mm, batched_mm)
        sliced = _sliced_per_expert(loop)
        if sliced is None:
            return
        before = body[:next((i for i, stmt in enumerate(body) if stmt is loop), len(body))]
        if self._picks(loop) or any(map(self._picks, before)):
            how = "picked in shapes only the device knows (`nonzero`, `torch.where` of a mask, `.tolist()`)"
        elif (split := _split_at_sizes(before)) is not None:
            how = f"split at sizes read on the host (`{short_code(code_of(split))}`)"
        else:
            return
        self.record_manual(loop, f"this loop runs experts whose weights are one tensor sliced per expert "
                                 f"(`{short_code(code_of(sliced))}`), each on its tokens {how}; static_moe replaces "
                                 "loops over a list of expert modules only. Write its compiled form by hand: gather "
                                 "each token's top-k experts' slices by their ids and run them batched (as "
                                 "transformers' `batched_mm` experts do), or run every expert over every token and "
                                 "keep each token's top-k outputs (skill static-moe)")

    def _enclosing_classes(self, node: cst.CSTNode) -> list[cst.ClassDef]:
        found = []
        while (node := self.get_metadata(cst.metadata.ParentNodeProvider, node, None)) is not None:
            if isinstance(node, cst.ClassDef):
                found.append(node)
        return found

    def _picks(self, node: cst.CSTNode) -> bool:
        """The loop (or its dispatch) picks tokens in a size read off the device: by its calls, or as the trace saw."""
        first, last = self._lines(node)
        return _reads_host(node) or any(first <= line <= last for line in self._synced)

    def _dispatch(self, function: cst.FunctionDef, body: list[cst.BaseStatement], at: int) -> _Dispatch | str | None:
        """The dispatch around the expert loop `body[at]`; why it cannot be replaced; or None when the loop
        dispatches nothing by a routing."""
        loop = body[at]
        collections = _experts_called(loop)
        if len(collections) != 1:
            return f"it calls modules of more than one collection ({_listed(collections)})"
        routing = _routing(function, body, at)
        if routing is None:
            return None  # a loop over modules with no routing (a stack of layers): no dispatch here
        weights, ids = routing
        derived = _derived_from(ids, body)
        if not names_in(loop) & derived:
            return None  # the loop reads nothing computed from the expert ids: it dispatches nothing
        # Where it ends: the loop itself when it applies the weights, else the first statement after it that does.
        end = at
        if weights not in names_in(loop):
            end = next((j for j in range(at + 1, len(body)) if weights in names_in(body[j])), None)
            if end is None or (single_assignment(body[end]) is None and not _returned(body[end])):
                return (f"its outputs are not combined with the routing weights `{weights}` in one assignment or "
                        "return after it")
        read_after = set().union(*map(names_in, body[end + 1:]))
        if end > at:
            result = None if _returned(body[end]) else single_assignment(body[end])[0]
        else:
            results = _written(loop) & read_after
            if len(results) != 1:
                return f"the loop hands on {_listed(results)} rather than one accumulated result"
            result = results.pop()
        # Where it starts: the statements before the loop that work on the ids or allocate what the dispatch fills.
        start = at
        while start > 0:
            stmt = body[start - 1]
            sets = _written(stmt)
            if is_docstring(stmt) or not sets or sets & {ids, weights} \
                    or not (names_in(stmt) & derived or _is_allocation(stmt)):
                break
            kept = sets & read_after - {result}
            if kept:
                return (f"it computes {_listed(kept)} on the way (line {self._lines(stmt)[0]}), which the code after "
                        "it reads")
            start -= 1
        span = body[start:end + 1]
        local = set().union(*map(_written, span))
        leaking = local & read_after - {result}
        if leaking:
            return f"it computes {_listed(leaking)} on the way, which the code after it reads"
        if any(nodes_of_type(stmt, cst.Return) for stmt in (span[:-1] if result is None else span)):
            return "it returns from inside the dispatch"
        indexed = {n.value.value for stmt in span for n in walk(stmt)
                   if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name)}
        # The last statement may write its result over the tokens' name (`hidden_states = <the mixture>`).
        set_before = local if end == at else set().union(*map(_written, span[:-1]))
        tokens = indexed - set_before - {ids, weights}
        if len(tokens) != 1:
            return f"the tokens it hands the experts are not one name it indexes ({_listed(tokens)})"
        return _Dispatch(start, end, result, collections.pop(), tokens.pop(), ids, weights)

    def _rewrite(self, original: cst.FunctionDef, updated: cst.FunctionDef, found: _Dispatch) -> cst.FunctionDef:
        body = list(updated.body.body)
        span = body[found.start:found.end + 1]
        comment = [cst.EmptyLine(indent=True, comment=cst.Comment(line)) for line in _COMMENT]
        guarded = cst.If(
            test=cst.parse_expression(GUARD),
            body=cst.IndentedBlock(body=[cst.parse_statement(f"{STACKER}({found.experts})\n"),
                                         span[0].with_changes(leading_lines=[]), *span[1:]]),
            orelse=cst.Else(body=cst.IndentedBlock(body=[cst.parse_statement(found.call())])),
            leading_lines=[*span[0].leading_lines, *comment],
        )
        first = self._lines(original.body.body[found.start])[0]
        last = self._lines(original.body.body[found.end])[1]
        synced = sorted(line for line in self._synced if first <= line <= last)
        into = "that returns the mixture" if found.result is None else f"into `{found.result}`"
        seen = f"; the traced run saw it read the device at line(s) {', '.join(map(str, synced))}" if synced else ""
        self.edits.append(Edit(self.NAME, self.qualname(original), first, last,
                               f"the expert dispatch {into} runs `{HELPER}` when compiled{seen}"))
        AddImportsVisitor.add_needed_import(self.context, "torch")
        new_body = [*body[:found.start], guarded, *body[found.end + 1:]]
        return updated.with_changes(body=updated.body.with_changes(body=new_body))
