"""Which same-file method calls which, and passing `position_ids` down those calls.

A static cache is written at the positions, and a causal mask is picked by them, in methods deep inside the
model (attention, its `_attn` helper, a positional embedding) that the model's callers never hand positions to.
The calls between the file's modules are followed through `self.<attr>(...)` where `__init__` assigns
`self.<attr> = Class(...)` (or an `nn.ModuleList` of them iterated by a `for` loop, or a class picked from a
table of them), chains of such attributes (`self.model.decoder(...)`), `self.<method>(...)` in the same class and
`super().<method>(...)`.
"""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.cstutil import code_of, dotted_name, find_method, single_assignment, walk

THREADED = "position_ids"  # the parameter passed down to methods that have no positions

Method = tuple[str, str]  # (class, method)


class Threading:
    """Passes `position_ids` down the calls from the nearest method that has it to each method that needs it.

    `sources` are methods that will have positions of their own (derived there, see `_new_positions`) though
    they do not take them yet. With `entry`, the model class's `forward` the harness calls, only methods it calls
    (at any depth) count as having positions: another head class of the file that takes `position_ids` does not
    help the model the harness runs. Positions are then also passed from the entry down to each source, so that
    callers can hand them in. Every class a passing call may reach takes the new parameter."""

    def __init__(self, calls: CallGraph, needs: set[Method], sources: frozenset[Method] = frozenset(),
                 entry: Method | None = None) -> None:
        self.classes = classes = calls.classes
        self.sources = sources
        self.params: set[Method] = set()  # (class, method) that get a `position_ids=None` parameter
        self.calls: set[cst.Call] = set()  # calls that pass `position_ids=position_ids`
        self.missing: list[tuple[cst.CSTNode, str]] = []
        self.callers = callers = calls.callers
        self.live = self._called_from(entry) if entry is not None else None
        reached: dict[Method, bool] = {}
        for need in sorted(needs):
            if need not in sources and not self._reach(need, callers, reached):
                cls, method = need
                self.missing.append((find_method(classes[cls], method) or classes[cls],
                                     f"`{cls}.{method}` has no positions and no caller in this file passes them down"))
        self.params |= {s for s in sources if not self._has(s)}
        if entry is not None and sources:
            self._down_to_sources(entry, {})
        for callee, sites in callers.items():  # the other classes a passing call may reach must accept it
            if any(call in self.calls for _, call in sites) and find_method(classes[callee[0]], callee[1]) is not None \
                    and not self._has(callee):
                self.params.add(callee)

    def _has(self, method: Method) -> bool:
        found = find_method(self.classes[method[0]], method[1])
        return found is not None and THREADED in {p.name.value for p in found.params.params}

    def _reach(self, target: Method, callers: dict, reached: dict) -> bool:
        """Whether positions can be passed down to `target`; marks the params and calls that do it."""
        if target in reached:
            return reached[target]
        reached[target] = False  # a call cycle reaches nothing new
        found = False
        for caller, call in callers.get(target, []):
            if self.live is not None and caller not in self.live:
                continue
            if self._has(caller) or caller in self.sources or self._reach(caller, callers, reached):
                self.calls.add(call)
                found = True
        if found:
            self.params.add(target)
        reached[target] = found
        return found

    def _called_from(self, entry: Method) -> set[Method]:
        """`entry` and every method it calls, at any depth."""
        callees: dict[Method, list[Method]] = {}
        for callee, sites in self.callers.items():
            for caller, _ in sites:
                callees.setdefault(caller, []).append(callee)
        seen, todo = {entry}, [entry]
        while todo:
            for callee in callees.get(todo.pop(), []):
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
        return seen

    def _down_to_sources(self, method: Method, seen: dict[Method, bool]) -> bool:
        """Whether a source is reached by calls from `method`; marks the calls and params on the way."""
        if method in seen:
            return seen[method]
        seen[method] = method in self.sources  # a call cycle reaches nothing new
        found = seen[method]
        for callee, sites in self.callers.items():
            for caller, call in sites:
                if caller == method and self._down_to_sources(callee, seen):
                    self.calls.add(call)
                    found = True
        if found and method not in self.sources and not self._has(method):
            self.params.add(method)
        seen[method] = found
        return found


class CallGraph:
    """Each same-file method with the calls that reach it: (calling method, call). Built once for a file, as every
    `Threading` over it follows the same calls."""

    def __init__(self, classes: dict[str, cst.ClassDef], tables: dict[str, set[str]]) -> None:
        self.classes = classes
        self.callers: dict[Method, list[tuple[Method, cst.Call]]] = {}
        members = {name: _members(cls, set(classes), tables) for name, cls in classes.items()}
        for cls in classes.values():
            bases = [code_of(b.value) for b in cls.bases if code_of(b.value) in classes]
            for method in cls.body.body:
                if not isinstance(method, cst.FunctionDef):
                    continue
                for call, callee in _calls(method, cls.name.value, members, bases[0] if bases else None):
                    self.callers.setdefault(callee, []).append(((cls.name.value, method.name.value), call))


def _members(cls: cst.ClassDef, known: set[str], tables: dict[str, set[str]]) -> dict[str, set[str]]:
    """`self.attr` -> the same-file classes its `__init__` makes it: directly, as an nn.ModuleList of them, or
    through a class picked from a module-level table (`attention_class = ATTENTION_CLASSES[config.impl]`)."""
    init = find_method(cls, "__init__")
    found: dict[str, set[str]] = {}
    if init is None:
        return found
    picked: dict[str, set[str]] = {}  # local name -> the classes a table lookup may give it

    class _Collector(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            target = node.targets[0].target
            if len(node.targets) != 1:
                return
            if isinstance(target, cst.Name) and isinstance(node.value, cst.Subscript) \
                    and code_of(node.value.value) in tables:
                picked[target.value] = tables[code_of(node.value.value)]
                return
            if not (isinstance(target, cst.Attribute) and code_of(target.value) == "self"):
                return
            made = set().union(*[picked.get(c, {c}) for c in _constructed(node.value)]) & known
            if made:
                found[target.attr.value] = made

    init.visit(_Collector())
    return found


def class_tables(module: cst.Module, known: set[str]) -> dict[str, set[str]]:
    """Module-level dicts whose values are all same-file classes: `ATTENTION_CLASSES = {"eager": A, "sdpa": B}`."""
    tables: dict[str, set[str]] = {}
    for stmt in module.body:
        assigned = single_assignment(stmt)
        if assigned and isinstance(assigned[1], cst.Dict) and assigned[1].elements:
            values = {code_of(e.value) for e in assigned[1].elements if isinstance(e, cst.DictElement)}
            if values <= known and len(values) == len(assigned[1].elements):
                tables[assigned[0]] = values
    return tables


def _constructed(value: cst.BaseExpression) -> list[str]:
    """Class names called in `X(...)`, `nn.ModuleList([X(...) for ...])`, `nn.ModuleList(X(...) for ...)`."""
    names: list[str] = []

    class _Collector(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            name = dotted_name(node.func)
            if name:
                names.append(name.rsplit(".", 1)[-1])

    value.visit(_Collector())
    return names


def _calls(method: cst.FunctionDef, cls: str, members: dict[str, dict[str, set[str]]],
           base: str | None) -> list[tuple[cst.Call, Method]]:
    """The calls in `method` to same-file modules' forward (through attributes of `self`, or chains of them), to
    methods of its own class, and to its same-file base class's methods through `super()`."""
    loops: dict[str, str] = {}  # loop variable -> member it iterates
    found: list[tuple[cst.Call, Method]] = []
    own = members.get(cls, {})
    for node in walk(method):  # in source order: a loop is seen before the calls in its body
        if isinstance(node, cst.For):
            for name, member in _loop_bindings(node.target, node.iter):
                if member in own:
                    loops[name] = member
        elif isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Name) and func.value in loops:
                found.extend((node, (c, "forward")) for c in sorted(own[loops[func.value]]))
            elif isinstance(func, cst.Attribute) and code_of(func.value) == "self":
                name = func.attr.value
                if name in own:
                    found.extend((node, (c, "forward")) for c in sorted(own[name]))
                else:
                    found.append((node, (cls, name)))
            elif isinstance(func, cst.Attribute) and code_of(func.value) == "super()" and base is not None:
                found.append((node, (base, func.attr.value)))
            elif isinstance(func, cst.Attribute):
                found.extend((node, (c, "forward")) for c in sorted(_through(func, cls, members)))
    return found


def _through(func: cst.Attribute, cls: str, members: dict[str, dict[str, set[str]]]) -> set[str]:
    """The classes `self.a.b.c` may be, following each attribute through the members of the classes before it."""
    chain: list[str] = []
    node: cst.BaseExpression = func
    while isinstance(node, cst.Attribute):
        chain.insert(0, node.attr.value)
        node = node.value
    if not (isinstance(node, cst.Name) and node.value == "self") or len(chain) < 2:
        return set()
    current = {cls}
    for attr in chain:
        current = set().union(*(members.get(c, {}).get(attr, set()) for c in current))
    return current


def _loop_bindings(target: cst.BaseExpression, iterable: cst.BaseExpression) -> list[Method]:
    """(loop name, member) pairs: `for b in self.h`, `for b, p in zip(self.h, ...)`, `enumerate(...)`."""
    if isinstance(iterable, cst.Attribute) and code_of(iterable.value) == "self" and isinstance(target, cst.Name):
        return [(target.value, iterable.attr.value)]
    if isinstance(iterable, cst.Call) and isinstance(target, (cst.Tuple, cst.List)):
        name = dotted_name(iterable.func)
        elements = [e.value for e in target.elements]
        args = [a.value for a in iterable.args]
        if name == "enumerate" and len(elements) == 2 and args:
            return _loop_bindings(elements[1], args[0])
        if name == "zip" and len(elements) == len(args):
            return [pair for t, a in zip(elements, args) for pair in _loop_bindings(t, a)]
    return []
