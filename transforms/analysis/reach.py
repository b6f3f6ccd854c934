"""Which functions of a file run in a model step: the ones rules may report in.

The roots are the step methods of module classes (`forward`, `decode`, ...); from there the
functions they call, as `self.method(...)` or as a function of the same file, are followed.
A training loop or a data loader that no step calls is not reached, so it is not reported.
"""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import FUNCTION_TYPES

SWITCH_TEST = "graphmode_static_path"  # the helper the originals of rewritten methods ask first
STEP_METHODS = frozenset({"forward", "decode", "prefill", "decode_one_token", "prefill_forward", "_forward"})

Function = ast.FunctionDef | ast.AsyncFunctionDef


def reachable_functions(module: ast.Module, calls: dict[Function, tuple[set[str], set[str]]] | None = None
                        ) -> set[Function]:
    """The functions of the module a step reaches. `calls`: `_calls` of the functions asked before, by function, which
    the walk reads and adds to (a function's node never changes, so the codemod chain hands the table from one text
    to the next, whose unchanged statements hold the same nodes)."""
    calls = {} if calls is None else calls
    functions = {s.name: s for s in module.body if isinstance(s, FUNCTION_TYPES)}
    classes = {s.name: s for s in module.body if isinstance(s, ast.ClassDef)}
    methods = {name: _methods(cls) for name, cls in classes.items()}

    pending = _step_entries(functions, methods)
    reached: set[Function] = set()
    while pending:
        function, owner = pending.pop()
        if function in reached:
            continue
        twin = static_twin(function)
        if twin is None:
            reached.add(function)
        # A method with a twin runs its own body for every caller but the entries: only its twin is step code.
        pending += _callees(function, owner, twin, functions, classes, methods, calls)
    return reached


def _step_entries(functions: dict[str, Function], methods: dict[str, dict[str, Function]]
                  ) -> list[tuple[Function, str | None]]:
    """The methods (with their class) and functions named as step entries: where the walk starts."""
    return [(method, name) for name, found in methods.items() for method_name, method in found.items()
            if method_name in STEP_METHODS] + [(function, None) for name, function in functions.items()
                                               if name in STEP_METHODS]


def _callees(function: Function, owner: str | None, twin: str | None, functions: dict[str, Function],
             classes: dict[str, ast.ClassDef], methods: dict[str, dict[str, Function]],
             calls: dict[Function, tuple[set[str], set[str]]]) -> list[tuple[Function, str | None]]:
    """What a reached function hands on to the step: its twin alone where it has one, else every method it calls
    on `self` and every function of the file it calls by name."""
    if twin is not None:
        found = _lookup(owner, twin, classes, methods)
        return [(found, owner)] if found is not None else []
    if function not in calls:
        calls[function] = _calls(function)
    on_self, plain = calls[function]
    found = [(method, owner) for method in (_lookup(owner, name, classes, methods) for name in on_self)
             if method is not None]
    return found + [(functions[name], None) for name in plain if name in functions]


def static_twin(function: Function) -> str | None:
    """The twin a method hands the static path to (transforms/output/static_path.py), from its first statement
    `if graphmode_static_path(self): return self.<twin>(...)`; None for any other function."""
    body = function.body[1:] if ast.get_docstring(function, clean=False) is not None else function.body
    if not body or body[0].__class__ is not ast.If:
        return None
    test, then = body[0].test, body[0].body
    if not (test.__class__ is ast.Call and test.func.__class__ is ast.Name and test.func.id == SWITCH_TEST
            and len(then) == 1 and then[0].__class__ is ast.Return and then[0].value.__class__ is ast.Call):
        return None
    call = then[0].value.func
    return call.attr if call.__class__ is ast.Attribute else None


def _methods(cls: ast.ClassDef) -> dict[str, Function]:
    return {s.name: s for s in cls.body if isinstance(s, FUNCTION_TYPES)}


def _lookup(owner: str | None, name: str, classes: dict[str, ast.ClassDef],
            methods: dict[str, dict[str, Function]]) -> Function | None:
    """`self.name` on class `owner`, looking through its bases that are defined in the same file."""
    seen: set[str] = set()
    while owner is not None and owner in classes and owner not in seen:
        seen.add(owner)
        if name in methods[owner]:
            return methods[owner][name]
        bases = [b.id for b in classes[owner].bases if isinstance(b, ast.Name)]
        owner = next((b for b in bases if b in classes), None)
    return None


def asks_switch(test: ast.expr) -> bool:
    """`graphmode_static_path(self)`: true only on the static path, where a method forks
    (transforms/output/static_path.py)."""
    return test.__class__ is ast.Call and test.func.__class__ is ast.Name and test.func.id == SWITCH_TEST


def leaves_static_path(stmt: ast.stmt) -> bool:
    """`if graphmode_static_path(self): ... return ...` with no `else`: the statements after it are the model's own
    code, which the static path never reaches."""
    return stmt.__class__ is ast.If and asks_switch(stmt.test) and not stmt.orelse \
        and stmt.body[-1].__class__ in (ast.Return, ast.Raise)


def model_code_field(node: ast.AST) -> str | None:
    """The field of `node` (a statement of a forked method) that only the model's own callers run: a fork's
    `orelse` (an `else:` or the original `if` as `elif`), the `body` of `if not graphmode_static_path(self):` and of
    `if not graphmode_static_path(self) and <the original test>:`, and the `orelse` of `<static value> if
    graphmode_static_path(self) else <the original value>`; None for any other node."""
    if node.__class__ is ast.IfExp:
        return "orelse" if asks_switch(node.test) else None
    if node.__class__ is not ast.If:
        return None
    test = node.test
    if asks_switch(test):
        return "orelse"
    if test.__class__ is ast.BoolOp and test.op.__class__ is ast.And:
        test = test.values[0]
    if test.__class__ is ast.UnaryOp and test.op.__class__ is ast.Not and asks_switch(test.operand):
        return "body"
    return None


def _static_path_nodes(function: Function) -> list[ast.AST]:
    """Every node under function that the static path may run: ast.walk without what model_code_field and
    leaves_static_path set apart."""
    found, stack = [], [function]
    while stack:
        node = stack.pop()
        found.append(node)
        kind = node.__class__
        # Only an `if` and a conditional expression set code apart, and only an `if` leaves the static path: asked of
        # those alone, as `ast.iter_fields` is read without its generator (the walk of every node of every step
        # function, twice a chain).
        model_field = model_code_field(node) if kind is ast.If or kind is ast.IfExp else None
        for field in node._fields:
            if field == model_field:
                continue
            value = getattr(node, field, None)
            if type(value) is list:
                for item in value:
                    if isinstance(item, ast.AST):
                        stack.append(item)
                        if item.__class__ is ast.If and leaves_static_path(item):
                            break
            elif isinstance(value, ast.AST):
                stack.append(value)
    return found


def _calls(function: Function) -> tuple[set[str], set[str]]:
    """Names called as `self.name(...)` and as `name(...)` anywhere under function (its decorators,
    defaults and nested functions included) that the static path may run."""
    on_self: set[str] = set()
    plain: set[str] = set()
    for node in _static_path_nodes(function):
        if node.__class__ is ast.Call:
            func = node.func
            if func.__class__ is ast.Name:
                plain.add(func.id)
            elif func.__class__ is ast.Attribute and func.value.__class__ is ast.Name and func.value.id == "self":
                on_self.add(func.attr)
    return on_self, plain


def step_qualnames(source: str) -> set[str]:
    """Qualified names ("Attention.forward", "helper") of the functions a model step reaches, for
    rewrites that should touch step code only. Raises SyntaxError like ast.parse."""
    return step_qualnames_in(ast.parse(source))


def step_qualnames_in(module: ast.Module, calls: dict[Function, tuple[set[str], set[str]]] | None = None
                      ) -> set[str]:
    """`step_qualnames` of a text already parsed (the chain's one `ast` parse of it); the tree is only read.
    `calls`: as `reachable_functions` takes it."""
    reached = reachable_functions(module, calls)
    names = {f.name for f in module.body if isinstance(f, FUNCTION_TYPES) and f in reached}
    for cls in (s for s in module.body if isinstance(s, ast.ClassDef)):
        names |= {f"{cls.name}.{m.name}" for m in cls.body if isinstance(m, FUNCTION_TYPES) and m in reached}
    return names
