"""Replaces a tuple KV cache that attention grows with `torch.cat` by buffers written in place, in any layout.

Older Hugging Face models (GPT-2, GPT-J, CodeGen, ...) and much research code carry the cache in and out
of `forward` as tensors and grow it every step:

    if layer_past is not None:
        past_key, past_value = layer_past           # or layer_past[0] / layer_past[1]
        key = torch.cat((past_key, key), dim=-2)
        value = torch.cat((past_value, value), dim=-2)

Which `cat` is a cache, and along which dim it grows, is what the runtime evidence saw (runners.evidence.analysis:
a `cat` whose input is the same line's output one Decode step earlier); without evidence, the statement
shape above is recognised. The pair becomes

    key, value = self.kv_cache.update(position_ids[0], key, value)

with `self.kv_cache` a `StaticKVBuffers` that holds as many slots along the growing dim as the entry's
`setup_caches(max_batch_size, max_seq_length)` asks for
(one for the keys and one for the values where they differ, as in Bloom), shaped from the first write (Prefill,
eager), so no head count or layout has to be named. With evidence the pair may sit at any depth of branches;
the write then goes on every path that computes this layer's keys (`_write_paths`).

Attention then reads every slot, so the causal mask must hide the ones not written yet. The slices of a
causal buffer by the key length (`self.bias[:, :, key_length - query_length : key_length, :key_length]`)
become rows picked by the positions (`self.bias[:, :, position_ids[0], :key_length]`). Where a method on the
way has no positions, `position_ids` is passed down to it from the nearest caller in the file that has them
(`_call_graph`). Where no caller has any (OPT, MPT, Bloom: ALiBi or positions from a mask's cumsum), they are
introduced in the method that reads the past length off the cache and passed down from the model's `forward`
(`_new_positions`).
Where the model's forward builds the 4-D mask with a library helper instead
(`attention_mask = _prepare_4d_causal_attention_mask[_for_sdpa](mask, (batch, length), embeds, past)`, transformers
4.36 to 4.46), the call becomes rows of one causal mask (sized by `setup_caches`) picked by the positions,
with as many columns as the cache hands back (every slot in a compiled graph, the written ones in eager calls).
Where the model has no such mask (no mask at all in Decode, `is_causal` for the prompt only, a mask it builds per
call for the length it counts), the static cache owns its validity: the op the trace saw read the cache along its
growing dim (SDPA, or the product forming the scores) hides the unwritten slots with a mask made from the
positions (`_slot_masks`). A sequence-first cache ([seq, batch, heads, dim], GLM) is written along dim 0 as the
trace saw. A branch on a flag of the module around the pair (`if self.use_cache_quantization:`), taken at every
Decode step the trace saw, keeps only that side in the static copy (`_write_paths`). Where no caller in the file can
be followed down to a method that needs positions (modules built through a factory, layers picked by a getter),
the method reads the slots the entries write off the module (`graphmode_slots(self)`).
All or nothing per file: a cache with no mask and no traced read, or a moving slice not understood, changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.codemods.base import GraphCodemod
from graphmode.transforms.codemods.lib.cache_lengths import plan_cache_lengths
from graphmode.transforms.codemods.lib.call_graph import THREADED, CallGraph, Threading, class_tables
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import BUFFERS_CLASS, MASK_BUILDER, MASK_CLASS
from graphmode.transforms.codemods.lib.mask_recognition import MASK_HELPERS, mask_helper_call
from graphmode.transforms.codemods.lib.module import defined_at_top, insert_after_imports, \
    remove_imports_if_unused, self_attributes, transform_statements
from graphmode.transforms.codemods.lib.new_positions import KEY_SLOTS, Derivation, derivation, \
    dead_lengths, derived_positions, key_length_sizes, take_positions
from graphmode.transforms.codemods.lib.offset_windows import rows_at_slots
from graphmode.transforms.codemods.lib.slot_masks import plan_slot_masks
from graphmode.transforms.codemods.lib.write_paths import place_write
from graphmode.transforms.cstutil import AppendingCat, appending_cat, calls_in, code_of, find_method, names_in, \
    nodes_of_type, none_test, self_attribute_name, single_assignment, torch_call_name
from graphmode.transforms.dispatch import Transformer

# The helpers inserted by name; their code is in helper-code/helpers.py.
MASK_ROWS = "graphmode_mask_rows"
# Where a method finds the slots of the tokens it computes, by the position parameter it has.
_SLOTS = {"cache_position": "cache_position", "position_ids": "position_ids[0]"}
# Where it finds them when no caller can pass positions down to it: off the module, as the entries set them.
SLOTS_OFF_MODULE = "graphmode_slots"


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(indent=True, comment=cst.Comment(f"# graphmode: {text}"))


def _unpacks(stmt: cst.CSTNode) -> set[str]:
    """Names bound from one other name alone (the cache): `pk, pv = cache`, `pk = cache[0]`; empty otherwise."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return set()
    assign = stmt.body[0]
    # `pk = cache[0]`, `pk, pv = cache`, or `pk, pv = cache[0], cache[1]`
    parts = [e.value for e in assign.value.elements] if isinstance(assign.value, cst.Tuple) else [assign.value]
    if len(assign.targets) != 1 or len(names_in(assign.value)) != 1 \
            or not all(isinstance(p, (cst.Name, cst.Subscript)) for p in parts):
        return set()
    target = assign.targets[0].target
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Tuple) and all(isinstance(e.value, cst.Name) for e in target.elements):
        return {e.value.value for e in target.elements}
    return set()


def _carried(method: cst.FunctionDef, cat: AppendingCat) -> str | None:
    """The parameter the cat's old piece is read off (`layer_past` of `torch.cat((layer_past[0], k))`, or of
    `past_key` unpacked from it); None when it is no parameter of the method."""
    params = {p.name.value for p in method.params.params}
    read = names_in(cat.past)
    if read & params:
        return next(iter(read & params))
    for stmt in nodes_of_type(method.body, cst.SimpleStatementLine):
        unpacked = _unpacks(stmt)
        source = names_in(stmt.body[0].value) if unpacked else set()
        if unpacked & read and len(source) == 1 and source <= params:
            return next(iter(source))
    return None


def _reads_guarded(block: list[cst.BaseStatement], cat: AppendingCat, cache: str) -> bool:
    """The cat's old piece comes from the guarded cache: `cache[0]`, or a name unpacked from it in the block."""
    unpacked = set().union(*(_unpacks(s) for s in block if cache in names_in(s) and appending_cat(s) is None))
    return bool(names_in(cat.past) & ({cache} | unpacked))


def _causal_rows(subscript: cst.Subscript) -> tuple[int, str] | None:
    """`self.B[..., L - Q : L, :L]` (rows of a causal buffer for the new tokens, columns up to the key length)
    -> (index of the row element, "L")."""
    elements = list(subscript.slice)
    if len(elements) < 2 or not isinstance(subscript.value, cst.Attribute):
        return None
    rows, cols = elements[-2].slice, elements[-1].slice
    if not (isinstance(rows, cst.Slice) and isinstance(cols, cst.Slice)) or rows.step or cols.step or cols.lower:
        return None
    length = code_of(cols.upper).strip() if cols.upper is not None else None
    start = rows.lower
    if not length or rows.upper is None or code_of(rows.upper).strip() != length \
            or not (isinstance(start, cst.BinaryOperation) and isinstance(start.operator, cst.Subtract)
                    and code_of(start.left).strip() == length):
        return None
    return len(elements) - 2, length


_MASK_FACTORIES = frozenset({"full", "ones", "zeros", "empty"})


def _changing_attributes(cls: cst.ClassDef) -> set[str]:
    """Attributes of the module that a method other than `__init__` assigns: no flag a run can count on."""
    found = set()
    for method in cls.body.body:
        if isinstance(method, cst.FunctionDef) and method.name.value != "__init__":
            for target in [*nodes_of_type(method, cst.AssignTarget), *nodes_of_type(method, cst.AugAssign)]:
                name = self_attribute_name(target.target)
                if name:
                    found.add(name)
    return found


def _flag_test(test: cst.BaseExpression, changing: set[str]) -> bool:
    """A test on flags of the module alone (`self.use_cache_quantization`, `not self.config.use_quantized_cache`,
    `self.config.mode == "int8"`), none of them assigned after construction."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _flag_test(test.expression, changing)
    if isinstance(test, cst.BooleanOperation):
        return _flag_test(test.left, changing) and _flag_test(test.right, changing)
    if isinstance(test, cst.Comparison):
        return _flag_test(test.left, changing) and all(
            isinstance(c.comparator, (cst.Integer, cst.SimpleString, cst.Float))
            or (isinstance(c.comparator, cst.Name) and c.comparator.value in ("None", "True", "False"))
            for c in test.comparisons)
    chain, root = [], test
    while isinstance(root, cst.Attribute):
        chain.append(root.attr.value)
        root = root.value
    return isinstance(root, cst.Name) and root.value == "self" and bool(chain) and chain[-1] not in changing


@dataclass(frozen=True)
class _Offset:
    key: str  # the key length's name, K
    k: int    # the diagonal is K - Q + k


def _offset(diagonal: cst.BaseExpression) -> _Offset | None:
    """`K - Q` or `K - Q + k` (names K and Q, an integer k) -> (K, k)."""
    k = 0
    if isinstance(diagonal, cst.BinaryOperation) and isinstance(diagonal.operator, cst.Add) \
            and isinstance(diagonal.right, cst.Integer):
        k, diagonal = int(diagonal.right.value), diagonal.left
    if isinstance(diagonal, cst.BinaryOperation) and isinstance(diagonal.operator, cst.Subtract) \
            and isinstance(diagonal.left, cst.Name) and isinstance(diagonal.right, cst.Name):
        return _Offset(diagonal.left.value, k)
    return None


def _triangle(call: cst.Call) -> tuple[cst.BaseExpression, bool, _Offset, cst.BaseExpression] | None:
    """(the tensor, upper?, the offset, the diagonal) of `x.triu(K - Q + k)`, `torch.triu(x, K - Q + k)` and the
    tril forms, where x is made right there by a factory (`torch.full`, `torch.ones`, ...); None otherwise."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in ("triu", "tril"):
        return None
    args = list(call.args)
    if code_of(func.value).strip() == "torch":
        base, args = (args[0].value, args[1:]) if args else (None, [])
    else:
        base = func.value
    if base is None or len(args) != 1 or torch_call_name(base) not in _MASK_FACTORIES:
        return None
    offset = _offset(args[0].value)
    return (base, func.attr.value == "triu", offset, args[0].value) if offset is not None else None


@dataclass
class _Plan:
    replace: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    drop: set[cst.CSTNode] = field(default_factory=set)
    init: dict[str, tuple[int, int]] = field(default_factory=dict)  # class -> seq dims of its keys and values
    # (class, method) -> the slots expression it uses; methods that need `position_ids` passed to them
    slots: dict[tuple[str, str], str] = field(default_factory=dict)
    needs: set[tuple[str, str]] = field(default_factory=set)
    masks: int = 0
    mask_buffers: dict[str, str] = field(default_factory=dict)  # class -> name of its causal mask buffer
    helpers: set[str] = field(default_factory=set)  # the mask helpers whose calls were replaced
    derive: dict[cst.CSTNode, cst.BaseStatement] = field(default_factory=dict)  # positions counted after the key
    key_slots: bool = False  # a tensor made for `past + new` keys is made for the key slots (KEY_SLOTS)
    slot_helpers: set[str] = field(default_factory=set)  # the helpers that hide unwritten slots where keys are read
    length_helpers: set[str] = field(default_factory=set)  # those that stand for lengths read off the cache
    problems: list[tuple[cst.CSTNode, str]] = field(default_factory=list)


class CarriedCache(GraphCodemod):
    NAME = "carried_cache"
    SIZES_BUFFERS = True
    TITLE = "Replace the tuple KV cache grown with torch.cat by buffers written in place"
    DESCRIPTION = (
        "Where attention grows a cache passed in and out of `forward` with `torch.cat` (seen doing so at run time, "
        "along whatever dim), it writes a `StaticKVBuffers` (sized by the entry's `setup_caches`) instead, "
        "with `index_copy_` at the positions; the causal buffer sliced by the key length (or the 4-D mask a "
        "library helper builds per call, or a triangle `torch.full((Q, K), -inf).triu(K - Q + 1)` cut at the key "
        "length) becomes rows picked by the positions, so attention reads every slot and "
        "the unwritten ones stay hidden. `position_ids` is passed down to the methods that need it; where the model "
        "has none, the method that reads the past length off the cache takes them (counting them from that length "
        "when its caller passes none), positions it made otherwise (a padding mask's cumsum) come from them, and "
        "tensors it made for `past + new` keys are made for the slots attention reads. Where the model has no such "
        "mask (none in Decode, `is_causal`, one built per call), the op the trace saw read the cache (SDPA, the "
        "scores product) hides the unwritten slots with a mask made from the positions. The compiled "
        "Decode neither reads nor returns cache tuples; eager callers that carry them get the written slots back, so "
        "positions counted from their length stay true. Where a library helper built the mask, a 2-D padding mask "
        "passed with it is no longer applied, and positions the model made from that mask no longer skip its "
        "padding: left-padded batches must pass per-row `position_ids`."
    )
    SKILL = "static-kv-cache"
    FIXES = frozenset({"GM301", "GM302", "GM201"})

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return "cat" in words  # what the evidence saw grow is a `torch.cat` too

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        code = self.code_of_module(tree)
        if f"{BUFFERS_CLASS}(" in code or "StaticKVCache(" in code:
            return tree  # already static (a second run, or another codemod took this file)
        self._classes = {s.name.value: s for s in tree.body if isinstance(s, cst.ClassDef)}
        self._tree = tree
        self._off_module = False
        plan, threading = self._plan(tree)
        if plan is None:
            return tree
        if not plan.problems and threading.missing:
            # No caller in the file can be followed down to them (modules built through a factory, layers picked
            # by a getter): the methods read the slots the entries write off the module instead.
            self.edits.clear()
            self._off_module = True
            plan, threading = self._plan(tree)
        if threading is not None and threading.missing:
            plan.problems += threading.missing
        if plan.problems:
            self.edits.clear()
            for node, reason in plan.problems:
                self.record_manual(node, f"the tuple cache was not replaced: {reason}")
            return tree
        return self._apply(tree, plan, threading)

    def _plan(self, tree: cst.Module) -> tuple[_Plan | None, Threading | None]:
        """What changes, and how positions reach the methods that need them; (None, None) when nothing grows."""
        plan = _Plan()
        for cls in self._classes.values():
            for method in cls.body.body:
                if isinstance(method, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock):
                    self._plan_cache(cls, method, plan)
        if not plan.init and not plan.problems:
            return None, None
        for cls_name in plan.init:
            for method in self._classes[cls_name].body.body:
                if isinstance(method, cst.FunctionDef):
                    self._plan_masks(self._classes[cls_name], method, plan)
                    self._plan_inline_masks(self._classes[cls_name], method, plan)
        for cls in self._classes.values():
            for method in cls.body.body:
                # A method whose words name no mask helper is not walked for their calls.
                if isinstance(method, cst.FunctionDef) and not self.source.function_words(
                        f"{cls.name.value}.{method.name.value}").isdisjoint(MASK_HELPERS):
                    self._plan_helper_masks(cls, method, plan)
        for cls in self._classes.values():
            for method in cls.body.body:
                if isinstance(method, cst.FunctionDef):
                    self._plan_square_masks(cls, method, plan)
        if not plan.problems and not plan.masks:
            self._plan_slot_masks(plan)
        if not plan.problems and not plan.masks:
            plan.problems.append((self._classes[next(iter(plan.init))],
                                  "no causal mask (a buffer sliced by the key length, a helper's mask or a triangle "
                                  "cut at it) was found to hide unwritten slots, and no traced run saw which op reads "
                                  "the cache"))
        return plan, self._threading(tree, plan) if not plan.problems else None

    def _apply(self, tree: cst.Module, plan: _Plan, threading: Threading) -> cst.Module:
        # Only the statements holding a planned node, or a class or method that changes, are walked and rebuilt.
        touched = {self.source.top_level_statement(n)
                   for n in [*plan.replace, *plan.drop, *plan.derive, *threading.calls]}
        touched |= {self._classes[name] for name in {*plan.init, *plan.mask_buffers, *(c for c, _ in threading.params)}}
        module = transform_statements(tree, _Apply(plan, threading, self._too_long(tree, threading.calls)), touched)
        module = remove_imports_if_unused(module, plan.helpers, self.source)
        generated = [BUFFERS_CLASS]
        if plan.mask_buffers:
            generated += [MASK_BUILDER, MASK_CLASS, MASK_ROWS]
        if plan.key_slots:
            generated.append(KEY_SLOTS)
        generated += sorted(plan.length_helpers - set(generated))
        if self._off_module:
            generated.append(SLOTS_OFF_MODULE)
        generated += sorted(plan.slot_helpers)
        for name in reversed(generated):  # each goes first after the imports
            if not defined_at_top(module, name):
                module = insert_after_imports(module, helper_statements(name))
        return module

    def _threading(self, tree: cst.Module, plan: _Plan) -> Threading:
        """How positions reach every method that needs them; where no caller has any, they are introduced in the
        method that reads the past length off the cache (`_new_positions`) and passed down from the model's
        `forward`."""
        calls = CallGraph(self._classes, class_tables(tree, set(self._classes)))
        entry = self.options.entry_class
        entry = (entry, "forward") if entry in self._classes else None
        own = self._own_positions(entry)
        if own:
            for (cls, method), run in own.items():
                guard = cst.parse_statement(f"if {THREADED} is None:\n    pass\n")
                plan.replace[run[0]] = guard.with_changes(
                    body=guard.body.with_changes(body=[run[0].with_changes(leading_lines=[]), *run[1:]]),
                    leading_lines=[*run[0].leading_lines, _comment("positions counted here only when the caller "
                                                                   "passes none.")])
                plan.drop |= set(run[1:])
                self.record_edit(run[0], f"`{cls}.{method}` takes `{THREADED}` from its caller, and counts them itself "
                                         "only when given none")
            return Threading(calls, plan.needs, sources=frozenset(own), entry=entry)
        threading = Threading(calls, plan.needs, entry=entry)
        if not threading.missing:
            return threading
        source = self._positions_source(threading, plan.needs)
        if source is None:
            return threading
        (cls, method), found = source
        plan.derive[found.after] = derived_positions(found, _line_limit(self.code_of_module(tree)))
        method_node = find_method(self._classes[cls], method)
        sizes = key_length_sizes(method_node, found)
        plan.replace.update(sizes)
        plan.drop |= dead_lengths(method_node, found, sizes)
        plan.key_slots = plan.key_slots or bool(sizes)
        for size in sizes:
            self.record_edit(size, f"`{code_of(size)}` (the `past + new` keys) sized by the key slots attention reads")
        for need, stmt in self._position_statements():
            new, dead = take_positions(find_method(self._classes[need[0]], need[1]), stmt)
            plan.replace[stmt] = new
            plan.drop |= dead
            if need != (cls, method):
                plan.needs.add(need)
            self.record_edit(stmt, f"`{code_of(stmt.body[0].value)}` (the positions, made of something else) "
                                   f"replaced by `{THREADED}`")
        self.record_edit(found.after, f"`{THREADED}` added to `{cls}.{method}`, counted from `{found.past}` where "
                                      "the caller passes none")
        return Threading(calls, plan.needs, sources=frozenset({(cls, method)}), entry=entry)

    def _own_positions(self, entry: tuple[str, str] | None) -> dict[tuple[str, str], list[cst.SimpleStatementLine]]:
        """Methods below the entry that make `position_ids` themselves (the trace saw the statement make the
        positions, counted from the past length read off the cache) and take none: given no cache, a compiled Decode
        would count them from zero there. Each -> its statements that make them: the one the trace saw and the
        reassignments of `position_ids` right after it (`position_ids = position_ids.unsqueeze(0)`)."""
        found = {}
        for need, stmt in self._position_statements():
            method = find_method(self._classes[need[0]], need[1])
            target = stmt.body[0].targets[0].target if isinstance(stmt.body[0], cst.Assign) else None
            if need == entry or not (isinstance(target, cst.Name) and target.value == THREADED) \
                    or THREADED in {p.name.value for p in method.params.params} or need in found:
                continue
            body = list(method.body.body)
            run = [stmt]
            for following in body[body.index(stmt) + 1:]:
                if not (single_assignment(following) and isinstance(following.body[0], cst.Assign)
                        and code_of(following.body[0].targets[0].target).strip() == THREADED
                        and THREADED in names_in(following.body[0].value)):
                    break
                run.append(following)
            found[need] = run
        return found

    def _positions_source(self, threading: Threading, needs: set[tuple[str, str]]
                          ) -> tuple[tuple[str, str], Derivation] | None:
        """The method that reads the past length off the cache and calls down to every method that needs positions
        (the one nearest to them, when several do)."""
        ancestors: dict[tuple[str, str], set[tuple[str, str]]] = {}

        def up(method: tuple[str, str]) -> set[tuple[str, str]]:
            if method not in ancestors:
                ancestors[method] = set()
                for caller, _ in threading.callers.get(method, []):
                    ancestors[method] |= {caller} | up(caller)
            return ancestors[method]

        candidates = []
        for cls in self._classes.values():
            for method in cls.body.body:
                key = (cls.name.value, getattr(method, "name", cst.Name("_")).value)
                if isinstance(method, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock) \
                        and all(key == need or key in up(need) for need in needs) \
                        and (found := derivation(method)) is not None:
                    candidates.append((key, found))
        nearest = [c for c in candidates if not any(c[0] in up(other[0]) for other in candidates)]
        return nearest[0] if len(nearest) == 1 else None

    def _position_statements(self) -> list[tuple[tuple[str, str], cst.SimpleStatementLine]]:
        """The plain assignments the trace saw make the positions out of something else, with their methods."""
        lines = {line for file, line in self.options.position_lines if file == self.context.filename}
        found = []
        for cls in self._classes.values():
            for method in cls.body.body:
                if isinstance(method, cst.FunctionDef) and lines:
                    found += [((cls.name.value, method.name.value), stmt) for stmt in method.body.body
                              if single_assignment(stmt) and self._lines(stmt)[0] in lines]
        return found

    def _too_long(self, tree: cst.Module, calls: set[cst.Call]) -> set[cst.Call]:
        """Calls whose last line would grow past the file's own line length with the position argument: that
        argument goes on a line of its own."""
        code = self.code_of_module(tree)
        lines, longest = code.splitlines(), _line_limit(code)
        added = len(f", {THREADED}={THREADED}")
        return {c for c in calls if len(lines[self._lines(c)[1] - 1]) + added > longest}

    # -- the growing pair, in attention methods --------------------------------------------------------
    def _evidence_lines(self) -> dict[int, int] | None:
        """Line -> growing dim of the carried cats the trace saw in this file; None without evidence."""
        if not self.options.traced:
            return None
        path = self.context.filename
        return {line: dim for file, line, dim in self.options.evidence_caches if file == path}

    def _plan_cache(self, cls: cst.ClassDef, method: cst.FunctionDef, plan: _Plan) -> None:
        seen = self._evidence_lines()
        cats: list[AppendingCat] = []
        if seen is not None:
            # The trace saw these cats grow a cache at every Decode step, at whatever depth of branches they sit.
            grown = [stmt for stmt in nodes_of_type(method.body, cst.SimpleStatementLine)
                     if self._lines(stmt)[0] in seen]
            # The trace saw each grow by one Decode step's rows, so a cat of the last row of the tensor assigned
            # (Bloom lineage: `k[-1, ...].unsqueeze(0)`) appends all of it there.
            cats = [found for stmt in grown if (found := appending_cat(stmt, last_row=True)) is not None]
            if len(cats) < len(grown):
                # Said, not passed over: a cache the trace saw grow that stays a `torch.cat` keeps Decode recompiling.
                odd = next(stmt for stmt in grown if appending_cat(stmt, last_row=True) is None)
                plan.problems.append((odd, f"`{cls.name.value}.{method.name.value}` grows a cache here, as the "
                                           "traced run saw, but not as `x = torch.cat([cache, x], dim=N)` (the "
                                           "tensor assigned, or its last row, appended to the cache), the forms the "
                                           "static write replaces"))
                return
        else:
            # Without evidence, only the guarded form: `if cache is not None:` reading the cache, then the cats.
            for stmt in method.body.body:
                test = none_test(stmt.test) if isinstance(stmt, cst.If) and stmt.orelse is None else None
                if test is None or not isinstance(stmt.body, cst.IndentedBlock):
                    continue
                block = list(stmt.body.body)
                cats += [found for inner in block if (found := appending_cat(inner)) is not None
                         and _reads_guarded(block, found, test[0])]
        if not cats:
            return
        where = f"{cls.name.value}.{method.name.value}"
        if len(cats) != 2:
            plan.problems.append((method, f"`{where}` grows {len(cats)} tensors with `torch.cat` where a key and a "
                                          "value pair was expected (stacked keys and values are not handled yet)"))
            return
        keys, values = cats
        # Keys and values may grow along different dims (Bloom: keys [b*h, d, s], values [b*h, s, d]).
        dims = [seen[self._lines(c.stmt)[0]] for c in cats] if seen is not None else [keys.dim, values.dim]
        if min(dims) < 0:
            plan.problems.append((keys.stmt, f"`{where}` grows along dim {min(dims)}, counted from the end, and no "
                                             "traced run says the tensors' rank"))
            return
        slots = self._slots(cls, method, plan)
        served = self._plan_offset_windows(method, slots, plan)
        if not self._plan_cache_lengths(method, keys, dims[0], slots, where, served, plan):
            return
        update = cst.parse_statement(f"{keys.target}, {values.target} = self.kv_cache.update({slots}, "
                                     f"{keys.target}, {values.target})\n")
        # The comments above the cat describe the concatenation, which is gone; blank lines stay.
        written = "written in place; attention reads all slots."
        if keys.last_row or values.last_row:  # said where it is done: a multi-token step would differ
            written = ("new rows written in place (Decode has one: the row the original appends); attention reads "
                       "all slots.")
        update = update.with_changes(leading_lines=[*(e for e in keys.stmt.leading_lines if e.comment is None),
                                                    _comment(written)])
        unpacks = {s for s in nodes_of_type(method.body, cst.SimpleStatementLine) if _unpacks(s)}
        # The trace saw the pair run at every Decode step: a branch on a flag of the module holding it was taken
        # every time, and the static copy keeps that branch alone. So is one on a flag parameter with no `else`
        # (`if use_cache:`): the static path writes its cache whatever the caller asks to get back.
        changing, flags = _changing_attributes(cls), []
        params = {p.name.value for p in method.params.params[1:]}

        def settled(if_: cst.If) -> bool:
            parameter = isinstance(if_.test, cst.Name) and if_.test.value in params and if_.orelse is None
            if _flag_test(if_.test, changing) or parameter:
                flags.append(if_)
                return True
            return False

        placed = place_write(list(method.body.body), (keys.stmt, values.stmt), update, unpacks,
                             settled if seen is not None else None)
        if placed is None:
            plan.problems.append((keys.stmt, f"`{where}`: the write cannot be put on every path that computes the "
                                             "keys: no branch without the cache computes the same keys and values "
                                             "(Prefill would not write the cache), or the pair sits in a block other "
                                             "than an `if`"))
            return
        for flag in flags:
            kind = "parameter" if isinstance(flag.test, cst.Name) else "flag of the module"
            self.record_edit(flag, f"`{code_of(flag.test).strip()}`, a {kind} the traced run saw take the branch "
                                   "growing the cache, settled to that branch")
        for original, replacement in placed.items():
            if not replacement:
                plan.drop.add(original)
            else:
                plan.replace[original] = replacement[0] if len(replacement) == 1 else cst.FlattenSentinel(replacement)
        plan.init[cls.name.value] = (dims[0], dims[1])
        first = next(iter(placed))
        along = f"dim {dims[0]}" if dims[0] == dims[1] else f"dims {dims[0]} and {dims[1]}"
        self.record_edit(first, f"`torch.cat` growth of `{keys.target}`/`{values.target}` along {along} replaced "
                                f"by `self.kv_cache.update` at `{slots}`")

    def _plan_cache_lengths(self, method: cst.FunctionDef, keys: AppendingCat, dim: int, slots: str, where: str,
                            served: set[str], plan: _Plan) -> bool:
        """Lengths the method reads off the cache it grows (`kv_seq_len += layer_past[0].shape[1]`), taken from the
        positions on the static path, which carries no cache (`plan_cache_lengths`). False when one cannot be: the
        cache then stays as it is, and the length's line and the cat's go to a person together."""
        cache = _carried(method, keys)
        if cache is None:
            return True
        lengths = plan_cache_lengths(method, cache, keys.target, {dim, keys.dim}, slots, where,
                                     lambda n: self._lines(n)[0], served)
        if lengths.problems:
            plan.problems += lengths.problems
            line = self._lines(lengths.problems[0][0])[0]
            plan.problems.append((keys.stmt, f"`{where}` grows the cache here and reads its length at line {line}, "
                                             "which cannot be taken from the positions: the static cache would "
                                             "leave that length counting the new tokens alone"))
            return False
        plan.replace.update(lengths.replace)
        plan.drop |= lengths.drop
        plan.length_helpers |= lengths.helpers
        for node, summary in lengths.edits:
            self.record_edit(node, summary)
        return True

    def _plan_offset_windows(self, method: cst.FunctionDef, slots: str, plan: _Plan) -> set[str]:
        """Tables the method hands to a function that cuts them at the past length (`_offset_windows`): no cache is
        handed in on the static path to read that length off, so the call gets the tables' rows at the slots.
        Returns the names such calls were handed, which the static path no longer reads."""
        served: set[str] = set()
        changing = {(function, param) for file, function, param in self.options.changing_int_params
                    if file == self.context.filename}
        for call, (new, name) in rows_at_slots(self._tree, method, changing, slots).items():
            served |= names_in(call)
            plan.replace[call] = new
            self.record_edit(call, f"the tables `{name}` cuts at a past length become their rows at `{slots}`, "
                                   "cut at 0")
        return served

    def _slots(self, cls: cst.ClassDef, method: cst.FunctionDef, plan: _Plan) -> str:
        params = {p.name.value for p in method.params.params}
        slots = next((_SLOTS[p] for p in _SLOTS if p in params), None)
        if slots is None and self._off_module:
            slots = f"{SLOTS_OFF_MODULE}(self)"
        elif slots is None:
            plan.needs.add((cls.name.value, method.name.value))
            slots = _SLOTS[THREADED]
        plan.slots[(cls.name.value, method.name.value)] = slots
        return slots

    # -- no mask of the model's can hide the unwritten slots: the ops that read the cache do -------------------
    def _plan_slot_masks(self, plan: _Plan) -> None:
        path = self.context.filename
        reads: dict[int, set[tuple[str, str]]] = {}
        for file, line, op, kind in self.options.cache_reads:
            if file == path:
                reads.setdefault(line, set()).add((op, kind))
        owned = plan_slot_masks(self._classes, reads, lambda node: self._lines(node)[0])
        plan.replace.update(owned.replace)
        plan.problems += owned.problems
        plan.masks += len(owned.edits)
        plan.slot_helpers |= owned.helpers
        for node, summary in owned.edits:
            self.record_edit(node, summary)

    # -- the causal buffer slices, in the same classes ----------------------------------------------------
    def _plan_masks(self, cls: cst.ClassDef, method: cst.FunctionDef, plan: _Plan) -> None:
        codemod = self
        found: list[tuple[cst.Subscript, int, str]] = []

        class _Collector(cst.CSTVisitor):
            def visit_Subscript(self, node: cst.Subscript) -> None:
                rows = _causal_rows(node)
                if rows is not None:
                    found.append((node, *rows))

        method.visit(_Collector())
        for subscript, index, length in found:
            slots = plan.slots.get((cls.name.value, method.name.value)) or self._slots(cls, method, plan)
            elements = list(subscript.slice)
            elements[index] = elements[index].with_changes(slice=cst.Index(cst.parse_expression(slots)))
            plan.replace[subscript] = subscript.with_changes(slice=elements)
            plan.masks += 1
            codemod.record_edit(subscript, f"mask rows of `{code_of(subscript.value).strip()}` picked by the positions "
                                           f"(`{slots}`) instead of sliced by the key length `{length}`")

    # -- biases built once at full length and cut square at the key length (ALiBi) ---------------------------
    def _plan_square_masks(self, cls: cst.ClassDef, method: cst.FunctionDef, plan: _Plan) -> None:
        """`self.B[:heads, :L, :L]`: a buffer of every position (Baichuan's ALiBi `future_mask`, -inf above the
        diagonal plus the slopes) cut square at the key length L. In a compiled Decode the model counts L from no
        cache, so the rows of the positions are picked instead, with a column for every key slot attention reads."""
        for subscript in nodes_of_type(method, cst.Subscript):
            elements = list(subscript.slice)
            if len(elements) < 2 or self_attribute_name(subscript.value) is None:
                continue
            rows, cols = elements[-2].slice, elements[-1].slice
            if not all(isinstance(e, cst.Slice) and e.lower is None and e.step is None and isinstance(e.upper, cst.Name)
                       for e in (rows, cols)) or rows.upper.value != cols.upper.value:
                continue
            slots = plan.slots.get((cls.name.value, method.name.value)) or self._slots(cls, method, plan)
            elements[-2] = elements[-2].with_changes(slice=cst.Index(cst.parse_expression(slots)))
            elements[-1] = elements[-1].with_changes(slice=cols.with_changes(
                upper=cst.parse_expression(f"{KEY_SLOTS}(self, {slots})")))
            plan.replace[subscript] = subscript.with_changes(slice=elements)
            plan.masks += 1
            plan.key_slots = True
            self.record_edit(subscript, f"rows of `{code_of(subscript.value).strip()}` picked by the positions "
                                        f"(`{slots}`), a column for every key slot, instead of the square cut at "
                                        f"`{rows.upper.value}`")

    # -- triangular masks built inline for the new rows and the key length ---------------------------------
    def _plan_inline_masks(self, cls: cst.ClassDef, method: cst.FunctionDef, plan: _Plan) -> None:
        """`torch.full((Q, K), v).triu(K - Q + 1)` (or `.tril(K - Q)`, or `torch.triu(x, diagonal=...)`): the rows
        of the newest Q tokens against K keys, built per call. Its diagonal counts the rows' positions from the key
        length, which is the buffer length in a compiled Decode; the positions themselves give the same rows."""
        for call in calls_in(method):
            found = _triangle(call)
            if found is None:
                continue
            base, upper, offset, diagonal = found
            slots = plan.slots.get((cls.name.value, method.name.value)) or self._slots(cls, method, plan)
            columns = f"torch.arange({offset.key}, device={slots}.device)"
            # triu keeps column c of row r where c >= position + k; tril where c <= position + k.
            dropped = "<" if upper else ">"
            shift = f" + {offset.k}" if offset.k else ""
            plan.replace[call] = cst.parse_expression(
                f"{code_of(base)}.masked_fill({columns} {dropped} {slots}[:, None]{shift}, 0)")
            plan.masks += 1
            self.record_edit(call, f"the triangle of `{code_of(base)}` cut at the positions (`{slots}`) instead of at "
                                   f"the diagonal `{code_of(diagonal)}` counted from the key length")

    # -- the 4-D masks built by library helpers, in the model's forward -----------------------------------
    def _plan_helper_masks(self, cls: cst.ClassDef, method: cst.FunctionDef, plan: _Plan) -> None:
        calls = [(stmt, *found) for stmt in nodes_of_type(method, cst.SimpleStatementLine)
                 if (found := mask_helper_call(stmt))]
        if not calls:
            return
        where = f"{cls.name.value}.{method.name.value}"
        if find_method(cls, "__init__") is None:
            plan.problems.append((method, f"`{where}` builds the mask with a helper, and `{cls.name.value}` has no "
                                          "`__init__` to build the mask buffer in"))
            return
        if any(a.keyword is not None and a.keyword.value == "sliding_window"
               for _, _, call in calls for a in call.args):
            plan.problems.append((calls[0][0], f"`{where}` builds a sliding-window mask with a helper"))
            return
        self._slots(cls, method, plan)  # positions are passed down to it when it has none
        buffer = plan.mask_buffers.setdefault(
            cls.name.value, "causal_mask" if "causal_mask" not in self_attributes(cls) else "graphmode_causal_mask")
        positions = THREADED if THREADED in {p.name.value for p in method.params.params} or not self._off_module \
            else f"{SLOTS_OFF_MODULE}(self)[None]"
        for stmt, target, call in calls:
            plan.replace[stmt] = cst.parse_statement(
                f"{target} = {MASK_ROWS}(self.{buffer}, {positions})\n").with_changes(
                leading_lines=[*stmt.leading_lines, _comment("the causal mask's rows for these positions, "
                                                             "computed per call.")])
            plan.masks += 1
            plan.helpers.add(code_of(call.func))
            self.record_edit(stmt, f"`{code_of(call.func)}` replaced by rows of `self.{buffer}`")


def _line_limit(code: str) -> int:
    """The file's own line length: the 99th percentile of its line lengths (a few URLs or tables in docstrings run
    past any limit the code keeps to), and never below 79."""
    lengths = sorted(len(line) for line in code.splitlines() if line.strip())
    return max(79, lengths[int(0.99 * (len(lengths) - 1))] if lengths else 0)


class _Apply(Transformer):
    def __init__(self, plan: _Plan, threading: Threading, wrapped: set[cst.Call]) -> None:
        self.plan, self.threading, self.wrapped = plan, threading, wrapped
        self._classes: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        name = self._classes.pop()
        init = find_method(updated_node, "__init__")
        lines = []
        if name in self.plan.init:
            key_dim, value_dim = self.plan.init[name]
            dims = f"seq_dim={key_dim}" + (f", value_seq_dim={value_dim}" if value_dim != key_dim else "")
            lines.append(cst.parse_statement(
                f"self.kv_cache = {BUFFERS_CLASS}({dims})\n").with_changes(
                leading_lines=[_comment("keys and values of every position, written in place; sized by "
                                        "setup_caches.")]))
        if name in self.plan.mask_buffers:
            lines.append(cst.parse_statement(f"self.{self.plan.mask_buffers[name]} = {MASK_CLASS}()\n").with_changes(
                leading_lines=[_comment("the causal mask for every position, built once by setup_caches.")]))
        if not lines or init is None or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node  # a cache class without __init__ in this file: not handled yet (see FINDINGS)
        new_init = init.with_changes(body=init.body.with_changes(body=[*init.body.body, *lines]))
        body = [new_init if s is init else s for s in updated_node.body.body]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not self._classes or (self._classes[-1], original_node.name.value) not in self.threading.params:
            return updated_node
        params = updated_node.params
        added = cst.Param(cst.Name(THREADED), default=cst.Name("None"),
                          equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        if params.kwonly_params or isinstance(params.star_arg, cst.Param):
            params = params.with_changes(kwonly_params=_append(params.kwonly_params, added))
        else:
            params = params.with_changes(params=_append(params.params, added))
        return updated_node.with_changes(params=params)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self.threading.calls \
                or any(a.keyword is not None and a.keyword.value == THREADED for a in original_node.args):
            return self.plan.replace.get(original_node, updated_node)
        arg = cst.Arg(cst.Name(THREADED), keyword=cst.Name(THREADED),
                      equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        args = _append(updated_node.args, arg)
        if original_node in self.wrapped and len(args) > 1 and isinstance(args[-2].comma, cst.Comma) \
                and not isinstance(args[-2].comma.whitespace_after, cst.ParenthesizedWhitespace):
            # A hanging indent, four spaces in from the statement.
            args[-2] = args[-2].with_changes(comma=args[-2].comma.with_changes(
                whitespace_after=cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace("    "))))
        return updated_node.with_changes(args=args)

    def on_leave(self, original_node, updated_node):
        updated = super().on_leave(original_node, updated_node)
        if original_node in self.plan.drop:  # the positions may be counted right after a statement now dead
            return self.plan.derive.get(original_node, cst.RemoveFromParent())
        if original_node in self.plan.derive:
            return cst.FlattenSentinel([self.plan.replace.get(original_node, updated), self.plan.derive[original_node]])
        if isinstance(original_node, cst.Call):
            return updated
        return self.plan.replace.get(original_node, updated)


def _append(items, new):
    """The items with `new` after them, in the list's own layout: one per line when the list is written so (the
    new item then takes the last one's trailing comma), else after ", "."""
    items = list(items)
    if not items:
        return [new]
    last = items[-1]
    if isinstance(last.comma, cst.Comma) and len(items) > 1 and isinstance(items[-2].comma, cst.Comma):
        items[-1] = last.with_changes(comma=items[-2].comma)
        return [*items, new.with_changes(comma=last.comma)]
    items[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [*items, new]
