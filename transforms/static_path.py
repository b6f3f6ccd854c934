"""The static path beside the model's own code: what the codemods changed becomes a twin, the original stays.

The codemods rewrite functions into their static-graph form (buffers written at a position tensor, mask rows,
entries). Run in place of the original code, that form changes what every other caller gets: a caller's cache,
its padding mask, its batch size, beam search's reordering. So after the chain, every function a codemod changed
is given back its original body, and the changed body becomes a twin beside it:

    def forward(self, x, past=None, position_ids=None):
        if graphmode_static_path(self):
            return self.forward_static(x, past, position_ids)
        <the original body, as written>

    def forward_static(self, x, past=None, position_ids=None):
        <the body the codemods wrote>

`graphmode_static_path` is true only inside the `prefill`/`decode` entries (`GraphmodeStaticPath`), so a compiled
`decode` traces the twins alone and every other call runs the original. Free functions, static and class methods
have no module to ask: their twin is called by name from the other twins (`f_static(...)`), and a function that
calls such a twin gets one of its own. `__init__` keeps the codemods' version, which only adds the static buffers.
Statements outside functions the chain removed (an import only the original body uses) are put back.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.analysis.reach import SWITCH_TEST
from graphmode.transforms.codemods._helper_code import helper_statements
from graphmode.transforms.codemods._module import defined_at_top, insert_after_imports
from graphmode.transforms.cstutil import code_of, is_docstring
from graphmode.transforms.helper_module import imports_helper_module

SWITCH = "GraphmodeStaticPath"  # the helper the entries enter the static path with

TWIN_SUFFIX = "_static"
_KEPT_AS_CHANGED = frozenset({"__init__", "__new__", "__post_init__"})  # run once at construction: additions only


@dataclass
class _Plan:
    """What one file's pass decided, by qualified name (`Class.method`, `function`)."""

    dispatched: set[str] = field(default_factory=set)  # methods that ask the switch
    renamed: dict[str, str] = field(default_factory=dict)  # free/static/class function qualname -> twin name
    keywords: dict[str, str] = field(default_factory=dict)  # renamed parameter -> the name its dispatcher kept


def keep_original_path(original: cst.Module, adapted: cst.Module) -> cst.Module:
    """The adapted module with every function the chain changed split into its original and its static twin."""
    originals = dict(_functions(original))
    changed = {q: f for q, f in _functions(adapted) if q in originals and not _same(originals[q], f)}
    changed = {q: f for q, f in changed.items() if q.rsplit(".", 1)[-1] not in _KEPT_AS_CHANGED}
    if not changed:
        return _put_back_statements(original, adapted)
    plan = _Plan()
    for qualname, function in list(changed.items()):
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
    unchanged = {q: f for q, f in _functions(adapted) if q in originals and q not in changed
                 and q.rsplit(".", 1)[-1] not in _KEPT_AS_CHANGED}
    while True:
        callers = {q for q, f in unchanged.items() if q not in plan.dispatched and q not in plan.renamed
                   and _calls_any(f, plan.renamed, q)}
        if not callers:
            break
        for qualname in callers:
            changed[qualname] = unchanged[qualname]
            if _asks_switch(qualname, unchanged[qualname]):
                plan.dispatched.add(qualname)
            else:
                plan.renamed[qualname] = _twin_name(unchanged[qualname].name.value)
    module = adapted.visit(_Split(originals, changed, plan))
    module = _put_back_statements(original, module)
    if plan.dispatched and not defined_at_top(module, SWITCH_TEST):
        module = insert_after_imports(module, helper_statements(SWITCH_TEST))
    return module


def already_adapted(source: str) -> bool:
    """The text is graphmode's output: it imports graphmode's helper module (transforms/helper_module.py), or it
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


def _functions(module: cst.Module) -> Iterator[tuple[str, cst.FunctionDef]]:
    """Top-level functions and the methods of top-level (and nested) classes, by qualified name."""
    def walk(body, prefix: str):
        for stmt in body:
            if isinstance(stmt, cst.FunctionDef):
                yield prefix + stmt.name.value, stmt
            elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
                yield from walk(stmt.body.body, f"{prefix}{stmt.name.value}.")
    yield from walk(module.body, "")


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return code_of(a.with_changes(leading_lines=())) == code_of(b.with_changes(leading_lines=()))


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
    return any(_call_target(call, targets) is not None for call in _calls(function))


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class Collect(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            found.append(call)

    node.visit(Collect())
    return found


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


class _RenameCalls(cst.CSTTransformer):
    """Inside the static path: calls of renamed functions go to their twins, and a keyword argument named as the
    codemods renamed a parameter goes by the name the dispatcher kept."""

    def __init__(self, targets: dict[tuple[str | None, str], str], keywords: dict[str, str]) -> None:
        self.targets, self.keywords = targets, keywords

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


class _Split(cst.CSTTransformer):
    """Replaces each changed function by its original (asking the switch, or left as it was) and its twin; the
    functions the chain added (the entries) call the twins as the twins do."""

    def __init__(self, originals: dict[str, cst.FunctionDef], changed: dict[str, cst.FunctionDef], plan: _Plan):
        self.originals, self.changed, self.plan = originals, changed, plan
        self.scope: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scope.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.scope.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # nested functions belong to their function's body

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef):
        qualname = ".".join([*self.scope, original_node.name.value])
        renames = _RenameCalls(_rename_targets(self.plan.renamed, qualname), self.plan.keywords)
        if qualname not in self.changed:
            return updated_node if qualname in self.originals else updated_node.visit(renames)
        twin = updated_node.visit(renames).with_changes(
            name=cst.Name(_twin_name(updated_node.name.value)),
            leading_lines=[cst.EmptyLine(indent=False)] * (1 if self.scope else 2),
            decorators=[d for d in updated_node.decorators if _decorator_names([d]) & {"staticmethod", "classmethod"}])
        twin = _with_docstring(twin, f"`{updated_node.name.value}` on the static path (added by graphmode): what "
                                     "`prefill` and `decode` run.")
        original = self.originals[qualname].with_changes(leading_lines=updated_node.leading_lines)
        if qualname in self.plan.dispatched:
            original = _asking_switch(original, updated_node, twin.name.value)
        return cst.FlattenSentinel([original, twin])


def _with_docstring(function: cst.FunctionDef, text: str) -> cst.FunctionDef:
    """The twin's docstring says what it is; the original's (which describes the model) stays with the original."""
    body = list(function.body.body)
    if body and is_docstring(body[0]):
        body = body[1:]
    docstring = cst.SimpleStatementLine([cst.Expr(cst.SimpleString(f'"""{text}"""'))])
    return function.with_changes(body=function.body.with_changes(body=[docstring, *body]))


def _asking_switch(original: cst.FunctionDef, adapted: cst.FunctionDef, twin: str) -> cst.FunctionDef:
    """The original method with the adapted signature (which only adds parameters) and, first, the question."""
    params, arguments = _merged_signature(original.params, adapted.params)
    receiver = (original.params.posonly_params or original.params.params)[0].name.value
    test = cst.parse_statement(
        f"if {SWITCH_TEST}({receiver}):\n    return {receiver}.{twin}({', '.join(arguments)})\n")
    test = test.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
        "# graphmode: only the prefill/decode entries take the static path; every other call runs the code below."))])
    body = list(original.body.body)
    at = 1 if body and is_docstring(body[0]) else 0
    return original.with_changes(params=params,
                                 body=original.body.with_changes(body=[*body[:at], test, *body[at:]]))


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
