"""The static path beside the model's own code: what the codemods changed goes beside the original, never in its place.

The codemods rewrite functions into their static-graph form (buffers written at a position tensor, mask rows,
entries). Run in place of the original code, that form changes what every other caller gets: a caller's cache,
its padding mask, its batch size, beam search's reordering. So after the chain, every function a codemod changed
gets its original body back, and the changed statements go beside the ones they replace, in one of three ways:

- Only parameters were renamed (`start_pos` -> `input_pos`): nothing is added. The original body is the static path
  too, handed what the entries pass (a position tensor where its callers pass an int); the calls in it reach the
  static code of what they call, each method asking the switch for itself.
- A method whose rewrite differs in a few runs of statements (_MOST_FORKS) keeps one body, with only those runs
  forked on the switch; the static statements come first, the original's follow in `else`, as written, or after
  the fork where the static statements return:

      def forward(self, x, start_pos: int):
          if graphmode_static_path(self):
              k, v = self.kv_cache.update(start_pos, k, v)
          else:
              <the original statements, as written>
          <the statements both paths share>

  The static statements call a renamed parameter by its original name (on the static path it carries the value
  the entries pass). Where the original run is one `if`, it stays where it was written, after the static
  statements as `elif <its test>:`, or, where only the original runs it, as `if not graphmode_static_path(self) and
  <its test>:` (`_placed` has every form). graphmode's note on a fork goes at the end of its `if` line where it
  fits.
- Where more of the body differs, the rewrite becomes a twin beside the original, which hands it the call:

      def forward(self, x, past=None, position_ids=None):
          if graphmode_static_path(self):
              return self.forward_static(x, past, position_ids)
          <the original body, as written>

      def forward_static(self, x, past=None, position_ids=None):
          <the body the codemods wrote>

`graphmode_static_path` is true only inside the `prefill`/`decode` entries (`GraphmodeStaticPath`), and Dynamo reads
it as a constant of the module's state, so a compiled `decode` traces the static statements alone and every other
call runs the original. Free functions, static and class methods have no module to ask: their twin is called by
name from the static code (`f_static(...)`), and a function that calls such a twin forks or gets one of its own.
`__init__` keeps the codemods' version, which only adds the static buffers. The merged projections
(`graphmode_merged_linear`) are the model's own computation off the static path, so they go into the original body
too (merged_projections.shared_merges) and fork nowhere. Statements outside functions the chain
removed (an import only the original body uses) are put back. The scan (transforms/rules) and the line maps
(`fork_lines`, `twin_spans`) read a fork's `else` and what follows a returning static branch as the model's own code.
"""
from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.base import BaseLeaf

from graphmode.transforms.analysis.reach import SWITCH_TEST, asks_switch, leaves_static_path
from graphmode.transforms.codemods.fusions.merged_projections import shared_merges
from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import GUARD as EAGER_ONLY
from graphmode.transforms.codemods.lib.module import defined_at_top, insert_after_imports
from graphmode.transforms.cstutil import calls_in, child_fields, code_of, is_docstring, names_in, qualified_functions, \
    single_assignment, statements_only, walk
from graphmode.transforms.dispatch import Computed, Transformer
from graphmode.transforms.line_matching import carried_numbers
from graphmode.transforms.output.helper_module import imports_helper_module
from graphmode.transforms.output.line_wrap import MIN_LIMIT
from graphmode.transforms.output.tidy import without_identical_branches
from graphmode.transforms.positions import function_parts_code, module_code

SWITCH = "GraphmodeStaticPath"  # the helper the entries enter the static path with
NOTE = "# graphmode:"  # how the codemods' comments on what they wrote begin

TWIN_SUFFIX = "_static"
_KEPT_AS_CHANGED = frozenset({"__init__", "__new__", "__post_init__"})  # run once at construction: additions only


@dataclass
class _Plan:
    """What one file's pass decided, by qualified name (`Class.method`, `function`)."""

    dispatched: set[str] = field(default_factory=set)  # methods that ask the switch
    renamed: dict[str, str] = field(default_factory=dict)  # free/static/class function qualname -> twin name
    keywords: dict[str, str] = field(default_factory=dict)  # renamed parameter -> the name its dispatcher kept
    kept: set[str] = field(default_factory=set)  # rewritten only by renaming parameters: the original serves both


class _Texts:
    """The code of the nodes one pass asks about, each generated once. The statements of a changed function are
    compared (the function whole, then statement by statement, twice), counted and measured, and its body compared
    again: generated each time, that was most of the pass. A function's generation gives the code of its body and of
    the body's statements too. A node never changes, so its code is the same every time (the dicts hold the nodes,
    whose hash is their identity)."""

    def __init__(self) -> None:
        self._code: dict[cst.CSTNode, str] = {}
        self._after_leading_lines: dict[cst.CSTNode, str] = {}

    def code(self, node: cst.CSTNode) -> str:
        """`code_of(node)`."""
        text = self._code.get(node)
        if text is None:
            if type(node) is cst.FunctionDef:  # the code of its body and of their statements comes with it
                text, body, statements = function_parts_code(node)
                self._code.setdefault(node.body, body)
                for statement, code in statements.items():
                    self._code.setdefault(statement, code)
            else:
                text = code_of(node)
            self._code[node] = text
        return text

    def after_leading_lines(self, stmt: cst.BaseStatement) -> str:
        """`code_of(stmt.with_changes(leading_lines=()))`: a statement generates the blank lines and comments above
        it first (at no indentation, as they are generated alone), and nothing after them depends on them."""
        text = self._after_leading_lines.get(stmt)
        if text is None:
            leading = sum(len(code_of(line)) for line in stmt.leading_lines)
            text = self._after_leading_lines[stmt] = self.code(stmt)[leading:]
        return text

    def key(self, stmt: cst.BaseStatement) -> str:
        """The statement's code without the blank lines and comments above it, stripped: what runs compare."""
        return self.after_leading_lines(stmt).strip()


def keep_original_path(original: cst.Module, adapted: cst.Module, original_text: str | None = None,
                       method_text: Callable[[cst.CSTNode], str | None] | None = None) -> cst.Module:
    """The adapted module with every function the chain changed split into its original and its static twin.
    `original_text`: the original's code, where the caller has it (else it is generated again); `method_text`: the
    code of a method of `adapted`, where the caller has it (ParsedSource.method_text)."""
    texts = _Texts()
    # The merged projections are the model's own computation off the static path too: both paths share them.
    original = shared_merges(original, adapted, method_text)
    originals = dict(qualified_functions(original))
    changed = {q: f for q, f in qualified_functions(adapted) if q in originals and not _same(originals[q], f, texts)}
    changed = {q: f for q, f in changed.items() if q.rsplit(".", 1)[-1] not in _KEPT_AS_CHANGED}
    # Guarded eager-only statements are the same on both paths: such a function keeps its adapted form, untwinned.
    changed = {q: f for q, f in changed.items() if not _guards_only(originals[q], f, texts)}
    if not changed:
        return _put_back_statements(original, adapted)
    plan = _Plan()
    # Every renamed parameter, by the name its dispatcher keeps: a call that passes one by keyword passes it by that
    # name on the static path too (_StaticCalls), so a body renamed only there is still the original.
    kept_names = {new: old for q, f in changed.items() for new, old in renamed_parameters(originals[q].params,
                                                                                          f.params).items()}
    for qualname, function in list(changed.items()):
        if _renamed_only(originals[qualname], function, kept_names, texts):
            try:
                _merged_signature(originals[qualname].params, function.params)
            except _Unsplittable:
                del changed[qualname]
                continue
            plan.kept.add(qualname)
            plan.keywords.update(renamed_parameters(originals[qualname].params, function.params))
            del changed[qualname]
            continue
        if not _asks_switch(qualname, function):
            plan.renamed[qualname] = _twin_name(function.name.value)
            continue
        try:
            _merged_signature(originals[qualname].params, function.params)
        except _Unsplittable:
            # Left in its adapted form: no codemod removes a parameter today, so no fixture reaches this.
            del changed[qualname]
            continue
        plan.dispatched.add(qualname)
        plan.keywords.update(renamed_parameters(originals[qualname].params, function.params))
    # A function that calls a renamed twin by name needs a twin of its own, or the static path would leave it there.
    unchanged = {q: f for q, f in qualified_functions(adapted) if q in originals and q not in changed
                 and q.rsplit(".", 1)[-1] not in _KEPT_AS_CHANGED}
    while True:
        callers = {q for q, f in unchanged.items() if q not in plan.dispatched and q not in plan.renamed
                   and _calls_any(f, plan.renamed, q)}
        if not callers:
            break
        for qualname in callers:
            changed[qualname] = unchanged[qualname]
            plan.kept.discard(qualname)
            if _asks_switch(qualname, unchanged[qualname]):
                plan.dispatched.add(qualname)
            else:
                plan.renamed[qualname] = _twin_name(unchanged[qualname].name.value)
    # The original's statements a fork puts under `else:` stay as written only where one level deeper still fits the
    # file's longest line (line_wrap would wrap them otherwise): else the method becomes a twin.
    if original_text is None:
        original_text = module_code(original)
    width = max([MIN_LIMIT, *(len(line) for line in original_text.splitlines())])
    split = _Split(originals, changed, plan, width, texts)
    module = _with_notes_on_headers(adapted.visit(split), split.placed, width)
    module = _put_back_statements(original, module)
    if plan.dispatched and not defined_at_top(module, SWITCH_TEST):
        module = insert_after_imports(module, helper_statements(SWITCH_TEST))
    return module


def already_adapted(source: str) -> bool:
    """The text is graphmode's output: it imports graphmode's helper module (transforms/output/helper_module.py), or it
    defines the switch between the static path and the model's own code (that module itself, or an adapted file
    of a release that pasted the helpers into it)."""
    if imports_helper_module(source):
        return True
    return any(f"def {name}(" in source or f"class {name}:" in source for name in (SWITCH_TEST, SWITCH)) \
        and any(isinstance(s, (ast.FunctionDef, ast.ClassDef)) and s.name in (SWITCH_TEST, SWITCH)
                for s in ast.parse(source).body)


def function_spans(tree: ast.Module) -> dict[str, tuple[int, int]]:
    """Qualified name -> (first line, last line) of every function and method (decorators included)."""
    spans: dict[str, tuple[int, int]] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
                spans[prefix + stmt.name] = (first, stmt.end_lineno)
            elif isinstance(stmt, ast.ClassDef):
                walk(stmt.body, f"{prefix}{stmt.name}.")

    walk(tree.body, "")
    return spans


def twin_spans(tree: ast.Module) -> dict[str, tuple[int, int]]:
    """Qualified name of an original function -> the lines of its static twin, in graphmode's output."""
    spans = function_spans(tree)
    return {name: spans[name + TWIN_SUFFIX] for name in spans
            if not name.endswith(TWIN_SUFFIX) and name + TWIN_SUFFIX in spans}


def fork_lines(original: str, adapted: str) -> dict[int, int]:
    """Original line -> adapted line, for the methods that fork on the switch in graphmode's output: a line of the
    model's own code maps to its copy (under `else:` or after a returning static branch), except where the static
    statements that replace it hold the same line, or begin in its place (the first line of what a fork replaces
    maps to the first line of the static statements' code): those are what the entries run."""
    originals = function_spans(ast.parse(original))
    original_lines, adapted_lines = original.splitlines(), adapted.splitlines()
    found: dict[int, int] = {}
    for qualname, function in _ast_functions(ast.parse(adapted)):
        if qualname not in originals or not (any(_fork_parts(stmt) for stmt in function.body)
                                             or _chosen_values(function)):
            continue
        first, last = originals[qualname]
        view: list[tuple[int, str]] = []  # the model's own lines of the method, as (adapted line, unindented text)
        static: list[tuple[list[int], list[int]]] = []  # (static lines, the own lines they replace), per fork
        start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
        skip: dict[int, int] = {}  # adapted line -> how far to unindent it, or -1: not the model's own
        for stmt in function.body:
            parts = _fork_parts(stmt)
            if parts is None:
                continue
            static_lines, own_lines, shift = parts
            skip.update({line: shift if line in own_lines else -1 for line in range(stmt.lineno, stmt.end_lineno + 1)})
            if leaves_static_path(stmt):  # what follows is the model's own, as written
                static.append((static_lines, list(range(stmt.end_lineno + 1, function.end_lineno + 1))))
                break
            static.append((static_lines, own_lines))
        for line in range(start, function.end_lineno + 1):
            shift = skip.get(line, 0)
            if shift >= 0:
                view.append((line, adapted_lines[line - 1][shift:]))
        mapped = carried_numbers(original_lines[first - 1:last], [text for _, text in view],
                                 list(range(first, last + 1)))
        own = {line: view[index][0] for index, line in enumerate(mapped) if line is not None}
        found.update(own)
        back = {adapted_line: line for line, adapted_line in own.items()}
        for chosen in _chosen_values(function):
            # `x = <static> if graphmode_static_path(self) else <original>`: the original's lines between the mapped
            # ones around it are the statement it chose from.
            before = [line for line, at in own.items() if at < chosen.lineno]
            after = [line for line, at in own.items() if at > chosen.end_lineno]
            for line in range(max(before, default=first - 1) + 1, min(after, default=last + 1)):
                found.setdefault(line, chosen.lineno)
        for static_lines, own_lines in static:
            replaced = [back[line] for line in own_lines if line in back]
            if not replaced or not static_lines:
                continue
            texts = [adapted_lines[line - 1].strip() for line in static_lines]
            for line in replaced:
                text = original_lines[line - 1].strip()
                if text and text in texts:
                    found[line] = static_lines[texts.index(text)]
            code = [line for line in static_lines if not adapted_lines[line - 1].lstrip().startswith("#")]
            if code and found[replaced[0]] not in static_lines:
                found[replaced[0]] = code[0]
    return found


def _chosen_values(function: ast.AST) -> list[ast.stmt]:
    """The assignments under function whose value is `<static> if graphmode_static_path(...) else <original>`."""
    return [node for node in ast.walk(function) if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, ast.IfExp) and asks_switch(node.value.test)]


def _fork_parts(stmt: ast.stmt) -> tuple[list[int], list[int], int] | None:
    """A fork's static lines, the model's own lines it holds and how much deeper those are indented; None for any
    other statement (the dispatch to a twin included)."""
    if not isinstance(stmt, ast.If) or _dispatches(stmt):
        return None
    test = stmt.test
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    if not asks_switch(test.operand if negated else test):
        return None
    block = list(range(stmt.lineno + 1, stmt.body[-1].end_lineno + 1))
    shift = stmt.body[0].col_offset - stmt.col_offset
    if negated:
        return [], block, shift
    if len(stmt.orelse) == 1 and stmt.orelse[0].__class__ is ast.If and stmt.orelse[0].col_offset == stmt.col_offset:
        # `elif <the original test>:`: the original's lines where they were written, the comments above it too.
        return block, list(range(block[-1] + 1, stmt.end_lineno + 1)), 0
    return block, list(range(block[-1] + 2, stmt.end_lineno + 1)) if stmt.orelse else [], shift


def _dispatches(stmt: ast.If) -> bool:
    """`if graphmode_static_path(self): return self.forward_static(...)`: the hand-over to a twin, no fork."""
    then = stmt.body
    return len(then) == 1 and isinstance(then[0], ast.Return) and isinstance(then[0].value, ast.Call) \
        and isinstance(then[0].value.func, ast.Attribute) and then[0].value.func.attr.endswith(TWIN_SUFFIX)


def _ast_functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    def walk(body: list[ast.stmt], prefix: str):
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + stmt.name, stmt
            elif isinstance(stmt, ast.ClassDef):
                yield from walk(stmt.body, f"{prefix}{stmt.name}.")
    yield from walk(tree.body, "")


def _same(a: cst.FunctionDef, b: cst.FunctionDef, texts: _Texts) -> bool:
    # One node: a function every codemod passed over (none of its idioms) is handed on as it was parsed.
    return a is b or texts.after_leading_lines(a) == texts.after_leading_lines(b)


def _decorator_names(decorators) -> set[str]:
    """`staticmethod`, `torch.no_grad` -> `no_grad`, ...: the last name of each decorator (called or not)."""
    names = set()
    for decorator in decorators:
        expression = decorator.decorator
        if isinstance(expression, cst.Call):
            expression = expression.func
        if isinstance(expression, cst.Name):
            names.add(expression.value)
        elif isinstance(expression, cst.Attribute):
            names.add(expression.attr.value)
    return names


def _asks_switch(qualname: str, function: cst.FunctionDef) -> bool:
    """A method with a module to ask: in a class, neither static nor a class method, with a first parameter."""
    return "." in qualname and not {"staticmethod", "classmethod"} & _decorator_names(function.decorators) \
        and bool(function.params.params or function.params.posonly_params)


def _twin_name(name: str) -> str:
    return name + TWIN_SUFFIX


def _calls_any(function: cst.FunctionDef, renamed: dict[str, str], qualname: str) -> bool:
    targets = _rename_targets(renamed, qualname)
    return bool(targets) and any(_call_target(call, targets) is not None for call in calls_in(function))


def _rename_targets(renamed: dict[str, str], qualname: str) -> dict[tuple[str | None, str], str]:
    """(receiver, name) -> twin name for the calls a function at `qualname` makes: `f(...)` for free functions,
    `self.f(...)`/`cls.f(...)`/`Class.f(...)` for static and class methods of its own class."""
    own_class = qualname.rsplit(".", 1)[0] if "." in qualname else None
    targets: dict[tuple[str | None, str], str] = {}
    for target, twin in renamed.items():
        if "." not in target:
            targets[(None, target)] = twin
            continue
        cls, name = target.rsplit(".", 1)
        targets[(cls.rsplit(".", 1)[-1], name)] = twin
        if cls == own_class:
            targets[("self", name)] = targets[("cls", name)] = twin
    return targets


def _call_target(call: cst.Call, targets: dict[tuple[str | None, str], str]) -> tuple[str | None, str] | None:
    func = call.func
    if isinstance(func, cst.Name) and (None, func.value) in targets:
        return None, func.value
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) \
            and (func.value.value, func.attr.value) in targets:
        return func.value.value, func.attr.value
    return None


class _RenameCalls(Transformer):
    """Inside the static path: calls of renamed functions go to their twins, and a keyword argument named as the
    codemods renamed a parameter goes by the name the dispatcher kept."""

    def __init__(self, targets: dict[tuple[str | None, str], str], keywords: dict[str, str]) -> None:
        self.targets, self.keywords = targets, keywords

    def renames_in(self, node: cst.CSTNode) -> bool:
        """Whether visiting `node` would change anything: a call `leave_Call` rewrites is under it. A walk, where
        the visit rebuilds every node."""
        if not self.targets and not self.keywords:
            return False  # nothing to rename (most files): no walk
        return any(isinstance(call, cst.Call) and (
            _call_target(call, self.targets) is not None
            or (self.keywords and _module_call(call.func)
                and any(a.keyword is not None and a.keyword.value in self.keywords for a in call.args)))
            for call in walk(node))

    def applied_to(self, node: cst.CSTNode) -> cst.CSTNode:
        """`node.visit(self)`; the node itself where nothing under it is renamed (most functions)."""
        return node.visit(self) if self.renames_in(node) else node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        key = _call_target(original_node, self.targets)
        if key is not None:  # the twin itself takes the adapted names
            twin = self.targets[key]
            func = updated_node.func
            if isinstance(func, cst.Name):
                return updated_node.with_changes(func=func.with_changes(value=twin))
            return updated_node.with_changes(func=func.with_changes(attr=cst.Name(twin)))
        if not self.keywords or not _module_call(original_node.func):
            return updated_node
        args = [a.with_changes(keyword=cst.Name(self.keywords[a.keyword.value]))
                if a.keyword is not None and a.keyword.value in self.keywords else a for a in updated_node.args]
        return updated_node.with_changes(args=args)


def _module_call(func: cst.BaseExpression) -> bool:
    """`self.layer(...)`, `self.layers[i](...)`, `layer(...)`, `self.forward(...)`: calls that may reach a module's
    dispatcher (which kept the original parameter names)."""
    if isinstance(func, cst.Subscript):
        func = func.value
    return isinstance(func, (cst.Name, cst.Attribute))


class _Split(Transformer):
    """Replaces each changed function by its original (asking the switch, or left as it was) and its twin; the
    functions the chain added (the entries) call the twins as the twins do."""

    def __init__(self, originals: dict[str, cst.FunctionDef], changed: dict[str, cst.FunctionDef], plan: _Plan,
                 width: int, texts: _Texts):
        self.originals, self.changed, self.plan, self.width, self.texts = originals, changed, plan, width, texts
        self.scope: list[str] = []
        # Every function this pass built (the originals put back, the twins, the forks): what they hold of the
        # original may also sit beside them, in a twin, a fork or a function the chain added (_with_notes_on_headers).
        self.placed: set[cst.FunctionDef] = set()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scope.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.scope.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # nested functions belong to their function's body

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef):
        placed = self._placed(original_node, updated_node)
        if placed is not updated_node:
            self.placed.update(placed.nodes if isinstance(placed, cst.FlattenSentinel) else [placed])
        return placed

    def _placed(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef):
        qualname = ".".join([*self.scope, original_node.name.value])
        renames = _RenameCalls(_rename_targets(self.plan.renamed, qualname), self.plan.keywords)
        if qualname in self.plan.kept:  # the original body, with the parameters the static path's callers pass
            kept = self.originals[qualname]
            return kept.with_changes(params=_merged_signature(kept.params, updated_node.params)[0],
                                     leading_lines=updated_node.leading_lines)
        if qualname not in self.changed:
            if qualname in self.originals or not renames.renames_in(updated_node):
                return updated_node  # (a function the chain added, the helpers among them, mostly calls no twin)
            return updated_node.visit(renames)
        if qualname in self.plan.dispatched:
            indent = len(self.scope) + 1  # levels of the method's body
            forked = _forked(self.originals[qualname], renames.applied_to(updated_node), self.width - 4 * (indent + 1),
                              self.texts)
            if forked is not None:
                return forked.with_changes(leading_lines=updated_node.leading_lines)
        twin = renames.applied_to(updated_node).with_changes(
            name=cst.Name(_twin_name(updated_node.name.value)),
            leading_lines=[cst.EmptyLine(indent=False)] * (1 if self.scope else 2),
            decorators=[d for d in updated_node.decorators if _decorator_names([d]) & {"staticmethod", "classmethod"}])
        twin = _with_docstring(twin, f"`{updated_node.name.value}` on the static path (added by graphmode): what "
                                     "`prefill` and `decode` run.")
        original = self.originals[qualname].with_changes(leading_lines=updated_node.leading_lines)
        if qualname in self.plan.dispatched:
            # Only the method hands its twin arguments, so the twin takes none its body never reads (a cache the
            # static path keeps in buffers): the method keeps them for the model's own callers.
            unread = {p.name.value for p in [*twin.params.posonly_params, *twin.params.params][1:]
                      + list(twin.params.kwonly_params)} - names_in(twin.body)
            original = _asking_switch(original, updated_node, twin.name.value, unread)
            twin = twin.with_changes(params=_without(twin.params, unread))
        return cst.FlattenSentinel([original, twin])


def _without(params: cst.Parameters, names: set[str]) -> cst.Parameters:
    if not names:
        return params
    if _one_per_line(params):
        # Kept as written, one per line; the new last parameter takes the old last one's comma (and the line break
        # before the closing bracket).
        kept = [p for p in params.params if p.name.value not in names]
        kept[-1] = kept[-1].with_changes(comma=params.params[-1].comma)
        return params.with_changes(params=kept)
    # The commas go with the parameters: libcst writes the default ones, and line_wrap wraps a long line again.
    kept = {field: [p.with_changes(comma=cst.MaybeSentinel.DEFAULT) for p in getattr(params, field)
                    if p.name.value not in names] for field in ("posonly_params", "params", "kwonly_params")}
    star_arg = params.star_arg
    if isinstance(star_arg, cst.ParamStar) and not kept["kwonly_params"]:
        star_arg = cst.MaybeSentinel.DEFAULT  # a bare `*` needs keyword-only parameters after it
    return params.with_changes(star_arg=star_arg, **kept)


def _one_per_line(params: cst.Parameters) -> bool:
    """Plain parameters only (no `*`, `/` or keyword-only ones), each on a line of its own; a `**kwargs` may follow
    on a line of its own (Hub attention forwards end so). Joined instead, such a signature became one line too long
    for the file, which line_wrap leaves alone (it wraps no signature with `**` or a bracket already broken)."""
    # With a `**kwargs` after them the last plain parameter has its comma (and line break) too.
    broken = params.params if params.star_kwarg is not None else params.params[:-1]
    return len(params.params) > 1 and not (params.posonly_params or params.kwonly_params) \
        and not isinstance(params.star_arg, cst.Param | cst.ParamStar) \
        and all(isinstance(p.comma, cst.Comma) and isinstance(p.comma.whitespace_after, cst.ParenthesizedWhitespace)
                for p in broken)


def _with_docstring(function: cst.FunctionDef, text: str) -> cst.FunctionDef:
    """The twin's docstring says what it is; the original's (which describes the model) stays with the original."""
    body = list(function.body.body)
    if body and is_docstring(body[0]):
        body = body[1:]
    docstring = cst.SimpleStatementLine([cst.Expr(cst.SimpleString(f'"""{text}"""'))])
    return function.with_changes(body=function.body.with_changes(body=[docstring, *body]))


def _asking_switch(original: cst.FunctionDef, adapted: cst.FunctionDef, twin: str,
                   unread: set[str] = frozenset()) -> cst.FunctionDef:
    """The original method with the adapted signature (which only adds parameters) and, first, the question, which
    hands the twin every argument but the `unread` ones (by their adapted names)."""
    params, arguments = _merged_signature(original.params, adapted.params)
    positional = [*adapted.params.posonly_params, *adapted.params.params][1:]
    arguments = [a for a, p in zip(arguments, positional) if p.name.value not in unread] \
        + [a for a in arguments[len(positional):] if a.split("=", 1)[0] not in unread]
    receiver = (original.params.posonly_params or original.params.params)[0].name.value
    test = cst.parse_statement(
        f"if {SWITCH_TEST}({receiver}):\n    return {receiver}.{twin}({', '.join(arguments)})\n")
    test = test.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
        "# graphmode: only the prefill/decode entries take the static path; every other call runs the code below."))])
    body = list(original.body.body)
    at = 1 if body and is_docstring(body[0]) else 0
    return original.with_changes(params=params,
                                 body=original.body.with_changes(body=[*body[:at], test, *body[at:]]))


# A method whose rewrite differs from the original in at most _MOST_FORKS runs of statements keeps one body, with
# only those runs forked on the switch: each run costs an `if`/`else` (two lines, one where the static statements
# return), where a twin costs the whole body again plus its def, docstring and the dispatch (six lines), so a fork is
# the shorter file wherever the forked body stays readable. Past three runs the reader has to piece the static path
# together from the branches; and static statements more than twice as long as what both paths keep are a second
# body in all but name: both read better as a twin. Static statements of up to _SHORT lines stay a fork even where
# they replace the whole body (`if graphmode_static_path(self): return <the fused call>`).
_MOST_FORKS = 3
_SHORT = 6


def _renamed_only(original: cst.FunctionDef, adapted: cst.FunctionDef, kept_names: dict[str, str],
                  texts: _Texts) -> bool:
    """The rewrite only renamed parameters (`start_pos` -> `input_pos`), its own or, in keywords, those of what it
    calls (`kept_names`: renamed -> the name kept): the original body, handed what the static path's callers pass,
    is the static path."""
    body = _with_original_names(original, adapted)
    if body is None:
        return False
    return texts.code(body.visit(_KeywordsAsKept(kept_names)) if kept_names else body) == texts.code(original.body)


def _with_original_names(original: cst.FunctionDef, adapted: cst.FunctionDef) -> cst.BaseSuite | None:
    """The adapted body with each renamed parameter called by its original name again; None where an original name
    means something else there (renaming would capture it)."""
    renames = renamed_parameters(original.params, adapted.params)
    if renames and set(renames.values()) & names_in(adapted.body):
        return None
    return adapted.body.visit(_RenameNames(renames)) if renames else adapted.body


class _RenameNames(Transformer):
    """Bare names renamed; attribute names and keywords (which name another function's parameter) stay."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=self.names.get(updated_node.value, updated_node.value))

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)


class _KeywordsAsKept(Transformer):
    """Keyword arguments named as a renamed parameter, by the name its dispatcher kept."""

    def __init__(self, kept_names: dict[str, str]) -> None:
        self.kept_names = kept_names

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        keyword = updated_node.keyword
        if keyword is None or keyword.value not in self.kept_names:
            return updated_node
        return updated_node.with_changes(keyword=keyword.with_changes(value=self.kept_names[keyword.value]))


def _forked(original: cst.FunctionDef, static: cst.FunctionDef, width: int, texts: _Texts) -> cst.FunctionDef | None:
    """The original method with only the statements the rewrite changed forked on the switch (the static ones first,
    the original's in `else`, as written); None where a twin reads better (see _MOST_FORKS), or where an original
    statement one level deeper would be wider than `width`.

    The forks are runs of the body's own statements, so each path runs its statements in order exactly as its own
    body would: a compound statement that changed inside is forked whole, and a renamed parameter is called by its
    original name in the static statements too (it carries the static path's value there)."""
    renamed = _with_original_names(original, static)
    if renamed is None or not isinstance(original.body, cst.IndentedBlock) \
            or not isinstance(renamed, cst.IndentedBlock):
        return None
    docstring, ours = _split_docstring(list(original.body.body))
    _, theirs = _split_docstring(list(renamed.body))
    runs = _changed_runs(ours, theirs, texts)
    # A run whose static form only skips the original statements while Dynamo traces is the same on both paths
    # (eager runs never trace): it takes the original's place, unforked.
    guards = {run: theirs[run[2]] for run in runs if _eager_guard(ours[run[0]:run[1]], theirs[run[2]:run[3]], texts)}
    runs = [run for run in runs if run not in guards]
    if not (runs or guards) or len(runs) > _MOST_FORKS:
        return None
    # A rewrite may have made both arms of a branch the same (one static form for every attention kind).
    theirs = _merged_arms(theirs, runs)
    kept_lines = sum(_lines(s, texts) for s in ours) \
        - sum(_lines(s, texts) for i1, i2, _, _ in runs for s in ours[i1:i2])
    static_lines = sum(_lines(s, texts) for _, _, j1, j2 in runs for s in theirs[j1:j2])
    if static_lines > max(2 * kept_lines, _SHORT):
        return None  # most of the body differs
    if any(len(_unbreakable(line)) > width for _, _, j1, j2 in runs for s in theirs[j1:j2]
           for line in texts.code(s).splitlines()):
        return None  # a static statement would not fit the file's lines one level deeper, however wrapped
    receiver = (original.params.posonly_params or original.params.params)[0].name.value
    placed: dict[tuple[int, int, int, int], list[cst.BaseStatement]] = {}
    for i1, i2, j1, j2 in runs:
        last = i2 == len(ours) and j2 == len(theirs)
        statements = _placed(receiver, theirs[j1:j2], ours[i1:i2], last, width, texts)
        if statements is None:
            return None  # an original statement under `else:` would no longer fit the file's lines
        placed[i1, i2, j1, j2] = statements
    body: list[cst.BaseStatement] = list(docstring)
    done = 0
    for run in sorted([*runs, *guards]):
        i1, i2 = run[0], run[1]
        body += ours[done:i1]
        done = i2
        body += [guards[run]] if run in guards else placed[run]
    body += ours[done:]
    params = _merged_signature(original.params, static.params)[0]
    return original.with_changes(params=params, body=original.body.with_changes(body=body))


def _placed(receiver: str, static: list[cst.BaseStatement], own: list[cst.BaseStatement], last: bool,
            width: int, texts: _Texts) -> list[cst.BaseStatement] | None:
    """The statements that stand for one changed run: the fork, in the form that leaves the original's statements
    where they were written wherever one exists, else with them under `else:`; None where they would not fit
    `width` there.

    - The static statements return at the end of the body: the original's follow the fork as written.
    - The run is one `if` of the original: the static statements come first and it follows as `elif`, its lines
      as written (`if graphmode_static_path(self): <static> elif <its test>: ...`).
    - The run is defaults (`mask = None`) and then one `if`, and the first static statement assigns those names
      again: the defaults stay above the fork, on both paths (the static path overwrites them before any read),
      and the `if` follows as `elif`.
    - Only the original runs the run, and it is one `if` without `else`: `if not graphmode_static_path(self) and
      <its test>:`.
    - The run ends in such an `if`, and the statements before it are all that fits under `else:`: those are
      forked, and the `if` asks as above.
    """
    if last and static and _ends_the_call(static[-1]):
        return [_fork(receiver, static, [], own), *own]
    # `elif` is two characters longer than `if`, and the switch asked in a test longer still: only where the line
    # stays within the file's (the room at the fork's level is `width` + one indentation).
    last_if = own[-1] if own and isinstance(own[-1], cst.If) and _header_fits(own[-1], width + 2) else None
    if len(own) == 1 and last_if is not None:
        if static:
            return [_elif_fork(receiver, static, last_if)]
        if last_if.orelse is None and _header_fits(_unless_static(receiver, last_if), width + 4):
            return [_unless_static(receiver, last_if)]
    if len(own) > 1 and last_if is not None and static and _overwritten_defaults(own[:-1], static[0]):
        return [*own[:-1], _elif_fork(receiver, static, last_if)]
    # The one statement stays at the original's level, not under `if`: the room of `width` + one indentation.
    if (chosen := _chosen_value(receiver, static, own, width + 4, texts)) is not None:
        return [chosen]
    if _fits(own, width, texts):
        return [_fork(receiver, static, own, own)]
    if len(own) > 1 and last_if is not None and last_if.orelse is None and _fits(own[:-1], width, texts) \
            and _header_fits(_unless_static(receiver, last_if), width + 4):
        return [_fork(receiver, static, own[:-1], own), _unless_static(receiver, last_if)]
    return None


def _header_fits(block: cst.If, width: int) -> bool:
    """The `if` line of `block` (its first, where the test spans several) is at most `width` long."""
    return len(code_of(block.with_changes(leading_lines=())).splitlines()[0]) <= width


def _overwritten_defaults(defaults: list[cst.BaseStatement], first: cst.BaseStatement) -> bool:
    """Each of `defaults` gives a name a constant (`x = None`, `n = 0`), and `first` assigns every one of them."""
    names = [_constant_assignment(s) for s in defaults]
    assigned = single_assignment(first)
    return None not in names and assigned is not None and set(names) <= {assigned[0]} \
        and not names_in(assigned[1]) & set(names)


def _constant_assignment(stmt: cst.BaseStatement) -> str | None:
    """`name = <None, True, False, a number or a string>` -> name."""
    assigned = single_assignment(stmt)
    if assigned is None:
        return None
    value = assigned[1]
    constant = isinstance(value, (cst.Integer, cst.Float, cst.SimpleString)) \
        or (isinstance(value, cst.Name) and value.value in ("None", "True", "False"))
    return assigned[0] if constant else None


def _fits(statements: list[cst.BaseStatement], width: int, texts: _Texts) -> bool:
    return all(len(line) <= width for s in statements for line in texts.code(s).splitlines())


def _elif_fork(receiver: str, static: list[cst.BaseStatement], own: cst.If) -> cst.If:
    """`if graphmode_static_path(receiver): <static> elif <own's test>: ...`: the blank lines before `own` go before
    the fork, its comments stay with it (above `elif`)."""
    comments = [line for line in own.leading_lines if line.comment is not None]
    # A rewrite keeps the comments above what it replaced: above `elif` they say it once.
    said = {line.comment.value for line in comments}
    first = static[0].with_changes(leading_lines=[line for line in static[0].leading_lines
                                                  if line.comment is None or line.comment.value not in said])
    fork = _fork(receiver, [first, *static[1:]], [], [own])
    return fork.with_changes(orelse=own.with_changes(leading_lines=comments))


def _unless_static(receiver: str, own: cst.If) -> cst.If:
    """`own` asking first whether this call is off the static path: `if not graphmode_static_path(receiver) and
    <its test>:`."""
    test = own.test
    if isinstance(test, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)) and not test.lpar:
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    ask = cst.UnaryOperation(cst.Not(), cst.parse_expression(f"{SWITCH_TEST}({receiver})"))
    return own.with_changes(test=cst.BooleanOperation(left=ask, operator=cst.And(), right=test))


def _merged_arms(theirs: list[cst.BaseStatement], runs: list[tuple[int, int, int, int]]) -> list[cst.BaseStatement]:
    """The rewritten statements with the identical arms of a forked run's branch merged, where that leaves one
    statement (so the runs keep their indexes)."""
    merged = list(theirs)
    for _, _, j1, j2 in runs:
        for j in range(j1, j2):
            if not _holds_else(merged[j]):
                continue  # no branch with two arms: the merge would build the same statement again
            flat = without_identical_branches([merged[j]])
            if len(flat) == 1:
                merged[j] = flat[0]
    return merged


def _holds_else(stmt: cst.BaseStatement) -> bool:
    """Whether some `if` at or under the statement has an `else:` (a walk of statements alone: an `if` is one)."""
    return any(type(node) is cst.If and type(node.orelse) is cst.Else for node in walk(stmt, statements_only))


def _guards_only(original: cst.FunctionDef, adapted: cst.FunctionDef, texts: _Texts) -> bool:
    """Whether the rewrite only put eager-only guards around statements of the body (see _eager_guard)."""
    if texts.code(original.params) != texts.code(adapted.params) or not isinstance(original.body, cst.IndentedBlock) \
            or not isinstance(adapted.body, cst.IndentedBlock):
        return False
    ours, theirs = _split_docstring(list(original.body.body))[1], _split_docstring(list(adapted.body.body))[1]
    runs = _changed_runs(ours, theirs, texts)
    return bool(runs) and all(_eager_guard(ours[i1:i2], theirs[j1:j2], texts) for i1, i2, j1, j2 in runs)


def _changed_runs(ours: list[cst.BaseStatement], theirs: list[cst.BaseStatement],
                  texts: _Texts) -> list[tuple[int, int, int, int]]:
    """The runs of statements that differ between two bodies: (i1, i2) of `ours` became (j1, j2) of `theirs`."""
    keys = [texts.key(s) for s in ours], [texts.key(s) for s in theirs]
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in
            difflib.SequenceMatcher(None, *keys, autojunk=False).get_opcodes() if tag != "equal"]


def _eager_guard(ours: list[cst.BaseStatement], theirs: list[cst.BaseStatement], texts: _Texts) -> bool:
    """Whether the static statements are the original ones under `if not torch.compiler.is_compiling():` alone."""
    if len(theirs) != 1 or not ours or not isinstance(theirs[0], cst.If) or theirs[0].orelse is not None \
            or code_of(theirs[0].test).strip() != EAGER_ONLY:
        return False
    return [texts.key(s) for s in theirs[0].body.body] == [texts.key(s) for s in ours]


def _unbreakable(line: str) -> str:
    """What line_wrap cannot wrap of a line of code: up to its first bracket (a comment it re-fills)."""
    if line.lstrip().startswith("#"):
        return ""
    cut = min([line.find(bracket) for bracket in "([{" if bracket in line] or [len(line)])
    return line[:cut + 1]


def _split_docstring(body: list[cst.BaseStatement]) -> tuple[list[cst.BaseStatement], list[cst.BaseStatement]]:
    return (body[:1], body[1:]) if body and is_docstring(body[0]) else ([], body)


def _lines(stmt: cst.BaseStatement, texts: _Texts) -> int:
    return texts.code(stmt).count("\n")


def _ends_the_call(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[-1], (cst.Return, cst.Raise))


def _chosen_value(receiver: str, static: list[cst.BaseStatement], own: list[cst.BaseStatement],
                  width: int, texts: _Texts) -> cst.SimpleStatementLine | None:
    """`x = A` on the static path and `x = B` in the original, with no comment but graphmode's note above `x = A`:
    one statement, `x = A if graphmode_static_path(receiver) else B`, the note above it (a fork of four lines says no
    more; transforms.line_wrap wraps it where it is long)."""
    if len(static) != 1 or len(own) != 1:
        return None
    ours, theirs = single_assignment(static[0]), single_assignment(own[0])
    notes = [line for line in static[0].leading_lines if line.comment is not None]
    if ours is None or theirs is None or ours[0] != theirs[0] \
            or any(not line.comment.value.startswith("# graphmode:") for line in notes) \
            or any(line.comment is not None for line in own[0].leading_lines) \
            or "#" in texts.code(static[0].with_changes(leading_lines=())) + texts.code(own[0]) \
            or any(isinstance(v, (cst.IfExp, cst.Lambda, cst.NamedExpr, cst.Tuple)) and not v.lpar
                   for v in (ours[1], theirs[1])) \
            or notes and any("\n" in texts.code(v) for v in (ours[1], theirs[1])):
        return None  # a value over several lines reads better as a fork, the note on its `if` line
    choice = cst.IfExp(test=cst.parse_expression(f"{SWITCH_TEST}({receiver})"), body=ours[1], orelse=theirs[1])
    line = own[0].with_changes(body=[own[0].body[0].with_changes(value=choice)],
                               leading_lines=[*own[0].leading_lines, *notes])
    if _fits([line], width, texts):
        return line
    # Past the line limit: in parentheses, `else` under the value it follows.
    below = cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(" " * (len(ours[0]) + 4)))
    wrapped = choice.with_changes(whitespace_before_else=below, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    line = own[0].with_changes(body=[own[0].body[0].with_changes(value=wrapped)],
                               leading_lines=[*own[0].leading_lines, *notes])
    return line if _fits([line], width, texts) else None


def _fork(receiver: str, static: list[cst.BaseStatement], original: list[cst.BaseStatement],
          replaced: list[cst.BaseStatement]) -> cst.If:
    """`if graphmode_static_path(receiver): <static> else: <original>` (either side may be empty); the blank lines
    before the statements it `replaced` go before it. The static statements are one block, without blank lines of
    their own between them."""
    first = (replaced or static)[0]
    blank = [line for line in first.leading_lines if line.comment is None]
    static = [s.with_changes(leading_lines=[line for line in s.leading_lines if line.comment is not None])
              for s in static]
    original = _without_blank_start(original)
    test: cst.BaseExpression = cst.parse_expression(f"{SWITCH_TEST}({receiver})")
    if not static:
        test, static, original = cst.UnaryOperation(cst.Not(), test), original, []
    orelse = cst.Else(body=cst.IndentedBlock(body=original)) if original else None
    return cst.If(test=test, body=cst.IndentedBlock(body=static), orelse=orelse, leading_lines=blank)


def _with_notes_on_headers(module: cst.Module, placed: set[cst.FunctionDef], width: int) -> cst.Module:
    """The module with graphmode's notes on the `if` lines of its forks and eager-only guards (_NotesOnHeaders), and
    no node in two places: `placed` (_Split.placed) may share nodes with a twin or a fork beside it (a nested function
    no codemod changed, a statement a codemod's walk passed over), and a visit builds every node it visits again,
    once per place. So each placed function, and each statement under which the notes' pass changes an `if`, is
    visited (a placed function only where the visit makes a difference, `_noted_placed`); every other statement
    comes from the chain's tree (which holds each node once) and stays as it is. A visit of the whole module, which
    this was, costs more than any codemod's walk on a file with few changed functions (tests/test_pipeline_shortcuts.py
    holds the two to the same text)."""
    notes = _NotesOnHeaders(width, len(module.default_indent.expandtabs()))
    shared, on_the_way = _to_build_again(placed)

    def noted(stmt: cst.BaseStatement, depth: int) -> cst.BaseStatement:
        if type(stmt) is cst.ClassDef and type(stmt.body) is cst.IndentedBlock and not _moves_a_note(stmt.body):
            body = [noted(inner, depth + 1) for inner in stmt.body.body]
            if all(new is old for new, old in zip(body, stmt.body.body)):
                return stmt
            return stmt.with_changes(body=stmt.body.with_changes(body=body))
        if stmt in placed:
            return _noted_placed(stmt, depth, notes, shared, on_the_way)
        if not any(node in placed or _moves_a_note(node) for node in walk(stmt, statements_only)):
            return stmt
        notes.depth = depth  # the blocks around the statement: the room a note has on a line depends on them
        return stmt.visit(notes)

    body = [noted(stmt, 0) for stmt in module.body]
    return module if all(new is old for new, old in zip(body, module.body)) else module.with_changes(body=body)


def _to_build_again(functions: set[cst.FunctionDef]) -> tuple[set[int], set[int]]:
    """For `_noted_placed`: the ids of the nodes that sit in more than one place among the functions, leaves aside
    (the whitespace and comments a visit hands on as they are, which are not read here), and the ids of the nodes on
    the way to one of them or to a block in which a note moves (_moves_a_note), those blocks included."""
    first_parent: dict[int, cst.CSTNode | None] = {}  # every node read, by id: the node it was first read under
    other_parents: dict[int, list[cst.CSTNode]] = {}  # a node's other places
    marked: list[int] = []
    pending: list[tuple[cst.CSTNode, cst.CSTNode | None]] = [(function, None) for function in functions]
    while pending:
        node, parent = pending.pop()
        key = id(node)
        if key in first_parent:
            other_parents.setdefault(key, []).append(parent)
            continue  # what it holds was read in its first place
        first_parent[key] = parent
        if type(node) is cst.IndentedBlock and _moves_a_note(node):
            marked.append(key)
        for name in child_fields(type(node)):
            value = getattr(node, name)
            if type(value) is tuple or type(value) is list:
                pending.extend([(item, node) for item in value if _BUILT_BY_A_VISIT[type(item)]])
            elif _BUILT_BY_A_VISIT[type(value)]:
                pending.append((value, node))
    on_the_way: set[int] = set(marked)
    up = [parent for key in [*other_parents, *marked] for parent in [first_parent[key], *other_parents.get(key, ())]]
    while up:
        node = up.pop()
        if node is not None and id(node) not in on_the_way:
            on_the_way.add(id(node))
            up.append(first_parent[id(node)])
            up.extend(other_parents.get(id(node), ()))
    return set(other_parents), on_the_way


def _noted_placed(function: cst.FunctionDef, depth: int, notes: _NotesOnHeaders, shared: set[int],
                  on_the_way: set[int]) -> cst.FunctionDef:
    """`function.visit(notes)` with `notes.depth` at `depth`, for a function _Split built, where it makes a
    difference (`_to_build_again`): a node `shared` is visited, so that each of its places holds a node built for it;
    a block in which a note moves (_moves_a_note) gets the notes the visit's leave gives it; the nodes on the way to
    either are built again; every other node stays the node it was, which only this place holds. The visit built
    every node of every placed function again: a third of this pass's cost on a llama file, where a node in two
    places is one in seventy."""

    def rebuilt(node: cst.CSTNode, depth: int) -> cst.CSTNode:
        if id(node) in shared:
            notes.depth = depth
            return node.visit(notes)
        if id(node) not in on_the_way:
            return node
        inner = depth + 1 if type(node) is cst.IndentedBlock else depth  # as visit_IndentedBlock counts
        changes: dict[str, object] = {}
        for name in child_fields(type(node)):
            value = getattr(node, name)
            if type(value) is tuple or type(value) is list:
                items = [rebuilt(item, inner) if _BUILT_BY_A_VISIT[type(item)] else item for item in value]
                if any(new is not old for new, old in zip(items, value)):
                    changes[name] = items
            elif _BUILT_BY_A_VISIT[type(value)]:
                new = rebuilt(value, inner)
                if new is not value:
                    changes[name] = new
        new = node.with_changes(**changes) if changes else node
        if type(node) is cst.IndentedBlock and _moves_a_note(node):
            # No note the inner blocks moved leaves another at the end of a block's lines (noted_on_header moves
            # only the one note there), so a block that moves none before them moves none after.
            notes.depth = depth
            new = notes.noted_block(new)
        return new

    return rebuilt(function, depth)


# A node a visit builds again: not a leaf (whitespace, a comment), which it hands on as it is.
_BUILT_BY_A_VISIT: dict[type, bool] = Computed(lambda kind: issubclass(kind, cst.CSTNode)
                                               and not issubclass(kind, BaseLeaf))


def _moves_a_note(node: cst.CSTNode) -> bool:
    """Whether the node is a block in which _NotesOnHeaders may change an `if`: one with graphmode's note as the last
    of the lines above it or above the first statement of its body (noted_on_header changes no other)."""
    return type(node) is cst.IndentedBlock and any(
        type(stmt) is cst.If and (_ends_with_note(stmt.leading_lines) or (
            stmt.body.body and _ends_with_note(getattr(stmt.body.body[0], "leading_lines", ()))))
        for stmt in node.body)


def _ends_with_note(lines) -> bool:
    return bool(lines) and lines[-1].comment is not None and lines[-1].comment.value.startswith(NOTE)


class _NotesOnHeaders(Transformer):
    """Each fork on the switch and each eager-only guard with graphmode's note on its `if` line (noted_on_header):
    the note says what the block is, and costs no line of its own there."""

    def __init__(self, limit: int, indent: int) -> None:
        self.limit, self.indent, self.depth = limit, indent, 0

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.depth += 1

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        self.depth -= 1
        return self.noted_block(updated_node)

    def noted_block(self, block: cst.IndentedBlock) -> cst.IndentedBlock:
        """The block with its notes moved, `depth` being the number of blocks around it."""
        width = self.limit - self.indent * (self.depth + 1)  # the room at the level of this block's statements
        body = [noted_on_header(s, width) if isinstance(s, cst.If) and _noted_kind(s) else s for s in block.body]
        return block.with_changes(body=body)


def _noted_kind(block: cst.If) -> bool:
    """A fork on the switch (`if graphmode_static_path(self):`) or an eager-only guard."""
    test = code_of(block.test).strip()
    return test.startswith(f"{SWITCH_TEST}(") or test == EAGER_ONLY


def noted_on_header(block: cst.If, width: int) -> cst.If:
    """`block` with graphmode's one-line note above it, or above the first statement of its body, at the end of its
    `if` line instead, where that line stays within `width` (the room at the `if`'s own level)."""
    if block.body.header.comment is not None or "\n" in code_of(block.test):
        return block
    header = code_of(block.with_changes(body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])]),
                                        orelse=None, leading_lines=())).splitlines()[0]
    own, body = list(block.leading_lines), list(block.body.body)
    inner = list(body[0].leading_lines) if body else []
    for lines, on_block in ((own, True), (inner, False)):
        notes = [index for index, line in enumerate(lines) if line.comment is not None
                 and line.comment.value.startswith(NOTE)]
        if len(notes) != 1 or notes[0] != len(lines) - 1:
            continue  # none, several, or one the model's own comments follow
        comment = lines[-1].comment
        if len(header) + 2 + len(comment.value) > width:
            return block
        noted = block.with_changes(body=block.body.with_changes(
            header=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=comment)))
        if on_block:
            return noted.with_changes(leading_lines=lines[:-1])
        return noted.with_changes(body=noted.body.with_changes(
            body=[body[0].with_changes(leading_lines=lines[:-1]), *body[1:]]))
    return block


def _without_blank_start(body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    if not body:
        return body
    comments = [line for line in body[0].leading_lines if line.comment is not None]
    return [body[0].with_changes(leading_lines=comments), *body[1:]]


def _merged_signature(original: cst.Parameters, adapted: cst.Parameters) -> tuple[cst.Parameters, list[str]]:
    """The dispatcher's parameters and the arguments it hands the twin.

    The twin takes the adapted parameters. The dispatcher keeps every original parameter as it was, and adds the
    adapted ones the original lacks (the codemods add them with defaults). A positional parameter the codemods
    renamed (`start_pos` -> `input_pos`) keeps its original name there and is handed on by position.
    """
    original_positional = [*original.posonly_params, *original.params]
    adapted_positional = [*adapted.posonly_params, *adapted.params]
    by_name = {p.name.value: p for p in original_positional}
    adapted_names = {p.name.value for p in adapted_positional}
    positional: list[cst.Param] = []
    for index, param in enumerate(adapted_positional):
        if param.name.value in by_name:
            positional.append(by_name[param.name.value])
        elif index < len(original_positional) and original_positional[index].name.value not in adapted_names:
            positional.append(original_positional[index])  # renamed
        else:
            positional.append(param)
    if {p.name.value for p in original_positional} - {p.name.value for p in positional}:
        raise _Unsplittable("the codemods removed a parameter")
    arguments = [p.name.value for p in positional[1:]]
    if isinstance(adapted.star_arg, cst.Param):
        arguments.append(f"*{adapted.star_arg.name.value}")
    original_kwonly = {k.name.value for k in original.kwonly_params}
    kwonly = [*original.kwonly_params, *(p for p in adapted.kwonly_params if p.name.value not in original_kwonly)]
    arguments += [f"{p.name.value}={p.name.value}" for p in adapted.kwonly_params]
    if adapted.star_kwarg is not None:
        arguments.append(f"**{adapted.star_kwarg.name.value}")
    star_arg = original.star_arg if isinstance(original.star_arg, cst.Param) or not kwonly else adapted.star_arg
    posonly_count = len(original.posonly_params)
    merged = original.with_changes(posonly_params=positional[:posonly_count], params=positional[posonly_count:],
                                   star_arg=star_arg, kwonly_params=kwonly,
                                   star_kwarg=original.star_kwarg or adapted.star_kwarg)
    return merged, arguments


def renamed_parameters(original: cst.Parameters, adapted: cst.Parameters) -> dict[str, str]:
    """Positional parameters the codemods renamed: adapted name -> original name."""
    original_positional = [*original.posonly_params, *original.params]
    adapted_positional = [*adapted.posonly_params, *adapted.params]
    original_names = {p.name.value for p in original_positional}
    adapted_names = {p.name.value for p in adapted_positional}
    return {a.name.value: o.name.value for o, a in zip(original_positional, adapted_positional)
            if a.name.value not in original_names and o.name.value not in adapted_names}


class _Unsplittable(Exception):
    """A changed function whose original cannot ask the switch; it keeps its adapted form."""


def _put_back_statements(original: cst.Module, adapted: cst.Module) -> cst.Module:
    """Top-level statements of the original that the chain removed (an import only the original body reads) go back
    where they were, after the statement that came before them."""
    body = list(adapted.body)
    keys = [_key(stmt) for stmt in body]
    cursor = -1
    changed = False
    for stmt in original.body:
        key = _key(stmt)
        trimmed = _trimmed_import(stmt, body)
        if key in keys[cursor + 1:]:
            cursor = keys.index(key, cursor + 1)
        elif key in keys:
            cursor = max(cursor, keys.index(key))
        elif trimmed is not None:
            # The chain dropped some names of this import (only the original body reads them): the original import
            # goes back in its place, not beside it, or the file would import the rest twice.
            body[trimmed], keys[trimmed], changed = stmt, key, True
            cursor = max(cursor, trimmed)
        else:
            body.insert(cursor + 1, stmt)
            keys.insert(cursor + 1, key)
            cursor += 1
            changed = True
    return adapted.with_changes(body=body) if changed else adapted


def _from_import(stmt: cst.BaseStatement) -> cst.ImportFrom | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.ImportFrom) \
            and not isinstance(stmt.body[0].names, cst.ImportStar):
        return stmt.body[0]
    return None


def _trimmed_import(stmt: cst.BaseStatement, body: list[cst.BaseStatement]) -> int | None:
    """Where `body` holds `stmt`, a `from X import ...`, with fewer of its names (none other): its index, else None."""
    imported = _from_import(stmt)
    if imported is None:
        return None
    source = (len(imported.relative), code_of(imported.module) if imported.module is not None else "")
    names = _imported_names(imported)
    for index, other in enumerate(body):
        candidate = _from_import(other)
        if candidate is not None and (len(candidate.relative), code_of(candidate.module) if candidate.module
                                      is not None else "") == source \
                and _imported_names(candidate) < names:
            return index
    return None


def _imported_names(imported: cst.ImportFrom) -> set[tuple[str, str | None]]:
    return {(code_of(alias.name), code_of(alias.asname.name) if alias.asname else None) for alias in imported.names}


def _key(stmt: cst.BaseStatement) -> str:
    if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
        return f"def {stmt.name.value}"
    return code_of(stmt.with_changes(leading_lines=())).strip()
