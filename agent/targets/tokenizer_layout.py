"""Where a remote-code tokenizer puts its special tokens around a prompt, read from its own source (nothing runs).

A model published with its own `tokenization_*.py` says in `build_inputs_with_special_tokens` how a prompt is laid
out, and some models depend on that layout: ChatGLM-6B (GLM v1) finds the end of the context at its `<sop>` token
and its mask token before it, both *after* the text (`token_ids_0 + [gmask_id, sop_id]`), where ChatGLM2/3 put
`[gMASK] sop` first. The method is read with Python's `ast` and followed symbolically for one prompt and no second
sequence: lists, `+`, local names, `if token_ids_1 ...` branches, `self.add_bos_token`-style switches (from
tokenizer_config.json, else the default of `__init__`'s parameter of that name), and helper methods of the same class
with no parameters (`self.get_prefix_tokens()`). A special token comes out as a `TokenRef`: the name of the
tokenizer attribute that holds it (`self.gmask_token`, `self.bos_token_id`) or the literal the code looks it up by
(`self.get_command("sop")`). Anything else (a loop, a call into the vocabulary with a computed argument) gives no
layout, and the caller keeps to the config's fields.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

METHOD = "build_inputs_with_special_tokens"
_TEXT = object()  # the prompt's own ids (token_ids_0) inside the evaluated list
_LOOKUPS = frozenset({"get_command", "convert_tokens_to_ids", "_convert_token_to_id", "token_to_id"})


@dataclass(frozen=True)
class TokenRef:
    """A special token as the tokenizer's code names it: an attribute (`gmask_token`, `bos_token_id`) or a literal
    the code looks up (`sop`, `[gMASK]`)."""
    name: str
    literal: bool = False


@dataclass
class Layout:
    prefix: list[TokenRef] = field(default_factory=list)
    suffix: list[TokenRef] = field(default_factory=list)
    where: str = ""  # file:line of the method read


class _Unreadable(Exception):
    """The method does something this reader does not follow."""


def special_layout(folder: Path, tokenizer_config: dict) -> Layout | None:
    """The layout the folder's own tokenizer gives one prompt, or None where no `tokenization_*.py` defines
    `build_inputs_with_special_tokens` in a form read here."""
    for path in sorted(folder.glob("tokenization_*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        methods = _tokenizer_methods(tree)
        if methods is not None:
            return _layout(methods, tokenizer_config, path)
    return None


def _tokenizer_methods(tree: ast.Module) -> dict[str, ast.FunctionDef] | None:
    """The methods of the file's first class that defines build_inputs_with_special_tokens; None when none does."""
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        if METHOD in methods:
            return methods
    return None


def _layout(methods: dict[str, ast.FunctionDef], tokenizer_config: dict, path: Path) -> Layout | None:
    """The layout build_inputs_with_special_tokens gives one prompt: the ids around the text, where the text comes
    once; None when the method is not read here."""
    try:
        ids = _Reader(methods, tokenizer_config).prompt(methods[METHOD])
    except _Unreadable:
        return None
    if ids.count(_TEXT) != 1:
        return None
    at = ids.index(_TEXT)
    return Layout(prefix=ids[:at], suffix=ids[at + 1:], where=f"{path.name}:{methods[METHOD].lineno}")


class _Reader:
    def __init__(self, methods: dict[str, ast.FunctionDef], tokenizer_config: dict) -> None:
        self.methods, self.tokenizer_config = methods, tokenizer_config
        init = methods.get("__init__")
        self.defaults = _parameter_defaults(init) if init else {}

    def prompt(self, method: ast.FunctionDef) -> list:
        params = [a.arg for a in method.args.args]
        if len(params) < 2:
            raise _Unreadable
        scope = {params[1]: [_TEXT]}
        if len(params) > 2:
            scope[params[2]] = None  # one sequence, no pair
        return self._body(method.body, scope)

    def _body(self, body: list[ast.stmt], scope: dict):
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if isinstance(stmt, ast.Return):
                return self._value(stmt.value, scope)
            if _assigns_one_name(stmt):
                scope[stmt.targets[0].id] = self._value(stmt.value, scope)
            elif isinstance(stmt, ast.If):
                taken = stmt.body if self._truth(stmt.test, scope) else stmt.orelse
                found = self._body(taken, scope)
                if found is not None:
                    return found
            else:
                raise _Unreadable
        return None

    def _value(self, node: ast.expr | None, scope: dict):
        """An expression's value: a list of ids, one id, a TokenRef or None."""
        if isinstance(node, ast.List):
            return [item for element in node.elts for item in self._as_list(self._value(element, scope))]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._as_list(self._value(node.left, scope)) + self._as_list(self._value(node.right, scope))
        if isinstance(node, ast.IfExp):
            return self._value(node.body if self._truth(node.test, scope) else node.orelse, scope)
        return self._leaf(node, scope)

    def _leaf(self, node: ast.expr | None, scope: dict):
        """A name the method assigned, an id or None written out, or a token the tokenizer holds."""
        if isinstance(node, ast.Name) and node.id in scope:
            return scope[node.id]
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, int)):
            return node.value
        return self._held_by_self(node, scope)

    def _held_by_self(self, node: ast.expr | None, scope: dict):
        """A token the tokenizer itself holds or looks up: an attribute, an item of one, or a method's result."""
        if _on_self(node):  # self.bos_token_id
            return TokenRef(node.attr)
        if isinstance(node, ast.Subscript) and _on_self(node.value):  # self.sp_tokenizer[self.gmask_token]
            return self._token(node.slice, scope)
        if isinstance(node, ast.Call) and _on_self(node.func) and not node.keywords:
            return self._call(node, scope)
        raise _Unreadable

    @staticmethod
    def _as_list(value) -> list:
        if isinstance(value, list):
            return value
        if value is None:
            raise _Unreadable
        return [value]  # one token

    def _call(self, node: ast.Call, scope: dict):
        name = node.func.attr
        if name in _LOOKUPS and len(node.args) == 1:
            return self._token(node.args[0], scope)
        method = self.methods.get(name)
        if method is not None and not node.args and len(method.args.args) == 1:
            found = self._body(method.body, {})
            if found is None:
                raise _Unreadable
            return found
        raise _Unreadable

    def _token(self, node: ast.expr, scope: dict) -> TokenRef:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return TokenRef(node.value, literal=True)
        value = self._value(node, scope)
        if isinstance(value, TokenRef):
            return value
        raise _Unreadable

    def _truth(self, test: ast.expr, scope: dict) -> bool:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return not self._truth(test.operand, scope)
        if _is_none_test(test):
            same = self._value(test.left, scope) is None
            return same if isinstance(test.ops[0], ast.Is) else not same
        if isinstance(test, ast.Name) and test.id in scope:
            return bool(scope[test.id])
        if _on_self(test) and test.attr.startswith("add_"):  # self.add_bos_token: a switch of the tokenizer's
            return self._switch(test.attr)
        raise _Unreadable

    def _switch(self, name: str) -> bool:
        """A tokenizer switch (add_bos_token...): tokenizer_config.json's value, else __init__'s default."""
        if isinstance(self.tokenizer_config.get(name), bool):
            return self.tokenizer_config[name]
        if isinstance(self.defaults.get(name), bool):
            return self.defaults[name]
        raise _Unreadable


def _assigns_one_name(stmt: ast.stmt) -> bool:
    """`name = value`: one plain name assigned."""
    return isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)


def _is_none_test(test: ast.expr) -> bool:
    """`x is None` or `x is not None`."""
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot)) \
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None


def _on_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _parameter_defaults(function: ast.FunctionDef) -> dict[str, object]:
    """`__init__`'s parameters with constant defaults -> the default."""
    positional = function.args.args[len(function.args.args) - len(function.args.defaults):]
    pairs = [*zip(positional, function.args.defaults), *zip(function.args.kwonlyargs, function.args.kw_defaults)]
    return {arg.arg: default.value for arg, default in pairs if isinstance(default, ast.Constant)}
