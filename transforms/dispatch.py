"""A libcst transformer whose handlers are looked up once per class and node type, not on every visit.

libcst's `CSTTransformer` finds `visit_<Type>`, `leave_<Type>`, `visit_<Type>_<field>` and `leave_<Type>_<field>` by
building the name and asking `getattr` for it at every node and every field of every node: four lookups per node,
most of them failing, a fifth of a codemod's walk. `Transformer` asks once per class and node type, and skips the
field hooks of a class that defines none. It calls the same methods with the same arguments, so a subclass is
written as for `CSTTransformer` (handlers are methods of the class, not attributes set on an instance).
"""
from __future__ import annotations

import functools
import types
from collections.abc import Callable

import libcst as cst

_NODE_TYPES = frozenset(name for name in dir(cst) if isinstance(getattr(cst, name), type)
                        and issubclass(getattr(cst, name), cst.CSTNode))


class Transformer(cst.CSTTransformer):
    # The look-ups below are dict items, not functools.cache calls: they are made for every node a walk meets (and
    # the field hooks' for every field of it), where a cached call costs as much as the rest of the dispatch.
    def on_visit(self, node: cst.CSTNode) -> bool:
        visit = _HANDLERS[type(self), type(node)][0]
        return visit is None or visit(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        leave = _HANDLERS[type(self), type(original_node)][1]
        return updated_node if leave is None else leave(self, original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if _FIELD_HOOKS[type(self)]:
            super().on_visit_attribute(node, attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        if _FIELD_HOOKS[type(self)]:
            super().on_leave_attribute(original_node, attribute)


class Computed(dict):
    """`compute(key)` for each key (`compute(*key)` for a tuple), computed the first time it is asked and read after
    as a dict item: for a fact about a type asked at every node of a walk, where functools.cache's call costs as much
    as the rest of the step."""

    def __init__(self, compute: Callable) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, key):
        value = self[key] = self._compute(*key) if type(key) is tuple else self._compute(key)
        return value


@functools.cache
def _handlers(owner: type, node_type: type) -> tuple[Callable | None, Callable | None]:
    """The class's `visit_<Type>` and `leave_<Type>` functions (None where it has none)."""
    return (_function(owner, f"visit_{node_type.__name__}"), _function(owner, f"leave_{node_type.__name__}"))


def _function(owner: type, name: str) -> Callable | None:
    """The function the class defines under that name; None for none, or for one of libcst's typed stubs, which do
    nothing (a visit that returns None, a leave that returns the updated node) and which libcst marks as such."""
    for klass in owner.__mro__:
        if name in klass.__dict__:
            found = klass.__dict__[name]
            if getattr(found, "_is_no_op", False):
                return None
            if not isinstance(found, types.FunctionType):
                raise TypeError(f"{owner.__name__}.{name} must be a plain method")
            return found
    return None


@functools.cache
def handled_types(owner: type) -> frozenset[type] | None:
    """The node types the class has a `visit_<Type>` or `leave_<Type>` for; None when it has field hooks, whose
    calls come with every field of every node whatever its type. A walk that meets no node of these types calls
    nothing of the class's own, so it may pass over a subtree that holds none (base.GraphCodemod.on_visit)."""
    if _field_hooks(owner):
        return None
    return frozenset(getattr(cst, name) for name in _NODE_TYPES if any(_handlers(owner, getattr(cst, name))))


@functools.cache
def _field_hooks(owner: type) -> bool:
    """Whether the class defines any `visit_<Type>_<field>` or `leave_<Type>_<field>` of its own."""
    return any(name.startswith(("visit_", "leave_")) and "_" in name[6:] and name[6:].split("_", 1)[0] in _NODE_TYPES
               and _function(owner, name) is not None for name in dir(owner))


_HANDLERS: dict[tuple[type, type], tuple[Callable | None, Callable | None]] = Computed(_handlers)
_FIELD_HOOKS: dict[type, bool] = Computed(_field_hooks)
