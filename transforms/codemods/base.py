"""What every graphmode codemod shares.

A codemod is a libcst `Codemod` and a plain `CSTTransformer` that rewrites one idiom and records what
it did: an `Edit` per rewritten span, or a `PartialMatch` where it recognised the idiom only in part
and therefore changed nothing there. It is not a `VisitorBasedCodemodCommand`: the matcher decorators
that class supports cost four times a plain walk of the tree, and no codemod here uses them.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
from dataclasses import asdict, dataclass
from typing import ClassVar

import libcst as cst
from libcst.codemod import Codemod, CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem
from libcst.metadata import ParentNodeProvider, PositionProvider

from graphmode.transforms.analysis.astutil import FUNCTION_TYPES
from graphmode.transforms.analysis.reach import step_qualnames
from graphmode.transforms.codemods.lib.imports import is_plain, with_plain_imports
from graphmode.transforms.cstutil import class_level, code_of, types_under
from graphmode.transforms.dispatch import Computed, Transformer, handled_types
from graphmode.transforms.parsed import ParsedSource
from graphmode.transforms.positions import module_code

@dataclass(frozen=True)
class Options:
    """What the rewrites need to know that the source does not say."""

    max_seq_len: int = 64  # longest sequence (prompt + generated) the static buffers must hold
    max_batch_size: int = 1
    entry_class: str | None = None  # the model class the harness builds; it gets prefill/decode
    # How the harness really calls the entry class's forward in Decode (runners.evidence.entry_calls), when it was
    # recorded: (parameter, role) pairs, role "tokens" | "positions" | "constant" | "state". Empty: not known,
    # and the codemods go by the signature alone.
    entry_roles: tuple[tuple[str, str], ...] = ()
    recomputes_sequence: bool = False  # Decode is given the whole sequence every step: no KV cache
    # Methods of the entry class the harness calls with no arguments before Prefill (`reset_caches`).
    prefill_resets: tuple[str, ...] = ()
    # What one traced run of the unmodified model saw (runners.evidence.collect), when it ran: the KV caches grown by a
    # `torch.cat` in the sources, as (file, first line of the statement, growing dim counted from 0).
    traced: bool = False
    evidence_caches: tuple[tuple[str, int, int], ...] = ()
    # The caches the trace saw a statement of the sources grow through a library call (a cache object's
    # `update`): (file, first line of the statement, the growing dim of each tensor written, in the order written,
    # and each tensor's shape per layer). Keys and values, or MLA's latent and rope key, each have their own.
    evidence_cache_writes: tuple[tuple[str, int, tuple[int, ...], tuple[tuple[tuple[int, ...], ...], ...]], ...] = ()
    # Int parameters the trace saw change every Decode step: (file, function qualname, parameter).
    changing_int_params: tuple[tuple[str, str, str], ...] = ()
    # Statements the trace saw read the device on the host in Decode: (file, first line of the statement).
    host_sync_lines: tuple[tuple[str, int], ...] = ()
    # Statements the trace saw make the positions of the tokens computed out of something else (a mask's cumsum,
    # a length): (file, first line of the statement).
    position_lines: tuple[tuple[str, int], ...] = ()
    # Statements the trace saw read a growing KV cache along its growing dim: (file, first line of the statement,
    # op, "scores" where the op's output grows with the keys (`q @ k^T`, `baddbmm`) or "reads" where it takes the
    # growing tensor in and gives back a fixed one (`scaled_dot_product_attention`, weights times values)).
    cache_reads: tuple[tuple[str, int, str, str], ...] = ()
    # Branch tests the trace saw compare how far the positions reach with a Python int (`seq_len > limit`, the
    # tensor holding the last position or the count of positions): (file, first line of the statement, "gt" | "ge").
    position_tests: tuple[tuple[str, int, str], ...] = ()
    # Which fused operators a fusion may write, for the hardware Decode runs on: "cuda" (portable torch ops:
    # `F.rms_norm`, `scaled_dot_product_attention`, one merged linear), "cpu" (the same, less those that measure
    # slower there than Inductor's own fusion) or "npu" (torch_npu's fused kernels, for npugraph_ex and GE).
    fused_ops: str = "cuda"
    # Modules of the target (file stems) this file imports whose attention now holds a static cache (cache_object
    # rewrote it there): a model class in a file of its own that builds the mask for layers imported from such a
    # module (Hunyuan-A13B's hunyuan.py, beside modeling_hunyuan.py) rewrites that mask though it writes no cache.
    static_caches_in: tuple[str, ...] = ()
    # Modules of the target (file stems) that import this file's layers and build their mask (the other side of the
    # pair above): this file's attention may make its cache static with no mask helper of its own.
    masks_in: tuple[str, ...] = ()

    def role_of(self, parameter: str) -> str | None:
        return dict(self.entry_roles).get(parameter)


@dataclass(frozen=True)
class Edit:
    codemod: str
    function: str
    start_line: int  # in the codemod's input; the pipeline maps it back to the original
    end_line: int
    summary: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PartialMatch:
    """A spot a codemod recognised only in part and left unchanged; the design turns it into an item for a person
    (agent.workflow.state.ManualItem, with the findings no change fixes)."""

    codemod: str
    function: str
    line: int
    reason: str
    skill: str
    # A path left as it was on purpose (a FlashAttention class beside the rewritten ones): said, but it stops nothing.
    advisory: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


class GraphCodemod(Codemod, Transformer):
    NAME: ClassVar[str]
    TITLE: ClassVar[str]  # one line, imperative: what the change does
    DESCRIPTION: ClassVar[str]  # the planned change and its effect on behaviour, for the design document
    SKILL: ClassVar[str]
    FIXES: ClassVar[frozenset[str]]  # rule codes whose findings this codemod removes
    REQUIRES: ClassVar[tuple[str, ...]] = ()  # codemods whose output this one's output relies on
    # Codemods whose rewrite this one's output takes for granted when the plan has them (the entry points assume
    # the cache and positions are static already): a person choosing this change must choose those too.
    ASSUMES: ClassVar[tuple[str, ...]] = ()
    # The idiom lies inside one function and the rewrite changes only that function: a function whose own words
    # fail `idiom_in` is passed over (its body is neither walked nor rebuilt).
    IDIOM_IN_ONE_FUNCTION: ClassVar[bool] = False
    # Its output holds buffers `setup_caches` sizes by the static length and batch: the design shows those parameters
    # on it, and a person may revise them (agent.workflow.revisions); verification sets the static path up at that size.
    SIZES_BUFFERS: ClassVar[bool] = False
    # A fusion: it makes Decode do the same work in fewer kernels, not compile. Verify times Decode with and without
    # the fusions the plan applied (an adaptation without them beside the one with them).
    FUSION: ClassVar[bool] = False
    METADATA_DEPENDENCIES = (PositionProvider, ParentNodeProvider)

    def __init__(self, context: CodemodContext, options: Options) -> None:
        super().__init__(context)
        self.options = options
        self.edits: list[Edit] = []
        self.manual: list[PartialMatch] = []

    @classmethod
    def may_apply(cls, source: ParsedSource, options: Options) -> bool:
        """False only when the text cannot hold this codemod's idiom, so the chain skips it without walking the
        tree. A codemod overrides `idiom_in`, or this for a test on more than the words."""
        return cls.idiom_in(source.words, options)

    @classmethod
    def idiom_in(cls, words: frozenset[str], options: Options) -> bool:
        """False only when code whose names and node kinds are `words` (`ParsedSource.words`) cannot hold the
        idiom: a test that the codemod's own matching implies."""
        return True

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._scopes: list[str] = []  # names of the classes and functions the walk is in
        self._passed_over: set[cst.FunctionDef] = set()
        self._tree_is_source = tree is self.source.module  # the words of functions are the source's
        self._changed_under: list[bool] = []  # per node the walk is in: whether a handler changed anything under it yet
        return tree.visit(self)

    def passes_over(self, qualname: str) -> bool:
        """Whether the walk may leave this function's body unvisited: true only for a codemod none of whose
        handlers could change anything in it. Walking and rebuilding every node costs more than most rewrites."""
        if not (self.IDIOM_IN_ONE_FUNCTION and self._tree_is_source):
            return False
        words = self.source.function_words(qualname)
        return words is not None and not self.idiom_in(words, self.options)

    def on_visit(self, node: cst.CSTNode) -> bool:
        self._changed_under.append(False)
        if _IS_SCOPE[type(node)]:
            self._scopes.append(node.name.value)
            if isinstance(node, cst.FunctionDef) and self.passes_over(".".join(self._scopes)):
                self._passed_over.add(node)
                return False
            # No handler of this codemod would be called under the class or function: its own handlers run, and
            # the walk neither enters nor rebuilds its body (the class or function is handed on as it was, as is a
            # statement of the module's body the walk does not enter).
            return super().on_visit(node) and self._handles_some_node_under(node)
        if len(self._changed_under) == 2 and _IS_STATEMENT[type(node)]:  # any other statement of the module's body
            return super().on_visit(node) and self._handles_some_node_under(node)
        if type(node) is cst.SimpleStatementLine and _STATEMENTS_ONLY[type(self)]:
            return super().on_visit(node) and self._handles_some_node_under(node)
        if _STATEMENTS_ONLY[type(self)] and not _MAY_HOLD_STATEMENTS[type(node)]:
            # An `if`'s test, a `for`'s target, the whitespace between the words: nothing under it is a statement or
            # a block, so no handler of this codemod runs there, and the walk neither enters nor rebuilds it.
            return False
        return super().on_visit(node)

    def _handles_some_node_under(self, node: cst.CSTNode) -> bool:
        handled = _handled_types(type(self))
        if handled is None:
            return True
        if type(node) is cst.SimpleStatementLine and _STATEMENTS_ONLY[type(self)]:
            # A statement line holds small statements and expressions, for none of which this codemod has a
            # handler: its own handlers run, and the walk neither enters nor rebuilds the line (hoist_item's walk
            # of every node of the methods holding a check was a tenth of the chain).
            return False
        if handled.isdisjoint(types_under(node, self.source.types_under)):
            return False
        if type(node) is not cst.ClassDef:
            return True
        # A class whose functions the walk passes over, and which holds no node of a handled type outside them.
        outside, functions = class_level(node, self.source.class_levels)
        if not handled.isdisjoint(outside - {cst.FunctionDef}):
            return True
        scope = ".".join(self._scopes)
        return not all(self.passes_over(f"{scope}.{function}") for function in functions)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        changed = self._changed_under.pop()
        if _IS_SCOPE[type(original_node)]:
            self._scopes.pop()
            if original_node in self._passed_over:
                return updated_node
        left = super().on_leave(original_node, updated_node)
        if left is not updated_node and _same_fields(left, updated_node):
            left = updated_node  # a handler that rebuilt the node from the same children (`with_changes(body=...)`)
        if changed or left is not updated_node:
            if self._changed_under:
                self._changed_under[-1] = True
            return left
        # A statement of the module's body, a class or a function that no handler changed is handed on as the node it
        # was, not as libcst's rebuilt copy: the chain reuses what it knows of a statement (its text, parents and
        # positions, ParsedSource.generated), and static_path knows an untouched function by identity.
        return original_node if len(self._changed_under) == 1 or _IS_SCOPE[type(original_node)] else left

    def transform_source(self, source: ParsedSource) -> cst.Module:
        """`transform_module` on a text the chain parsed once: its metadata (`source.metadata()`) is built when a
        codemod first asks for it, and shared by every codemod that sees the same text."""
        self.source = source
        self.metadata = source.metadata()
        try:
            tree = self.transform_module_impl(source.module)
        finally:
            self.metadata = {}
        wanted: list[ImportItem] = self.context.scratch.get(AddImportsVisitor.CONTEXT_KEY, [])
        if wanted and not _imports_present(self.context, source):
            if all(map(is_plain, wanted)):
                tree = with_plain_imports(tree, [item.module_name for item in wanted])
            else:
                tree = AddImportsVisitor(self.context).transform_module(tree)
        return tree

    def code_of_module(self, tree: cst.Module) -> str:
        """The module's text: the parsed source's own when `tree` is the module it was parsed into."""
        return self.source.text if tree is self.source.module else module_code(tree)

    def code_to_search(self, node: cst.CSTNode) -> str:
        """`code_of(node)` for a search of a text that holds no line break and starts with no whitespace (`"self.x ="
        in ...`). A method of a class of the source is read off the text the layout generated for it
        (`ParsedSource.method_text`), not generated again: indented under its class, it differs from `code_of`'s
        only by whitespace at the start of lines, which no such text can begin or end in."""
        text = self.source.method_text(node) if type(node) is cst.FunctionDef else None
        return code_of(node) if text is None else text

    def ast_of(self, node: cst.CSTNode) -> ast.AST:
        """What the chain's one `ast` parse of the text (`self.source.tree`) holds where the original `node` sits:
        the function for a `FunctionDef`, the expression for an expression. A fact that transforms.analysis computes
        on Python's AST (for the rules too) is read off it, not off a print of the node parsed again. Only for nodes
        of the tree being transformed: a node a codemod built has no position (LookupError)."""
        span = self.get_metadata(PositionProvider, node)
        start, end = (span.start.line, span.start.column), (span.end.line, span.end.column)
        if isinstance(node, cst.FunctionDef):  # libcst's ends after the body's last line break, `ast`'s before it
            found = self.source.ast_node(start, None, FUNCTION_TYPES)
        else:
            found = self.source.ast_node(start, end, ast.expr)
            if found is None and isinstance(node, (cst.Tuple, cst.GeneratorExp)):
                # `ast` counts the parentheses around a tuple or a generator as its own (a call's, around a
                # generator that is its one argument); libcst's position leaves them out.
                found = self.source.ast_node_around(start, end, ast.Tuple if isinstance(node, cst.Tuple)
                                                    else ast.GeneratorExp)
            elif found is None and isinstance(node, cst.BooleanOperation):
                found = self.source.ast_leading_values(start, end)  # the inner `a and b` of `a and b and c`
        if found is None:
            raise LookupError(f"no `ast` node at {start}-{end} for a {type(node).__name__}")
        return found

    # -- recording -------------------------------------------------------------------------------
    def _lines(self, node: cst.CSTNode) -> tuple[int, int]:
        span = self.get_metadata(PositionProvider, node)
        return span.start.line, span.end.line

    def record_edit(self, node: cst.CSTNode, summary: str) -> None:
        start, end = self._lines(node)
        self.edits.append(Edit(self.NAME, self.qualname(node), start, end, summary))

    def record_insertion_after(self, node: cst.CSTNode, summary: str) -> None:
        """An edit that adds code right after `node` (methods after `forward`): it sits at the node's last line,
        where the person reading the diff finds the added lines, not at its first."""
        end = self._lines(node)[1]
        self.edits.append(Edit(self.NAME, self.qualname(node), end, end, summary))

    def record_manual(self, node: cst.CSTNode, reason: str, advisory: bool = False) -> None:
        self.manual.append(PartialMatch(self.NAME, self.qualname(node), self._lines(node)[0], reason, self.SKILL,
                                        advisory))

    def qualname(self, node: cst.CSTNode) -> str:
        names: list[str] = []
        current: cst.CSTNode | None = node
        while current is not None:
            if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
                names.append(current.name.value)
            current = self.get_metadata(ParentNodeProvider, current, None)
        return ".".join(reversed(names))


@functools.cache
def _handled_types(owner: type) -> frozenset[type] | None:
    """`dispatch.handled_types`; None (every node may matter) for a codemod that overrides `on_visit` or `on_leave`,
    which see every node whatever its type."""
    if owner.on_visit is not GraphCodemod.on_visit or owner.on_leave is not GraphCodemod.on_leave:
        return None
    return handled_types(owner)


def _same_fields(left: object, node: cst.CSTNode) -> bool:
    """`left` is a node of the same type whose every field holds the very objects `node`'s does (a sequence: the same
    items, in order): nodes never change, so it is the same code, parents aside."""
    if type(left) is not type(node):
        return False
    for name in _field_names(type(node)):
        mine, theirs = getattr(left, name), getattr(node, name)
        if mine is theirs:
            continue
        if type(mine) not in (list, tuple) or type(theirs) not in (list, tuple) or len(mine) != len(theirs) \
                or any(a is not b for a, b in zip(mine, theirs)):
            return False
    return True


@functools.cache
def _handles_statements_only(owner: type) -> bool:
    """The codemod's handlers are all for statements, blocks or the module (`_handled_types`), none of which a
    statement line holds."""
    handled = _handled_types(owner)
    return handled is not None and all(issubclass(kind, (cst.BaseStatement, cst.BaseSuite, cst.Module))
                                       for kind in handled)


@functools.cache
def _field_names(node_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(node_type))


@functools.cache
def _is_statement(node_type: type) -> bool:
    return issubclass(node_type, cst.BaseStatement)


@functools.cache
def _is_scope(node_type: type) -> bool:
    """A class or a function: asked once per type, as every node of a walk asks it (an `isinstance` against libcst's
    classes goes through their abstract base class's check)."""
    return issubclass(node_type, (cst.ClassDef, cst.FunctionDef))


# Asked at every node of a walk (GraphCodemod.on_visit and on_leave): dict items, not functools.cache calls.
_IS_SCOPE: dict[type, bool] = Computed(_is_scope)
_IS_STATEMENT: dict[type, bool] = Computed(_is_statement)
_STATEMENTS_ONLY: dict[type, bool] = Computed(_handles_statements_only)
# What a statement, a block or a clause of one may hold sits under these; under any other node (an expression,
# parameters, a decorator, whitespace) there is none.
_MAY_HOLD_STATEMENTS: dict[type, bool] = Computed(lambda kind: issubclass(kind, (
    cst.BaseStatement, cst.BaseSuite, cst.Module, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally,
    cst.MatchCase)))


class StepCodemod(GraphCodemod):
    """A codemod that only touches code a model step reaches (`forward`, `decode`, ... and what they call in
    the same file; transforms.analysis.reach), as the rules only report there."""

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._step_functions = self.source.step_functions if tree is self.source.module else \
            step_qualnames(module_code(tree))
        return super().transform_module_impl(tree)

    def passes_over(self, qualname: str) -> bool:
        return not self._in_step_function(qualname) or super().passes_over(qualname)

    def in_step_code(self, node: cst.CSTNode) -> bool:
        return self._in_step_function(self.qualname(node))

    def _in_step_function(self, qualname: str) -> bool:
        """The name is a step function's, or inside one (a nested function, a class in it)."""
        parts = qualname.split(".")
        return any(".".join(parts[:i]) in self._step_functions for i in range(1, len(parts) + 1))


def _imports_present(context: CodemodContext, source: ParsedSource) -> bool:
    """Every import a codemod asked for is a plain `import X` the module already has at its top: AddImportsVisitor
    (a walk and a metadata resolution of its own) would change nothing."""
    wanted: list[ImportItem] = context.scratch[AddImportsVisitor.CONTEXT_KEY]
    present = {alias.name for stmt in source.unnumbered_tree.body if isinstance(stmt, ast.Import)
               for alias in stmt.names if alias.asname is None}
    return all(item.obj_name is None and item.alias is None and item.module_name in present for item in wanted)
