"""Gives the model separate Prefill and Decode entry points.

`prefill(tokens, input_pos)` and `decode(tokens, input_pos)` both call `forward` on the static path; only `decode`
is compiled. Decode feeds one token per sequence and leaves the optional arguments at their defaults, so Dynamo
settles the branches only Prefill takes while it traces, and the graph holds Decode's path alone:

    if seqlen > 1: ...             -> not traced (seqlen is 1 in Decode)
    if past_key_values is None: X  -> X traced (Decode passes no cache argument)

No copy of `forward`'s body is made (a fix to `forward` is a fix to both entries), except for a decorated `forward`
(`@torch.inference_mode()`, Meta's reference code): called from `decode`, its decorator would go into the compiled
graph, so there `decode` holds its body with those branches folded away. Otherwise the branches are found only to
say in the design which ones Decode settles, and to see whether `forward` ends in `return logits, cache`, whose
cache `decode` then leaves behind (`[0]`) once it lives in buffers.

A `forward` whose parameters all have defaults (Hugging Face's `input_ids=None, position_ids=None, ...`)
gets entries that call it by keyword instead: `forward(input_ids=..., position_ids=input_pos.unsqueeze(0),
use_cache=False, return_dict=False)[0]`, once the cache lives in buffers. Every branch on those Python
values is settled while Dynamo traces, so no copy is needed.
"""
from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider

from graphmode.transforms.codemods.base import GraphCodemod
from graphmode.transforms.codemods.lib.call_graph import THREADED
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import BUFFERS_CLASS, BUILT_TABLES, CACHE_BUFFERS, CACHE_CLASS, \
    MASK_CLASS, PADDED_ROWS, RESIZE, SETUP, SLOTS, STATIC_PATH, TABLE_BUFFERS
from graphmode.transforms.codemods.lib.module import append_to_init, defined_at_top, insert_after_imports
from graphmode.transforms.cstutil import POSITION_TENSOR, find_method, is_docstring, names_in
from graphmode.transforms.dispatch import Transformer
from graphmode.transforms.vocabulary import TOKEN_PARAM_NAMES

_ENTRY_NAMES = ("prefill", "decode")
FITS = "graphmode_fits"  # the helper `prefill` sizes the static buffers with, or refuses requests they cannot hold
ROW_POSITIONS = "graphmode_row_positions"  # each row's positions from a padding mask, as generate() counts them
_PADDING = "attention_mask"  # the 2-D padding mask the keyword entries take where the mask rows apply it
# The helpers whose buffers `setup_caches` allocates or checks (static_kv_cache, carried_cache, cache_object,
# sliced_kv_cache and sliced_tables insert them); static_rotary writes a `graphmode_resize` method or a call of
# BUILT_TABLES instead.
_SIZED_BY_SETUP = (CACHE_CLASS, BUFFERS_CLASS, MASK_CLASS, CACHE_BUFFERS, TABLE_BUFFERS)


def _sequence_length_names(body: list[cst.BaseStatement], tokens: str) -> set[str]:
    """Names bound to the token tensor's second dimension (`bsz, seqlen = tokens.shape`, `tokens.size(1)`)."""
    found: set[str] = set()
    for stmt in body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)):
            continue
        assign = stmt.body[0]
        value, target = assign.value, assign.targets[0].target
        code = cst.Module([]).code_for_node(value).replace(" ", "")
        if code in (f"{tokens}.shape", f"{tokens}.size()") and isinstance(target, cst.Tuple) \
                and len(target.elements) == 2 and isinstance(target.elements[1].value, cst.Name):
            found.add(target.elements[1].value.value)
        elif code in (f"{tokens}.shape[1]", f"{tokens}.size(1)", f"{tokens}.shape[-1]", f"{tokens}.size(-1)") \
                and isinstance(target, cst.Name):
            found.add(target.value)
    return found


class _Facts:
    """What is known to hold in every Decode call."""

    def __init__(self, length_names: set[str], omitted: dict[str, cst.BaseExpression]) -> None:
        self.length_names = length_names
        self.omitted = omitted  # parameter -> its default, for parameters Decode does not take

    def evaluate(self, test: cst.BaseExpression) -> bool | None:
        """True/False when the test has one value in every Decode call, else None."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            inner = self.evaluate(test.expression)
            return None if inner is None else not inner
        if isinstance(test, cst.BooleanOperation):
            left, right = self.evaluate(test.left), self.evaluate(test.right)
            if isinstance(test.operator, cst.And):
                return False if False in (left, right) else (True if left and right else None)
            return True if True in (left, right) else (False if left is False and right is False else None)
        if isinstance(test, cst.Name) and test.value in self.omitted:
            default = self.omitted[test.value]
            if isinstance(default, cst.Name) and default.value in ("True", "False", "None"):
                return default.value == "True"
        if _is_position_tensor_check(test):
            return True  # the entries always pass a position tensor
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name):
            return self._compare(test.left.value, test.comparisons[0])
        return None

    def _compare(self, name: str, target: cst.ComparisonTarget) -> bool | None:
        op, right = target.operator, target.comparator
        if name in self.omitted and isinstance(right, cst.Name) and right.value == "None":
            default = self.omitted[name]
            is_none = isinstance(default, cst.Name) and default.value == "None"
            if isinstance(op, cst.Is):
                return is_none
            if isinstance(op, cst.IsNot):
                return not is_none
        if name in self.length_names and isinstance(right, cst.Integer):
            value = int(right.value)
            table = {cst.GreaterThan: 1 > value, cst.GreaterThanEqual: 1 >= value, cst.LessThan: 1 < value,
                     cst.LessThanEqual: 1 <= value, cst.Equal: 1 == value, cst.NotEqual: 1 != value}
            return table.get(type(op))
        return None


def _is_position_tensor_check(test: cst.BaseExpression) -> bool:
    """`isinstance(input_pos, torch.Tensor)`, the guard static_positions leaves for callers that pass an int."""
    return isinstance(test, cst.Call) and cst.Module([]).code_for_node(test).replace(" ", "") == \
        f"isinstance({POSITION_TENSOR},torch.Tensor)"


class _FoldBranches(Transformer):
    def __init__(self, facts: _Facts) -> None:
        self.facts = facts
        self.folded: list[cst.If] = []

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        value = self.facts.evaluate(updated_node.test)
        if value is None:
            return updated_node
        self.folded.append(original_node)
        if value:
            kept = list(updated_node.body.body)
        elif isinstance(updated_node.orelse, cst.Else):
            kept = list(updated_node.orelse.body.body)
        elif isinstance(updated_node.orelse, cst.If):
            return updated_node.orelse.with_changes(leading_lines=updated_node.leading_lines)
        else:
            return cst.RemoveFromParent()
        if not kept:
            return cst.RemoveFromParent()
        kept[0] = kept[0].with_changes(leading_lines=[*updated_node.leading_lines, *kept[0].leading_lines])
        return cst.FlattenSentinel(kept)


class SplitDecode(GraphCodemod):
    NAME = "split_decode"
    SIZES_BUFFERS = True
    TITLE = "Split Prefill and Decode entry points"
    DESCRIPTION = (
        "Adds `prefill(...)`, which stays eager, and `decode(...)`, one token per sequence with the optional "
        "arguments at their defaults; both call `forward` on the static path, and only `decode` is compiled, so "
        "the branches only Prefill takes are settled while Dynamo traces it. `forward` itself is unchanged."
    )
    SKILL = "prefill-decode-split"
    FIXES = frozenset({"GM401"})

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return options.entry_class is not None and options.entry_class in words
    # `decode` neither takes nor returns a cache and is handed positions as a tensor: without the planned rewrites
    # of the cache, the positions, the mask and the tables it sliced, the entries would run a model that still
    # expects them carried or as Python ints.
    ASSUMES = ("static_positions", "static_mask", "static_kv_cache", "sliced_kv_cache", "sliced_tables",
               "cache_object", "carried_cache", "added_cache")

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # Once the KV cache lives in module buffers, returning it from `decode` only costs: a compiled graph
        # rebuilds every returned view of a buffer it mutated, on every call.
        code = self.code_of_module(tree)
        # Mask rows of the slots come only with a static cache: in this file, or in the module whose layers this
        # file's model stacks (cache_object, Options.static_caches_in).
        self._cache_in_buffers = "StaticKVCache(" in code or ".index_copy_(" in code or f"{PADDED_ROWS}(" in code
        self._takes_padding = f"{PADDED_ROWS}(" in code  # cache_object's mask rows apply a 2-D padding mask
        # The cache writes and mask rows read the slots from the entries' own call (cache_object, where the model
        # names no positions of its own): the entries need none of forward's parameters to pass them.
        self._reads_slots = f"{SLOTS}(" in code
        self._padded_entries = False  # the entries take that mask (and call ROW_POSITIONS)
        module = super().transform_module_impl(tree)
        if not any("entry points added" in e.summary for e in self.edits):
            return module
        sized = any(defined_at_top(module, name) for name in _SIZED_BY_SETUP) \
            or f"def {RESIZE}(" in self.code_of_module(module) or f"{BUILT_TABLES}(" in self.code_of_module(module)
        if sized and not defined_at_top(module, FITS):
            module, checked = _prefill_checks_sizes(module, self.options.entry_class)
            if checked:
                module = insert_after_imports(module, helper_statements(FITS))
        if not defined_at_top(module, STATIC_PATH):
            module = insert_after_imports(module, helper_statements(STATIC_PATH))
        if self._padded_entries and not defined_at_top(module, ROW_POSITIONS):
            module = insert_after_imports(module, helper_statements(ROW_POSITIONS))
        return module

    def passes_over(self, qualname: str) -> bool:
        return not self.source.classes_in_functions  # the entries are made from the class, in leave_ClassDef

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value != self.options.entry_class:
            return updated_node
        forward = find_method(original_node, "forward")
        if forward is None or any(find_method(original_node, name) for name in _ENTRY_NAMES):
            return updated_node  # nothing to split, or already split (a second run changes nothing)
        # Keyword-only parameters (after a bare `*`) are passed by keyword like any parameter with a default.
        params = [*forward.params.params, *forward.params.kwonly_params]
        refusal = self._refusal(forward, params)
        if refusal:
            self.record_manual(forward, refusal)
            return updated_node
        # A parameter with a default that the harness passes as the positions every step is an input of both
        # entries, never bound to its default; it is passed by keyword (earlier defaults stay defaults).
        positions = {p.name.value: _POSITION_ARGUMENTS[self._position_layout(p)] for p in params[1:]
                     if p.default is not None and self._position_layout(p) is not None}
        # Causal-mask rows the harness passes are built from the positions, from one buffer made in `__init__`.
        rows = {p.name.value: role for p in params[1:]
                if (role := self.options.role_of(p.name.value) or "").startswith(_MASK_ROWS_ROLE)}
        refused = updated_node  # what a refusal below returns: the class without the rows buffer
        if rows:
            if find_method(original_node, "__init__") is None:
                self.record_manual(forward, f"the harness passes causal-mask rows as `{next(iter(rows))}`, and "
                                            f"`{original_node.name.value}` has no `__init__` to build them in; write "
                                            "the entry points by hand")
                return updated_node
            updated_node = _with_rows_buffer(updated_node, rows, params[1].name.value, positions)
        if self._cache_in_buffers and not self._reads_slots and not positions \
                and not any(self._position_layout(p) for p in params[1:]):
            self.record_manual(forward, "the KV cache is written in place at the positions, and `forward` takes no "
                                        "positions (the model counts them from the cache it is handed); entries "
                                        "without them would write every Decode step into slot 0, so none are added")
            return refused
        required = [p.name.value for p in params[1:] if p.default is None and p.name.value not in positions]
        if not required:
            entries = self._keyword_entries(forward, params)
            if entries is None:
                self.record_manual(forward, "every parameter of `forward` has a default and the token and position "
                                            "inputs are not known (or the cache is not in buffers yet); write "
                                            "`prefill`/`decode` by hand")
                return refused
            self.record_insertion_after(forward, "`prefill` and `decode` entry points added; they call `forward` "
                                                 "with Decode's keywords")
            return _add_after_forward(updated_node, entries)
        omitted = {p.name.value: p.default for p in params[1:]
                   if p.default is not None and p.name.value not in positions}
        return _add_after_forward(updated_node, self._positional_entries(forward, required, omitted, positions))

    def _refusal(self, forward: cst.FunctionDef, params: list[cst.Param]) -> str | None:
        """Why `forward` gets no entries, in the words of the item left for a person; None when it can have them."""
        # `**kwargs` (`**loss_kwargs`, ...) stays empty: the entries pass named parameters only. It is refused only
        # where the harness was seen passing something through it that `forward` reads (generate() passes
        # `return_dict=True` into the `**kwargs` of a forward that never looks at them: dropping it changes nothing).
        # `return_dict` only picks the output's container (transformers' `can_return_tuple` takes it out before
        # `forward` runs), and the entries hand on the logits of either: it is never an input they lose.
        named = {p.name.value for p in params}
        swallowed = [name for name, _ in self.options.entry_roles if name not in named and name != "return_dict"]
        star = forward.params.star_kwarg
        read_kwargs = isinstance(star, cst.Param) and star.name.value in names_in(forward.body)
        if len(params) < 2 or isinstance(forward.params.star_arg, cst.Param) \
                or (read_kwargs and swallowed) \
                or not isinstance(forward.body, cst.IndentedBlock) \
                or any(p.default is None for p in forward.params.kwonly_params):
            return ("`forward` takes *args, required keyword-only arguments or no inputs, or the harness passes it "
                    "arguments through **kwargs that it reads; write the entry points by hand")
        if self.options.recomputes_sequence and not self._cache_in_buffers:  # added_cache gave it none
            return _NO_CACHE_REASON
        return self._unfit_inputs(params) or self._dropped_cache(params) or None

    def _positional_entries(self, forward: cst.FunctionDef, required: list[str], omitted: dict,
                            positions: dict[str, str]) -> list[cst.FunctionDef]:
        """`prefill` and `decode` that take the required inputs (and the positions), calling `forward` (or, for a
        decorated `forward`, a copy of its body); the branches Decode settles are named in the edits."""
        body = list(forward.body.body)
        if body and is_docstring(body[0]):
            body = body[1:]  # forward's docstring describes forward
        # The branches Decode settles (one token per sequence, the optional arguments at their defaults): the design
        # names them, the return Decode reaches is read from what is left, and a decorated forward's copy drops them.
        fold = _FoldBranches(_Facts(_sequence_length_names(body, required[0]), omitted))
        decode_body = list(forward.body.with_changes(body=body).visit(fold).body)
        folded = sorted(fold.folded, key=self._starts_at)
        settled = [cst.Module([]).code_for_node(node.test) for node in folded]
        how = "folded out of the copy in `decode`" if forward.decorators else "`decode` settles while Dynamo traces it"
        for node, test in zip(folded, settled):
            self.record_edit(node, f"branch {how}: {test}")
        self.record_insertion_after(forward, "`prefill` and `decode` entry points added")
        signature = ", ".join(["self", *required, *([POSITION_TENSOR] if positions else [])])
        slots = POSITION_TENSOR if positions else None
        call = f"self.forward({', '.join([*required, *(f'{name}={value}' for name, value in positions.items())])})"
        if forward.decorators:
            return _copied_entries(forward, decode_body, omitted, positions, signature, call, self._cache_in_buffers,
                                   self.options.prefill_resets, slots)
        # The branches tracing settles are in the edits (`graphmode fix` lists them), not in Decode's docstring: it
        # says what a user of the entry needs.
        logits_only = self._cache_in_buffers and _returns_logits_and_cache(decode_body)
        return _entry_methods(signature, call, "", f"return {call}" + ("[0]" if logits_only else ""),
                              self.options.prefill_resets, slots)

    def _starts_at(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.get_metadata(PositionProvider, node).start
        return start.line, start.column

    def _unfit_inputs(self, params: list[cst.Param]) -> str | None:
        """Why the entries' (tokens, positions) cannot feed `forward`'s required inputs, from how the harness really
        calls it; None when they can, or when that was not recorded."""
        if not self.options.entry_roles:
            return None
        for param in [p for p in params[2:] if p.default is None]:
            role = self.options.role_of(param.name.value)
            if role == "positions:int":
                return (f"the positions are still a Python int (`{param.name.value}`): the rewrite to a position "
                        "tensor was not applied (see its item), so a compiled Decode would take a new constant every "
                        "step")
            if role is not None and role not in _POSITION_ARGUMENTS and not role.startswith(_MASK_ROWS_ROLE):
                return (f"`forward` requires `{param.name.value}`, which the harness passes as {role} every Decode "
                        "step; the entries pass only the tokens and the positions, so write `prefill`/`decode` by "
                        "hand")
        return None

    def _dropped_cache(self, params: list[cst.Param]) -> str | None:
        """Why entries would lose the cache: the harness carries it through `forward` every Decode step and no
        rewrite moved it into buffers, so entries that pass only tokens and positions would attend to the new
        token alone."""
        carried = [p.name.value for p in params[1:] if self.options.role_of(p.name.value) == "state"]
        if carried and not self._cache_in_buffers:
            return (f"the harness carries `{carried[0]}` into `forward` every Decode step (the KV cache) and it was "
                    "not moved into static buffers (see the cache item on this file); entries without it would "
                    "attend to the new token alone, so none are added")
        return None

    def _position_layout(self, param: cst.Param) -> str | None:
        """How a parameter carries the positions Decode writes, from how the harness called `forward` when that
        was recorded ("positions" 1-D, "positions:2d" as position_ids), else only by the name the adapted
        contract itself uses (`input_pos`)."""
        role = self.options.role_of(param.name.value)
        if role is not None:
            return role if role in _POSITION_ARGUMENTS else None
        if param.name.value == THREADED and self._cache_in_buffers:
            return "positions:2d"  # threaded down by the cache rewrite, which reads them as (B, T) position_ids
        return "positions" if param.name.value == POSITION_TENSOR else None

    def _keyword_entries(self, forward: cst.FunctionDef, params: list[cst.Param]) -> list[cst.FunctionDef] | None:
        """Entries for a forward whose parameters all have defaults (Hugging Face style): they pass the tokens and
        positions by keyword and leave the rest at their defaults; Dynamo settles every branch on those Python
        values while tracing, so no body needs copying. Only once the cache lives in buffers: the entries pass
        no cache in and take none out."""
        names = [p.name.value for p in params[1:]]
        roles = dict(self.options.entry_roles)
        # What the harness passed wins over the usual names (a model may call its ids `src` or `x`).
        tokens = next((n for n in names if roles.get(n) == "tokens"), None) \
            or next((n for n in names if n in TOKEN_PARAM_NAMES), None)
        # The positions go to every parameter that takes them (`position_ids` for rotary tables, `cache_position`
        # for the cache slots and mask rows), unless the harness was seen passing them to some.
        passed = {n: _POSITION_ARGUMENTS[roles[n]] for n in names if roles.get(n) in _POSITION_ARGUMENTS} \
            or {n: value for n, value in _POSITION_KEYWORDS.items() if n in names}
        if tokens is None or not (passed or self._reads_slots) or not self._cache_in_buffers:
            return None
        passed.update({n: _rows_argument(roles[n], tokens) for n in names
                       if roles.get(n, "").startswith(_MASK_ROWS_ROLE)})
        signature, about = f"self, {tokens}, {POSITION_TENSOR}", ""
        padding = None
        if self._takes_padding and "position_ids" in passed:
            # Left padding: the rows share the slots (`input_pos`), each with positions of its own, and the mask
            # rows hide the slots the caller's 2-D mask holds 0 for. The mask goes to those rows alone (through
            # the switch), not to `forward`, whose own code may branch on its values.
            passed["position_ids"] = f"{ROW_POSITIONS}({POSITION_TENSOR}, {_PADDING})"
            signature += f", {_PADDING}=None"
            padding, self._padded_entries = _PADDING, True
            about = f"\n`{_PADDING}` (rows, slots), optional: 0 at left-padded slots, at the length `setup_caches` set."
        keywords = [f"{tokens}={tokens}", *(f"{name}={value}" for name, value in passed.items())]
        keywords += [f"{name}={value}" for name, value in _DECODE_KEYWORDS.items() if name in names]
        call = f"self.forward({', '.join(keywords)})" + ("[0]" if "return_dict" in names else "")
        return _entry_methods(signature, call, about, f"return {call}", self.options.prefill_resets, POSITION_TENSOR,
                              padding)


# How the positional entries pass their 1-D position tensor to a parameter, by the layout the harness used.
_POSITION_ARGUMENTS = {"positions": POSITION_TENSOR, "positions:2d": f"{POSITION_TENSOR}.unsqueeze(0)"}
_NO_CACHE_REASON = (
    "Decode is given the whole sequence every step (the harness passes tokens that grow by one each step): the "
    "model keeps no KV cache, so every step recomputes all positions and changes shape, and no static graph can "
    "replay it. Entry points are not added; the model needs a KV cache first (static buffers per attention "
    "module written at a position tensor, and mask rows for the positions)")
_MASK_ROWS_ROLE = "mask_rows"
_ROWS_BUFFER = "graphmode_causal_rows"


def _rows_argument(role: str, tokens: str) -> str:
    """The causal-mask rows for the positions, in the layout the harness passed them ("mask_rows:<dims>d:<S>")."""
    dims = int(role.split(":")[1].rstrip("d"))
    rows = f"self.{_ROWS_BUFFER}[{POSITION_TENSOR}]"  # (tokens, S)
    if dims == 2:
        return rows
    lead = ", ".join(["None"] * (dims - 2))
    sizes = ", ".join([f"{tokens}.shape[0]", *["1"] * (dims - 3), "-1", "-1"])
    return f"{rows}[{lead}].expand({sizes})"


# How the keyword entries pass the position tensor, by the name forward gives it.
_POSITION_KEYWORDS = {"position_ids": f"{POSITION_TENSOR}.unsqueeze(0)", "cache_position": POSITION_TENSOR}
# Fixed by the keyword entries: the cache is in buffers, and a tuple's first item is the logits.
_DECODE_KEYWORDS = {"use_cache": "False", "return_dict": "False"}


def _entry_methods(signature: str, prefill_call: str, decode_about: str, decode_statement: str,
                   resets: tuple[str, ...] = (), slots: str | None = None,
                   padding: str | None = None) -> list[cst.FunctionDef]:
    """`prefill` (calls the `resets` methods, then returns prefill_call) and `decode` (its docstring goes on with
    decode_about; its body is decode_statement), parsed inside a class so the docstrings get the method
    indentation. Both enter the static path with the slots they write (`slots`, where they take positions) and
    the padding mask they take (`padding`). The docstrings are written on long lines: transforms.output.line_wrap fills
    them to the file's own limit."""
    switch = _switch(slots, padding)
    about = " ".join(["one new token per sequence; compile this alone.", decode_about.lstrip(" ")]).rstrip(" ")
    about = about.replace(" \n", "\n")
    # A line of its own goes at the method's indentation.
    about = "\n".join(f"        {line}" if number and line else line for number, line in enumerate(about.split("\n")))
    setup = "".join(f"        self.{name}()  # as the harness does before every Prefill\n" for name in resets)
    return list(cst.parse_statement(
        "class Entries:\n"
        f"    def prefill({signature}):\n"
        f'        """Prefill entry (added by graphmode): the whole prompt, run eagerly."""\n'
        f"{setup}"
        f"        with {switch}:\n"
        f"            return {prefill_call}\n"
        f"\n"
        f"    def decode({signature}):\n"
        f'        """Decode entry (added by graphmode): {about}"""\n'
        f"        with {switch}:\n"
        f"            {decode_statement}\n"
    ).body.body)


def _prefill_checks_sizes(module: cst.Module, entry_class: str | None) -> tuple[cst.Module, bool]:
    """`graphmode_fits(self, tokens, input_pos)` first in the entry class's `prefill`, where it takes positions, and
    the sizing call `setup_caches` before it, unless the class has one of its own."""
    body, checked = list(module.body), False
    for index, stmt in enumerate(body):
        if not (isinstance(stmt, cst.ClassDef) and stmt.name.value == entry_class):
            continue
        prefill = find_method(stmt, "prefill")
        names = [p.name.value for p in prefill.params.params] if prefill is not None else []
        if POSITION_TENSOR not in names or len(names) < 3:
            break
        check = cst.parse_statement(f"{FITS}(self, {names[1]}, {POSITION_TENSOR})\n")
        docstring, *rest = prefill.body.body
        prefill = prefill.with_changes(body=prefill.body.with_changes(body=[docstring, check, *rest]))
        setup = [] if find_method(stmt, SETUP) is not None else [_setup_method().with_changes(
            leading_lines=[line.deep_clone() for line in prefill.leading_lines])]  # prefill's own stay its own
        members = []
        for member in stmt.body.body:
            if isinstance(member, cst.FunctionDef) and member.name.value == "prefill":
                members += [*setup, prefill]
            else:
                members.append(member)
        body[index] = stmt.with_changes(body=stmt.body.with_changes(body=members))
        checked = True
    return module.with_changes(body=body), checked


def _setup_method() -> cst.FunctionDef:
    """The entry's sizing call (gpt-fast's `setup_caches`): the static buffers are allocated here, not with the
    model, so every use of the model that never takes the static path carries none of them."""
    return cst.parse_statement(
        "class Entries:\n"
        f"    def {SETUP}(self, max_batch_size=1, max_seq_length=None):\n"
        '        """Sizes the static path\'s buffers (added by graphmode); default: the config\'s limit."""\n'
        f"        {STATIC_PATH}.setup(self, max_batch_size, max_seq_length)\n"
    ).body.body[0]


def _switch(slots: str | None = None, padding: str | None = None) -> str:
    """`GraphmodeStaticPath(self, ...)`, the `with` item the entries enter the static path with: the slots they write
    and the padding mask they take, where they do."""
    return f"{STATIC_PATH}(self{''.join(f', {a}' for a in (slots, padding) if a)})"


def _with_rows_buffer(cls: cst.ClassDef, rows: dict[str, str], tokens: str, positions: dict[str, str]) -> cst.ClassDef:
    """The class with the causal mask whose rows the harness passes built once in `__init__`; `positions` gains the
    argument each entry passes for those rows."""
    size = int(next(iter(rows.values())).rsplit(":", 1)[1])
    positions.update({name: _rows_argument(role, tokens) for name, role in rows.items()})
    return append_to_init(cls, [cst.parse_statement(
        f'self.register_buffer("{_ROWS_BUFFER}", torch.ones({size}, {size}, dtype=torch.bool).tril(), '
        f'persistent=False)\n')], "the causal mask whose rows the harness passes, built once.")


def _add_after_forward(cls: cst.ClassDef, entries: list[cst.BaseStatement]) -> cst.ClassDef:
    new_body = []
    for stmt in cls.body.body:
        new_body.append(stmt)
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "forward":
            # A blank line of its own for each: a node held in two places makes the chain parse the text again.
            new_body += [entry.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) for entry in entries]
    return cls.with_changes(body=cls.body.with_changes(body=new_body))


def _copied_entries(forward: cst.FunctionDef, decode_body: list[cst.BaseStatement], omitted: dict,
                    positions: dict[str, str], signature: str, call: str, cache_in_buffers: bool,
                    resets: tuple[str, ...], slots: str | None) -> list[cst.FunctionDef]:
    """The entries of a decorated `forward` (`@torch.inference_mode()`): called from `decode`, its decorator would go
    into the compiled graph with it (inference mode cannot be traced over the cache buffers: "Cannot set
    version_counter for inference tensor"), so `decode` holds a copy of its body, the branches only Prefill takes
    folded away, with the defaults it reads bound first."""
    if cache_in_buffers:
        decode_body = _return_logits_only(decode_body)
    bindings = [cst.parse_statement(f"{name} = {cst.Module([]).code_for_node(default)}\n")
                for name, default in omitted.items()
                if name in names_in(cst.Module(body=decode_body)) and not _assigned_first(decode_body, name)]
    bindings += [cst.parse_statement(f"{name} = {value}\n") for name, value in positions.items()
                 if name != value and name in names_in(cst.Module(body=decode_body))]
    decorators = ", ".join(f"`@{cst.Module([]).code_for_node(d.decorator)}`" for d in forward.decorators)
    prefill, decode = _entry_methods(signature, call, (
        f"The body of `forward` with the branches only Prefill takes folded away: called instead, `forward` would "
        f"bring its decorators ({decorators}) into the compiled graph."), "pass", resets, slots)
    docstring = decode.body.body[0]
    block = cst.With(items=[cst.WithItem(cst.parse_expression(_switch(slots)))],
                     body=cst.IndentedBlock(body=[*bindings, *decode_body]))
    return [prefill, decode.with_changes(body=decode.body.with_changes(body=[docstring, block]))]


def _return_logits_only(body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """`return logits, tuple(presents)` -> `return logits` when everything after the first value is the cache."""
    if not _returns_logits_and_cache(body):
        return body
    last = body[-1]
    comment = cst.EmptyLine(indent=True, comment=cst.Comment(
        "# graphmode: the cache lives in buffers now; Decode returns the logits alone."))
    return [*body[:-1], last.with_changes(body=[cst.Return(value=last.body[0].value.elements[0].value)],
                                          leading_lines=[*last.leading_lines, comment])]


def _assigned_first(body: list[cst.BaseStatement], name: str) -> bool:
    """True when the first top-level statement mentioning `name` is a plain `name = ...`."""
    for stmt in body:
        if name not in names_in(stmt):
            continue
        return (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)
                and isinstance(stmt.body[0].targets[0].target, cst.Name)
                and stmt.body[0].targets[0].target.value == name and name not in names_in(stmt.body[0].value))
    return False


_CACHE_WORDS = ("present", "past", "cache", "kv")


def _returns_logits_and_cache(body: list[cst.BaseStatement]) -> bool:
    """Whether the body ends in `return logits, <the cache>...`: a tuple whose every value after the first names
    the cache."""
    last = body[-1] if body else None
    if not (isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)
            and isinstance(last.body[0].value, cst.Tuple) and len(last.body[0].value.elements) > 1):
        return False
    _, *rest = (e.value for e in last.body[0].value.elements)
    return all(any(w in n.lower() for n in names_in(r) for w in _CACHE_WORDS) for r in rest)
