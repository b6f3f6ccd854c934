"""The codemod chain's shortcuts change nothing but its speed.

The chain skips a codemod whose `may_apply` says the text cannot hold its idiom, generates no text for a codemod
that recorded no edit, walks past function bodies a codemod has no handler for, hands a codemod's output tree to
the next one instead of parsing its text again, computes positions one top-level statement at a time with its own
code generation state, and parents while it generates the text. Each is checked here against the slow way, on
every fixture of every codemod and on the bundled examples: a codemod run in full on a text it would be skipped
for does nothing there, one that recorded no edit returns the text unchanged, a tree handed on is its text's
parse but for punctuation libcst leaves to its defaults, and the positions and parents equal libcst's own.
"""
from __future__ import annotations

import ast
import dataclasses
import gc
from pathlib import Path

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from graphmode.transforms.analysis.reach import step_qualnames
from graphmode.transforms.codemods import CHAIN, Options
from graphmode.transforms.codemods import base as codemod_base
from graphmode.transforms.codemods.base import GraphCodemod
from graphmode.transforms import pipeline
from graphmode.transforms.codemods.caches import cache_object
from graphmode.transforms.codemods.fusions import merged_projections
from graphmode.transforms.codemods.lib.fusion import replaced
from graphmode.transforms.codemods.lib.imports import with_plain_imports
from graphmode.transforms.cstutil import UNWALKED, class_level, code_of, statements_only, types_under, walk, \
    with_blocks
from graphmode.transforms.dispatch import Transformer, handled_types
from graphmode.transforms.output import static_path
from graphmode.transforms.parsed import ParsedSource, _child_nodes, _StatementPositions, _walk
from graphmode.transforms.pipeline import adapt_source
from graphmode.transforms.positions import code_for_node, function_parts_code, layout_of, module_code, \
    position_table, positions_and_parents
from graphmode.transforms.text_layout import layout_of_parsed
from test_codemods import CASES, options_for

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*/*.py") if p.name != "harness.py")
SOURCES = [*CASES, *EXAMPLES]


# The checks that run the whole chain on a source take a quarter of the fixtures each (and every example): between
# them every fixture is run through the chain's shortcuts, at a quarter of the suite's time.
QUARTERS = [[*EXAMPLES, *CASES[start::4]] for start in range(4)]


def _ids(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


@pytest.mark.parametrize("path", QUARTERS[0], ids=_ids)
def test_skipped_codemods_would_do_nothing_and_unedited_text_is_unchanged(path):
    source = path.read_text()
    options = options_for(path)
    for codemod_class in CHAIN:
        parsed = ParsedSource(source)
        own = path.parent.name == codemod_class.NAME or path in EXAMPLES
        if not own and codemod_class.may_apply(parsed, options):
            continue  # the chain runs it in full anyway: test_codemod_properties covers that
        codemod = codemod_class(CodemodContext(filename=path.name), options)
        code = codemod.transform_source(parsed).code
        if not codemod_class.may_apply(parsed, options):
            assert (code, codemod.edits, codemod.manual) == (source, [], []), \
                f"{codemod_class.NAME} is skipped on {path.name} but changes or reports something there"
        if not codemod.edits:
            assert code == source, f"{codemod_class.NAME} changed {path.name} without recording an edit"


def _assert_positions_and_parents_equal_libcsts(parsed: ParsedSource) -> None:
    wrapper = MetadataWrapper(parsed.module, unsafe_skip_copy=True)
    parents = wrapper.resolve(ParentNodeProvider)
    assert len(parsed.parents) == len(parents) and all(parsed.parents[n] is p for n, p in parents.items())
    whole = wrapper.resolve(PositionProvider)
    table = position_table(parsed.module)
    assert len(table) == len(whole)
    assert all(table[n] == ((r.start.line, r.start.column), (r.end.line, r.end.column)) for n, r in whole.items())
    checked = 0
    for node, expected in whole.items():
        if node is parsed.module:
            continue
        found = parsed.positions[node]
        assert (found.start, found.end) == (expected.start, expected.end), type(node).__name__
        checked += 1
    assert checked > 10  # not vacuous


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::8]], ids=_ids)
def test_positions_and_parents_equal_libcsts(path):
    _assert_positions_and_parents_equal_libcsts(ParsedSource(path.read_text()))


def _handed_on(source: str, options: Options) -> list[tuple[cst.Module, ParsedSource]]:
    """Each tree a codemod of the chain returned with an edit, and what the chain hands the next codemod (reusing
    what the text the codemod was given knows of the statements it handed on untouched, as the pipeline does)."""
    return [(tree, parsed) for tree, parsed, _ in _handed_on_with_earlier(source, options)]


def _handed_on_with_earlier(source: str, options: Options) -> list[tuple[cst.Module, ParsedSource, ParsedSource]]:
    found = []
    parsed = ParsedSource(source)
    for codemod_class in CHAIN:
        if not codemod_class.may_apply(parsed, options):
            continue
        codemod = codemod_class(CodemodContext(filename="model.py"), options)
        tree = codemod.transform_source(parsed)
        if codemod.edits:
            earlier, parsed = parsed, ParsedSource.generated(tree, parsed)
            found.append((tree, parsed, earlier))
    return found


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::4]], ids=_ids)
def test_a_layout_reusing_untouched_statements_is_the_layout_generated_whole(path):
    """ParsedSource.generated copies the text and parents of the statements a codemod handed on as the same node
    (top-level statements, methods, and statements of a method's body): the same text, parents, first lines and
    positions as a generation of the whole tree."""
    reused = reused_methods = reused_statements = 0
    for tree, handed, earlier in _handed_on_with_earlier(path.read_text(), options_for(path)):
        whole = ParsedSource.generated(tree)
        assert handed.text == whole.text == tree.code
        if handed.module is not tree:
            assert whole.module is not tree  # parsed again only where a node sits in two places
            continue
        assert handed.layout.parents == whole.layout.parents and handed.layout.first_lines == whole.layout.first_lines
        assert handed.layout.statement_texts == whole.layout.statement_texts
        assert handed.layout.statement_methods == whole.layout.statement_methods
        kept = [s for s in tree.body if s in earlier.module.body]
        reused += len(kept)
        # In a class a codemod changed, the methods it handed on as they were are copied from the earlier layout.
        earlier_methods = {m for methods in earlier.layout.statement_methods.values() for m in methods}
        changed = {s: methods for s, methods in handed.layout.statement_methods.items()
                   if s not in earlier.layout.statement_texts}
        reused_methods += sum(method in earlier_methods for methods in changed.values() for method in methods)
        # In a method a codemod changed, the statements of its body it handed on as they were are copied too.
        earlier_statements = {s for methods in earlier.layout.statement_methods.values() for known in methods.values()
                              for s in known.statements}
        reused_statements += sum(s in earlier_statements for methods in changed.values()
                                 for method, known in methods.items() if method not in earlier_methods
                                 for s in known.statements)
        for statement in kept:
            assert handed.positions[statement] == whole.positions[statement]
    if path.name == "model.py":
        # Not vacuous: the codemods hand untouched statements on as they were.
        assert reused > 0 and reused_methods > 0 and reused_statements > 0


def test_a_statement_reused_twice_is_parsed_again():
    module = cst.parse_module("x = 1\ny = 2\n")
    earlier = ParsedSource("x = 1\ny = 2\n", module)
    earlier.layout  # what `generated` reuses
    twice = module.with_changes(body=[module.body[0], module.body[0], module.body[1]])
    handed = ParsedSource.generated(twice, earlier)
    assert handed.text == "x = 1\nx = 1\ny = 2\n"
    assert handed.module is not twice


def _differences(carried: object, parsed: object, where: str = "module") -> list[str]:
    """Where two trees differ, but for a default libcst prints as the parser's node (`Arg.comma`, `Param.star`)."""
    if isinstance(carried, (list, tuple)) and isinstance(parsed, (list, tuple)):
        if len(carried) != len(parsed):
            return [f"{where}: {len(carried)} vs {len(parsed)} items"]
        return [d for i, (a, b) in enumerate(zip(carried, parsed)) for d in _differences(a, b, f"{where}[{i}]")]
    if carried is cst.MaybeSentinel.DEFAULT and (isinstance(parsed, cst.Comma) or parsed == ""):
        return []
    if type(carried) is not type(parsed):
        return [f"{where}: {type(carried).__name__} vs {type(parsed).__name__}"]
    if isinstance(carried, cst.CSTNode):
        return [d for name in carried.__dataclass_fields__
                for d in _differences(getattr(carried, name), getattr(parsed, name), f"{where}.{name}")]
    return [] if carried == parsed else [f"{where}: {carried!r} vs {parsed!r}"]


@pytest.mark.parametrize("path", QUARTERS[1], ids=_ids)
def test_a_tree_handed_on_is_its_texts_parse(path):
    for tree, handed in _handed_on(path.read_text(), options_for(path)):
        assert handed.text == tree.code
        if handed.module is tree:
            assert _differences(tree, cst.parse_module(handed.text)) == []


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::8]], ids=_ids)
def test_positions_and_parents_of_a_tree_handed_on_equal_libcsts(path):
    handed = [parsed for tree, parsed in _handed_on(path.read_text(), options_for(path)) if parsed.module is tree]
    for parsed in handed:
        _assert_positions_and_parents_equal_libcsts(parsed)


def test_a_tree_holding_a_node_twice_is_parsed_again():
    module = cst.parse_module("x = 1\n")
    twice = module.with_changes(body=[module.body[0], module.body[0]])
    handed = ParsedSource.generated(twice)
    assert handed.text == "x = 1\nx = 1\n"
    assert handed.module is not twice and handed.module.deep_equals(cst.parse_module(handed.text))
    assert len({handed.top_level_statement(s) for s in handed.module.body}) == 2


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids)
def test_statement_texts_are_the_statements_code(path):
    parsed = ParsedSource(path.read_text())
    texts = [parsed.statement_text(s) for s in parsed.module.body]
    assert texts == [parsed.module.code_for_node(s) for s in parsed.module.body]
    assert parsed.statement_text(parsed.module.body[0].body) is None  # not a statement of the module's body


def test_the_chain_leaves_the_cyclic_collector_as_it_found_it():
    source = EXAMPLES[0].read_text()
    assert gc.isenabled()
    adapt_source(source, EXAMPLES[0].name, None, options_for(EXAMPLES[0]))
    assert gc.isenabled()
    gc.disable()
    try:
        adapt_source(source, EXAMPLES[0].name, None, options_for(EXAMPLES[0]))
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Visited(cst.CSTVisitor):
    def __init__(self) -> None:
        self.order: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if not isinstance(node, UNWALKED):  # whitespace and punctuation
            self.order.append(node)
        return True


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::8]], ids=_ids)
def test_walk_visits_what_a_visitor_visits_in_its_order(path):
    module = cst.parse_module(path.read_text())
    visited = _Visited()
    module.visit(visited)
    walked = list(walk(module))
    assert len(walked) == len(visited.order) > 10  # not vacuous
    assert all(a is b for a, b in zip(walked, visited.order))


_MODULE_HEADS = [
    "", "x = 1\n", "import math\n\nx = 1\n", '"""Doc."""\nimport math\nx = 1\n', '"""Doc."""\n\n# note\nx = 1\n',
    "from __future__ import annotations\nimport torch.nn as nn\n# note\nclass A:\n    pass\n",
    "__strict__ = True\nimport os\n", "import torch\nx = 1\n", "x = 1\nimport torch\n", "import os, torch\n",
    "import torch as t\n", "import os; import sys\nx = 1\n", "if True:\n    import torch\n", "import torch.nn\n",
]


@pytest.mark.parametrize("source", [*_MODULE_HEADS, *(p.read_text() for p in SOURCES[::4])])
def test_plain_imports_go_where_libcsts_visitor_puts_them(source):
    module = cst.parse_module(source)
    context = CodemodContext()
    AddImportsVisitor.add_needed_import(context, "torch")
    expected = AddImportsVisitor(context).transform_module(module).code
    assert with_plain_imports(module, ["torch"]).code == expected


def _wrapped_trees(paths: list[Path]) -> list[cst.Module]:
    """The trees the chain hands the line-wrap pass (after tidy): their functions' twins share blank lines and
    comments with other places."""
    import graphmode.transforms.pipeline as pipeline

    seen: list[cst.Module] = []
    real = pipeline.wrapped_with_code
    pipeline.wrapped_with_code = lambda module, original, code=None: seen.append(module) or real(module, original, code)
    try:
        for path in paths:
            adapt_source(path.read_text(), path.name, None, options_for(path))
    finally:
        pipeline.wrapped_with_code = real
    return seen


def test_positions_and_parents_of_one_generation_equal_libcsts_where_a_node_sits_once():
    # The line-wrap pass reads positions and parents from one generation of the code (positions_and_parents), and
    # libcst's providers only when a node it asks about sits in two places.
    checked = shared = 0
    for module in _wrapped_trees(EXAMPLES):
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        parents, whole = wrapper.resolve(ParentNodeProvider), wrapper.resolve(PositionProvider)
        table, found_parents, twice = positions_and_parents(module)
        assert len(found_parents) == len(parents) and all(found_parents[n] is p for n, p in parents.items())
        shared += len(twice)
        for node, expected in whole.items():
            if node not in twice:
                assert table[node] == ((expected.start.line, expected.start.column),
                                       (expected.end.line, expected.end.column)), type(node).__name__
                checked += 1
    assert checked > 1000 and shared > 0  # not vacuous: some trees share nodes


def test_every_node_with_leading_lines_is_walked():
    # The line-wrap pass finds comment lines in the leading lines of the nodes `walk` yields.
    kinds = [kind for kind in vars(cst).values() if isinstance(kind, type) and issubclass(kind, cst.CSTNode)
             and dataclasses.is_dataclass(kind)]
    with_leading = [kind for kind in kinds if "leading_lines" in {f.name for f in dataclasses.fields(kind)}]
    assert len(with_leading) > 10 and not [kind for kind in with_leading if issubclass(kind, UNWALKED)]


def _recorder(base: type) -> type:
    """A transformer on `base` that records each hook libcst calls, with a node, a field and a leave that rewrites."""

    class Recorder(base):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, str]] = []

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            self.calls.append(("visit_FunctionDef", node.name.value))
            return node.name.value != "forward"  # a False skips the body

        def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
            self.calls.append(("leave_Name", original_node.value))
            return updated_node.with_changes(value=updated_node.value.upper()) if len(updated_node.value) == 1 \
                else updated_node

        def visit_Call_args(self, node: cst.Call) -> None:
            self.calls.append(("visit_Call_args", type(node.func).__name__))

        def leave_If_test(self, original_node: cst.If) -> None:
            self.calls.append(("leave_If_test", type(original_node.test).__name__))

    return Recorder


@pytest.mark.parametrize("path", EXAMPLES[:2], ids=_ids)
def test_the_fast_dispatch_calls_what_libcst_calls(path):
    module = cst.parse_module(path.read_text())
    slow, fast = _recorder(cst.CSTTransformer)(), _recorder(Transformer)()
    assert module.visit(fast).code == module.visit(slow).code
    assert fast.calls == slow.calls and {name for name, _ in slow.calls} == {
        "visit_FunctionDef", "leave_Name", "visit_Call_args", "leave_If_test"}


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::4]], ids=_ids)
def test_plain_code_generation_is_libcsts(path):
    """positions.code_for_node and module_code skip libcst's syntactic-position context: the same text."""
    module = cst.parse_module(path.read_text())
    assert module_code(module) == module.code == path.read_text()
    # Statements and expressions: what the codemods generate alone (an annotation, say, needs its parent's context).
    nodes = [node for node in walk(module) if isinstance(node, (cst.BaseStatement, cst.BaseExpression))]
    assert len(nodes) > 10  # not vacuous
    assert all(code_for_node(node) == cst.Module(body=[]).code_for_node(node) for node in nodes)


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::4]], ids=_ids)
def test_word_tables_and_step_functions_are_the_ast_walks(path):
    """ParsedSource's walks of Python's AST read node fields directly: the nodes `ast.walk` gives, in its order
    (where order matters), and the step functions of the text's own parse."""
    source = path.read_text()
    parsed = ParsedSource(source)
    tree = parsed.tree
    assert _walk(tree) == list(ast.walk(tree))
    assert all(_child_nodes(node) == list(ast.iter_child_nodes(node)) for node in ast.walk(tree))
    by_walk: set[str] = set()
    for node in ast.walk(tree):
        by_walk.add(f":{type(node).__name__}")
        if isinstance(node, ast.Name):
            by_walk.add(node.id)
        elif isinstance(node, ast.Attribute):
            by_walk.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            by_walk.add(node.name)
        elif isinstance(node, ast.arg):
            by_walk.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            by_walk.add(node.arg)
    assert parsed.words == by_walk and len(by_walk) > 10
    assert parsed.step_functions == step_qualnames(source)


def _outcome(source: str, path: Path, selected: set[str] | None) -> tuple:
    result = adapt_source(source, path.name, selected, options_for(path))
    return result.adapted, result.static_view, result.edits, result.manual, result.applied


@pytest.mark.parametrize("path", QUARTERS[3], ids=_ids)
def test_passing_over_classes_and_functions_without_handled_nodes_changes_nothing(path, monkeypatch):
    """A codemod's walk does not enter a class or function under which no node has a handler of the codemod's, a
    class whose functions it passes over and which has no such node outside them, nor such a statement of the
    module's body (GraphCodemod._handles_some_node_under): the chain's outcome is the one of walks that enter them."""
    source = path.read_text()
    selections = [None] if path in EXAMPLES else [None, {path.parent.name}]
    fast = [_outcome(source, path, selected) for selected in selections]
    entered: list[int] = []
    real = GraphCodemod._handles_some_node_under

    def enter_all(self, node):
        entered.append(not real(self, node))
        return True

    monkeypatch.setattr(GraphCodemod, "_handles_some_node_under", enter_all)
    assert [_outcome(source, path, selected) for selected in selections] == fast
    if path.name == "model.py":
        assert any(entered)  # not vacuous: the shortcut passes over some


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::8]], ids=_ids)
def test_types_under_a_node_are_those_a_visitor_meets(path):
    module = cst.parse_module(path.read_text())
    known: dict[cst.CSTNode, frozenset[type]] = {}
    scopes = [node for node in walk(module) if isinstance(node, (cst.ClassDef, cst.FunctionDef))]
    assert scopes  # not vacuous
    for node in scopes:
        visited = _Visited()
        node.visit(visited)
        assert types_under(node, known) == {type(n) for n in visited.order[1:]}
    assert types_under(scopes[0], {}) == known[scopes[0]]


def test_handled_types_are_the_visit_and_leave_handlers():
    class Handles(Transformer):
        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            pass

        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
            return updated_node

    class WithFieldHook(Handles):
        def visit_Call_args(self, node: cst.Call) -> None:
            pass

    assert handled_types(Handles) == {cst.ClassDef, cst.Call}
    assert handled_types(WithFieldHook) is None  # called on every field of every node
    assert handled_types(Transformer) == frozenset()


@pytest.mark.parametrize("path", QUARTERS[2], ids=_ids)
def test_calls_renamed_only_in_functions_that_make_them_changes_nothing(path, monkeypatch):
    """static_path visits a changed function with the renaming of calls to twins only when some call under it is
    renamed (`_RenameCalls.applied_to`): the outcome of visiting every one."""
    source = path.read_text()
    fast = _outcome(source, path, None)
    visited: list[bool] = []

    def visit_all(self, node):
        visited.append(self.renames_in(node))
        return node.visit(self)

    monkeypatch.setattr(static_path._RenameCalls, "applied_to", visit_all)
    assert _outcome(source, path, None) == fast
    if path.name == "model.py":
        assert visited and not all(visited)  # not vacuous: some functions rename no call


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::2]], ids=_ids)
def test_word_tables_per_statement_are_the_walks_of_the_whole_text(path):
    """A text with a libcst parse reads its word tables, function words, position functions and classes in
    functions off one table per statement of the module's body, handed from text to text for the statements the
    codemods handed on as they were (a generated text parses the others alone, not the whole text): the same as the
    walks of the whole text's `ast` parse."""
    source = path.read_text()
    reused = parsed_alone = 0
    for _, handed, earlier in [(None, ParsedSource(source, cst.parse_module(source)), None),
                               *_handed_on_with_earlier(source, options_for(path))]:
        if earlier is not None:
            reused += sum(statement in earlier.statement_tables for statement in handed.module.body)
        whole = ParsedSource(handed.text)  # no libcst parse: the walks of the whole text
        assert handed._statements is not None and whole._statements is None
        if earlier is not None:
            parsed_alone += "tree" not in handed.__dict__
        assert handed.words == whole.words
        assert handed.classes_in_functions == whole.classes_in_functions
        assert handed.has_position_param == whole.has_position_param
        assert handed.position_functions == whole.position_functions
        qualnames = [*whole._functions_by_qualname, "no_such_function"]
        assert [handed.function_words(q) for q in qualnames] == [whole.function_words(q) for q in qualnames]
    if path.name == "model.py":
        assert reused > 0 and parsed_alone > 0  # not vacuous: tables are handed on, statements parsed alone


def test_word_tables_per_statement_count_each_small_statement_of_a_line():
    source = ("import os; import sys\nx = 1; y = os.sep\n@property\ndef f(pos: int):\n    class A:\n        pass\n"
              "if sys:\n    def g(start_pos):\n        return start_pos\n")
    handed, whole = ParsedSource(source, cst.parse_module(source)), ParsedSource(source)
    assert handed.words == whole.words and {"sep", ":If", "A"} <= handed.words
    assert handed.classes_in_functions == whole.classes_in_functions is True
    assert handed.position_functions == whole.position_functions
    assert [handed.function_words(q) for q in ("f", "g")] == [whole.function_words(q) for q in ("f", "g")]


@pytest.mark.parametrize("path", QUARTERS[1], ids=_ids)
def test_a_node_rebuilt_from_the_same_children_counts_as_untouched(path, monkeypatch):
    """A handler that rebuilt a node from the very children it had (hoist_item's `leave_IndentedBlock` does for every
    block) leaves it untouched for the chain (`base._same_fields`): the outcome of counting it as changed."""
    source = path.read_text()
    fast = _outcome(source, path, None)
    same: list[bool] = []
    real = codemod_base._same_fields

    def never(left, node):
        same.append(real(left, node))
        return False

    monkeypatch.setattr(codemod_base, "_same_fields", never)
    assert _outcome(source, path, None) == fast
    if path.parent.name == "legacy_llm":
        assert any(same)  # not vacuous: hoist_item applies there


def test_same_fields_is_the_same_children_by_identity():
    statement = cst.parse_statement("if x:\n    a = 1\n    b = 2\n")
    block = statement.body
    assert codemod_base._same_fields(block.with_changes(body=list(block.body)), block)
    assert not codemod_base._same_fields(block.with_changes(body=list(block.body)[:1]), block)
    assert not codemod_base._same_fields(block.with_changes(body=[block.body[0].deep_clone(), block.body[1]]), block)
    assert not codemod_base._same_fields(block.body[0], block)


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::4]], ids=_ids)
def test_positions_read_off_one_methods_table_equal_libcsts(path):
    """A node in a method of a top-level class, asked about before its class's whole table exists, takes its position
    from a table of the method alone (positions.method_position_table), generated under the indent its class gives
    it and handed from text to text while the method is the same node: the positions libcst gives."""
    source = path.read_text()
    checked = 0
    for parsed in [ParsedSource(source), *(p for t, p in _handed_on(source, options_for(path)) if p.module is t)]:
        whole = MetadataWrapper(parsed.module, unsafe_skip_copy=True).resolve(PositionProvider)
        for statement, methods in parsed.layout.statement_methods.items():
            for method in methods:
                positions = _StatementPositions(parsed)  # no table of the class yet
                if "positions" in parsed.__dict__:
                    positions._methods = parsed.positions._methods  # as handed on
                for node in walk(method):
                    found, expected = positions[node], whole[node]
                    assert (found.start, found.end) == (expected.start, expected.end), type(node).__name__
                    checked += 1
                assert statement not in positions._done
    if path.name == "model.py":
        assert checked > 100  # not vacuous


def test_class_level_types_leave_function_bodies_out():
    module = cst.parse_module("class A(B):\n    x: int = 1\n    def f(self, y):\n        return y[0]\n"
                              "    class Inner:\n        def g(self):\n            pass\n")
    kinds, functions = class_level(module.body[0], {})
    assert sorted(functions) == ["Inner.g", "f"]
    assert {cst.AnnAssign, cst.FunctionDef, cst.ClassDef, cst.Arg} <= kinds
    assert not {cst.Return, cst.Subscript, cst.Param, cst.Pass} & kinds


def test_a_codemod_that_sees_every_node_walks_everything():
    class SeesEverything(GraphCodemod):
        def on_visit(self, node: cst.CSTNode) -> bool:
            return super().on_visit(node)

    assert codemod_base._handled_types(SeesEverything) is None
    assert codemod_base._handled_types(CHAIN[0]) == handled_types(CHAIN[0])


def test_a_generated_text_parses_each_changed_statement_from_libcsts_text():
    # A form feed ends a line for `str.splitlines`, not for libcst or `ast`: the statements' own texts are parsed.
    source = ("x = 1  # a\x0cb\x0cc\x0cd\n"
              "def f(pos: int):\n    return pos\n\n\ny = 2\nz = 3\n"
              "class A:\n    def g(self, start_pos):\n        pass\n")
    module = cst.parse_module(source)
    earlier = ParsedSource(source, module)
    assert "x" in earlier.words  # the tables the next text takes
    renamed = module.with_changes(body=[module.body[0], module.body[1].with_changes(name=cst.Name("h")),
                                        *module.body[2:]])
    handed, whole = ParsedSource.generated(renamed, earlier), ParsedSource(renamed.code)
    assert handed.words == whole.words and "h" in handed.words and "tree" not in handed.__dict__
    assert handed.position_functions == whole.position_functions == {"h", "A.g"}


def test_statement_texts_count_lines_as_libcst_does():
    source = "x = 1  # a\x0cb\x0cc\nimport os\n\n\ndef f():\n    return os\n"
    parsed = ParsedSource(source)
    assert [parsed.statement_text(s) for s in parsed.module.body] == [
        "x = 1  # a\x0cb\x0cc\n", "import os\n", "\n\ndef f():\n    return os\n"]


def _held_twice(module: cst.Module) -> list[str]:
    """The types of the nodes that sit in more than one place in the tree, sorted (a visit builds no leaf again:
    whitespace and comments the visit was handed in two places stay there)."""
    seen: set[int] = set()
    twice = []
    pending: list[cst.CSTNode] = [module]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            twice.append(type(node).__name__)
            continue
        seen.add(id(node))
        pending.extend(node.children)
    return sorted(twice)


@pytest.mark.parametrize("path", QUARTERS[3], ids=_ids)
def test_notes_moved_only_where_needed_are_the_visit_of_the_whole_module(path, monkeypatch):
    """static_path visits with _NotesOnHeaders only the functions it built and the statements in which an `if`
    with graphmode's note sits (`_with_notes_on_headers`), not the whole module: the same text, and, as after the
    whole visit, no node in two places but the leaves the visit also leaves there."""
    real = static_path._with_notes_on_headers
    compared = []

    def compared_to_the_whole_visit(module, placed, width):
        fast = real(module, placed, width)
        whole = module.visit(static_path._NotesOnHeaders(width, len(module.default_indent.expandtabs())))
        assert fast.code == whole.code
        assert _held_twice(fast) == _held_twice(whole)
        assert not set(_held_twice(fast)) - {"SimpleWhitespace", "Comment", "Newline"}
        compared.append(sum(new is old for new, old in zip(fast.body, module.body)))
        return fast

    monkeypatch.setattr(static_path, "_with_notes_on_headers", compared_to_the_whole_visit)
    adapt_source(path.read_text(), path.name, None, options_for(path))
    if path.name == "model.py":
        assert compared and all(compared)  # not vacuous: statements passed over as they were


def _trees_split(path: Path, monkeypatch) -> list[tuple[cst.Module, cst.Module]]:
    """The (original, adapted) trees the chain hands keep_original_path for the file."""
    real, seen = static_path.keep_original_path, []

    def recorded(original, adapted, original_text=None, method_text=None):
        seen.append((original, adapted))
        return real(original, adapted, original_text, method_text)

    monkeypatch.setattr(pipeline, "keep_original_path", recorded)
    adapt_source(path.read_text(), path.name, None, options_for(path))
    return seen


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::4]], ids=_ids)
def test_static_paths_texts_are_each_nodes_own_generation(path, monkeypatch):
    """keep_original_path generates each node's code once (`_Texts`): the code of a function's body and of the
    body's statements comes from the generation of the function (positions.function_parts_code), and a statement's
    code after the lines above it is cut from its whole code. Each is the code libcst generates for the body alone,
    for the statement alone and for the statement without those lines."""
    checked = 0
    for trees in _trees_split(path, monkeypatch):
        for tree in trees:
            texts = static_path._Texts()
            for stmt in walk(tree, statements_only):
                if not isinstance(stmt, cst.BaseStatement):
                    continue
                assert texts.after_leading_lines(stmt) == code_of(stmt.with_changes(leading_lines=()))
                assert texts.code(stmt) == code_of(stmt)
                if isinstance(stmt, cst.FunctionDef):
                    function, body, statements = function_parts_code(stmt)
                    assert (function, body) == (code_of(stmt), code_of(stmt.body))
                    assert statements == {s: code_of(s) for s in getattr(stmt.body, "body", ())
                                          if isinstance(stmt.body, cst.IndentedBlock)}
                    assert texts.code(stmt.body) == body
                checked += bool(stmt.leading_lines)
    if path.name == "model.py":
        assert checked  # not vacuous: statements with lines above them


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::4]], ids=_ids)
def test_with_blocks_is_the_visit_that_replaces_them(path):
    """cstutil.with_blocks builds again only the nodes on the way to a replaced block: the code of the visit that
    swaps the same blocks (`fusion.replaced`), a block under another replaced one included."""
    module = cst.parse_module(path.read_text())
    blocks = [node for node in walk(module, statements_only) if isinstance(node, cst.IndentedBlock)]
    assert blocks  # not vacuous
    for every in (1, 3, 7):
        swaps = {block: block.with_changes(body=[cst.SimpleStatementLine([cst.Pass()]), *block.body])
                 for block in blocks[::every]}
        swapped = with_blocks(module, swaps)
        assert swapped.code == replaced(module, swaps).code
        # what no swap is under stays the very node it was
        assert sum(new is old for new, old in zip(swapped.body, module.body)) \
            == sum(not any(n in swaps for n in walk(stmt, statements_only)) for stmt in module.body)


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[1::4]], ids=_ids)
def test_merges_built_along_the_way_change_nothing(path, monkeypatch):
    """merged_projections (the codemod, and shared_merges after the chain) swaps the merged blocks in with
    `with_blocks`: the outcome of the visit that builds every node of the function again (`fusion.replaced`)."""
    fast = _outcome(path.read_text(), path, None)
    swapped: list[int] = []

    def by_visit(node, blocks):
        swapped.append(len(blocks))
        return replaced(node, blocks)

    monkeypatch.setattr(merged_projections, "with_blocks", by_visit)
    assert _outcome(path.read_text(), path, None) == fast
    if path.name == "model.py" and path.parent.name == "hf_cache_api":
        assert swapped  # not vacuous


def test_function_parts_are_each_parts_own_code_under_any_indentation():
    """A body indented by a tab, a block in it by two spaces, comments at no indentation, a string over lines and a
    statement on the `def` line: each part's code from the function's generation is its code generated alone."""
    source = ('def f(x):\n\t"""Doc\n  string."""\n\tif x:\n\t  y = """a\nb"""\n# flush left\n\t  return y\n'
              '\t# at the body\'s level\n\n\twhile x:\n\t\tx -= 1\n\telse:\n\t  pass\n\treturn x\n'
              'def g(): return 1\n')
    for function in cst.parse_module(source).body:
        whole, body, statements = function_parts_code(function)
        assert (whole, body) == (code_of(function), code_of(function.body))
        block = isinstance(function.body, cst.IndentedBlock)
        assert statements == ({s: code_of(s) for s in function.body.body} if block else {})


@pytest.mark.parametrize("path", [*EXAMPLES, *(p for i, p in enumerate(CASES)
                                                 if p.parent.name == "cache_object" or i % 4 == 2)], ids=_ids)
def test_cache_object_entering_only_the_way_to_planned_nodes_changes_nothing(path, monkeypatch):
    """cache_object's rewrite enters only the nodes above a node it replaces or drops (`_Apply.on_visit`): the
    outcome of the visit of every statement that holds one."""
    fast = _outcome(path.read_text(), path, None)
    entered: list[bool] = []

    def enter_all(self, node):
        entered.append(node in self.on_the_way)
        return True

    monkeypatch.setattr(cache_object._Apply, "on_visit", enter_all)
    assert _outcome(path.read_text(), path, None) == fast
    if path.parent.name == "hf_cache_api" and path.name == "model.py":
        assert entered and not all(entered)  # not vacuous: some nodes are passed over


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::2]], ids=_ids)
def test_statements_by_start_are_those_of_the_table_of_every_node(path):
    """ParsedSource.ast_node looks a statement (a function, for `ast_of`) up in a table of the statements alone: the
    nodes the table of every node holds there, in its order."""
    parsed = ParsedSource(path.read_text())
    everything = {start: [n for n in nodes if isinstance(n, ast.stmt)] for start, nodes in parsed._ast_by_start.items()}
    assert parsed._statements_by_start == {start: nodes for start, nodes in everything.items() if nodes}
    functions = [n for n in _walk(parsed.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert functions  # not vacuous
    for function in functions:
        start = parsed._point(function.lineno, function.col_offset)
        assert parsed.ast_node(start, None, (ast.FunctionDef, ast.AsyncFunctionDef)) is function


def test_statements_by_start_reach_every_kind_of_body():
    source = ("try:\n    def a(): pass\nexcept ValueError:\n    def b(): pass\nelse:\n    def c(): pass\n"
              "finally:\n    for x in y:\n        pass\n    else:\n        async def d(): pass\n"
              "match v:\n    case 1:\n        with w:\n            class E:\n                def f(self): pass\n"
              "while z:\n    pass\nelse:\n    if q: g = lambda: 0\n")
    parsed = ParsedSource(source)
    everything = {start: [n for n in nodes if isinstance(n, ast.stmt)] for start, nodes in parsed._ast_by_start.items()}
    assert parsed._statements_by_start == {start: nodes for start, nodes in everything.items() if nodes}
    statements = sum(isinstance(node, ast.stmt) for node in _walk(parsed.tree))
    assert sum(map(len, parsed._statements_by_start.values())) == statements


_ODD_LAYOUTS = [
    # Windows line ends, a backslash continuation, a triple-quoted string, a form feed in a comment.
    "import os\r\nx = 1 + \\\r\n    2\r\n\r\nclass A:\r\n    '''doc\r\n    more'''\r\n    def f(self):  # \x0c\r\n"
    "        return '''a\r\nb'''\r\n",
    # Decorators over lines, comments closing a method's body and a class's, a one-line method, async, a nested class.
    "class A(\n    object,\n):\n    @property\n    @decorate(\n        1,\n    )\n    def f(self):\n        x = 1\n"
    "        # closes f\n    def g(self): return 2\n\n    async def h(self):\n        if x:\n            pass\n"
    "        # closes h's if\n    class B:\n        def i(self):\n            pass\n    # closes A\n\n# footer\n",
    "x = (1,\n     2)\n",  # no class
]


@pytest.mark.parametrize("source", [*_ODD_LAYOUTS, *(p.read_text() for p in SOURCES)],
                         ids=[f"odd{i}" for i in range(len(_ODD_LAYOUTS))] + [_ids(p) for p in SOURCES])
def test_the_layout_read_off_the_text_is_the_generated_one(source):
    """A tree parsed from a text takes its layout from the text (text_layout): the same parents, lines, texts and
    methods as a generation of its code (positions.layout_of)."""
    module = cst.parse_module(source)
    read, generated = layout_of_parsed(module, source), layout_of(module)
    assert read is not None
    for field in dataclasses.fields(read):
        assert getattr(read, field.name) == getattr(generated, field.name), field.name


def test_a_text_whose_code_differs_is_laid_out_by_generating_it():
    """libcst leaves out a module's last line break where the text has none (and an old Mac file's last `\\r`), and a
    byte-order mark: such a text is generated instead."""
    assert layout_of_parsed(cst.parse_module("x = 1"), "x = 1") is None
    assert layout_of_parsed(cst.parse_module("x = (1,\r     2)\r"), "x = (1,\r     2)\r") is None
    assert layout_of_parsed(cst.parse_module("\ufeffimport os\n"), "\ufeffimport os\n") is None  # drops the mark
    parsed = ParsedSource("class A:\n    def f(self):\n        return 1")
    assert parsed.layout == layout_of(parsed.module)


@pytest.mark.parametrize("path", [*EXAMPLES, *CASES[::6]], ids=_ids)
def test_the_output_copying_what_the_layouts_generated_is_its_code(path, monkeypatch):
    """The chain's output text copies the code its layouts generated for the statements, methods and statements of
    methods the output holds as the same nodes (positions.module_code_reusing): the code libcst generates."""
    real, checked = pipeline.module_code_reusing, []

    def compared(module, layouts):
        text = real(module, layouts)
        assert text == module.code
        checked.append(len(layouts))
        return text

    monkeypatch.setattr(pipeline, "module_code_reusing", compared)
    adapt_source(path.read_text(), path.name, None, options_for(path))
    if path.name == "model.py":
        assert checked and checked[0] > 0  # not vacuous: the chain's layouts were there to copy from
