"""One helper per question, and one `ast` parse per text.

transforms/cstutil.py holds the helpers on libcst's tree (the codemods'), transforms/analysis/astutil.py those on
Python's AST (the rules' and the analyses'). A public name in both is a twin: two implementations of one question
that drift apart. Where both trees need an answer, the two names say which tree each reads, and each docstring says
why it is kept.

A codemod that wants a fact about the source computed on Python's AST reads it off the chain's parse by position
(`GraphCodemod.ast_of`); printing a libcst node (`code_of`, `code_for_node`) only to hand the text to `ast.parse` is
the round trip that parse replaced. The sources are read with `ast`, not imported.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.metadata import ParentNodeProvider

from graphmode.transforms.codemods.base import GraphCodemod, Options
from graphmode.transforms.cstutil import code_of
from graphmode.transforms.parsed import ParsedSource

TRANSFORMS = Path(__file__).resolve().parents[1] / "transforms"
CSTUTIL = TRANSFORMS / "cstutil.py"
ASTUTIL = TRANSFORMS / "analysis" / "astutil.py"
CODEMODS = TRANSFORMS / "codemods"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "codemods"
PRINTERS = frozenset({"code_of", "code_for_node"})
# Round trips kept, each with why: the nodes printed there are not all in the source.
KEPT_ROUND_TRIPS = {
    ("write_paths.py", "_normal"): "compares blocks that hold statements the module builds (the write, rebuilt ifs)",
}


def _public_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")}


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _prints(node: ast.AST, printed: set[str]) -> bool:
    """The expression holds a print of a node: a printer's call, or a name bound to one's text."""
    return any((isinstance(n, ast.Call) and _called_name(n) in PRINTERS)
               or (isinstance(n, ast.Name) and n.id in printed) for n in ast.walk(node))


def _round_trips(source: str) -> list[tuple[str, int]]:
    """(function, line) of each `ast.parse` of printed libcst code in a module's source."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        printed: set[str] = set()
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and _prints(node.value, printed):
                printed |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast" \
                    and any(_prints(arg, printed) for arg in node.args):
                found.append((function.name, node.lineno))
    return found


def test_no_public_helper_is_defined_for_both_trees():
    both = _public_functions(CSTUTIL) & _public_functions(ASTUTIL)
    assert both == set(), f"twins in cstutil.py and analysis/astutil.py: {sorted(both)}; keep one, or name each for " \
                          "the tree it reads and say in its docstring why both stay"


def test_the_helper_files_are_read():
    assert {"dotted_name", "names_in", "walk"} <= _public_functions(CSTUTIL)
    assert {"ast_dotted_name", "ast_names_in", "preorder"} <= _public_functions(ASTUTIL)


def test_codemods_do_not_parse_printed_nodes_again():
    found = {(path.name, function): line for path in sorted(CODEMODS.rglob("*.py"))
             for function, line in _round_trips(path.read_text(encoding="utf-8"))}
    unexplained = {key: line for key, line in found.items() if key not in KEPT_ROUND_TRIPS}
    assert unexplained == {}, "a codemod prints a node and parses the text with `ast`: look the node up in the " \
                              f"chain's parse instead (`GraphCodemod.ast_of`): {unexplained}"
    assert set(KEPT_ROUND_TRIPS) <= set(found), f"stale entries: {set(KEPT_ROUND_TRIPS) - set(found)}"


def test_the_round_trip_check_sees_one():
    """The pattern as it was written before (a name bound to a print, parsed on a later line), caught."""
    source = ("def one_line(test):\n"
              "    code = code_of(test).strip()\n"
              "    return code if '\\n' not in code else ast.unparse(ast.parse(code, mode='eval'))\n"
              "def direct(value):\n"
              "    return ast.parse(' '.join(cst.Module([]).code_for_node(value).split()))\n"
              "def fine(text):\n"
              "    return ast.parse(text)\n")
    assert _round_trips(source) == [("one_line", 3), ("direct", 5)]


# -- the look-up that replaced the round trips ---------------------------------------------------------------------

_TRICKY = '''import torch
class M(torch.nn.Module):
    @torch.no_grad()
    async def f(self, x, *a, **k):
        s = "héllo wörld"; y = (x, s)
        z = ((x, y))
        q = sum(v for v in y) + f"{x!r:>{3}} é {y}"
        w = torch.where(x > 0, (x + \\
            1), x)
        t = (
            x  # a comment
            + 1
        )
        if (n := len(y)) > 2 and not x.any():
            pass
        return [*a], {**k}, x[1:2, ...], x[::2], -x, lambda p, b=1: p + b, (yield x)
\r
def g():
\treturn (1,)\r
'''


class _Probe(GraphCodemod):
    """Looks every expression and function of the text up in the chain's parse, and parses its print again."""

    NAME = "probe"

    def __init__(self) -> None:
        super().__init__(CodemodContext(), Options())
        self.pairs: list[tuple[str, str, str]] = []  # (what, looked up, parsed again)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.FunctionDef):
            again = ast.parse(textwrap.dedent(code_of(node.with_changes(decorators=[])))).body[0]
            self.pairs.append((code_of(node.name), _dump(self.ast_of(node).body), _dump(again.body)))
        elif isinstance(node, cst.BaseExpression) and not self._named_only(node):
            try:
                again = ast.parse(f"({code_of(node)})", mode="eval").body
            except SyntaxError:  # `*a` on its own
                again = None
            if again is not None:
                self.pairs.append((code_of(node), _dump(self.ast_of(node)), _dump(again)))
        return super().on_visit(node)

    def _named_only(self, node: cst.CSTNode) -> bool:
        """A name `ast` keeps as a string (of a def, an attribute, a parameter, a keyword, an import), not as an
        expression of its own."""
        parent = self.get_metadata(ParentNodeProvider, node)
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param)) and node is parent.name \
                or isinstance(parent, cst.Attribute) and node is parent.attr \
                or isinstance(parent, cst.Arg) and node is parent.keyword or isinstance(parent, cst.NameItem):
            return True
        if isinstance(parent, cst.AsName):
            return not isinstance(self.get_metadata(ParentNodeProvider, parent), cst.WithItem)
        while parent is not None and not isinstance(parent, (cst.Import, cst.ImportFrom)):
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        return parent is not None


def _dump(node: ast.AST | list[ast.AST]) -> str:
    """The tree without load/store contexts: a target parsed on its own loads."""
    text = ast.dump(ast.Module(node, []) if isinstance(node, list) else node)
    return text.replace("ctx=Store()", "ctx=Load()").replace("ctx=Del()", "ctx=Load()")


def test_each_original_node_is_found_in_the_chains_parse_as_its_print_parses():
    """`ast_of` gives, for every expression and function of the fixtures, what printing it and parsing the text gave
    (positions in characters where `ast` counts bytes, parentheses `ast` counts as a tuple's own, `\\r\\n` lines)."""
    texts = [_TRICKY, *(path.read_text(encoding="utf-8") for path in sorted(FIXTURES.glob("*/*.in.py")))]
    found = 0
    for text in texts:
        probe = _Probe()
        probe.transform_source(ParsedSource(text))
        assert [p for p in probe.pairs if p[1] != p[2]] == []
        found += len(probe.pairs)
    assert found > 1000
