"""Lines graphmode wrote, wrapped to the file's own limit.

A codemod writes a call or a signature on one line (`self.register_buffer("cache_k", torch.zeros((max(...), ...)),
persistent=False)`), and a file kept to 110 columns gets lines of 179. The limit is the file's own: its longest line
before graphmode (at least 79). Only lines the original does not have are wrapped, so the model's own long lines
stay as they were; a line is wrapped the way a formatter would: a call's arguments (a signature's parameters, the
values of a tuple an assignment gives) on one line of their own inside the brackets where they fit there, else one
per line, the outermost first, then inner ones while a line is still too long; the operands of an `if` test's
`and`/`or` chain one per line in brackets; a run of comment lines re-filled; a docstring's prose paragraph re-filled
(its lists, examples and indented lines kept as written). Dict literals and f-strings are left as they are.
"""
from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, ParentNodeProvider, PositionProvider

from graphmode.transforms.cstutil import is_docstring, nodes_of_type, walk
from graphmode.transforms.dispatch import Transformer
from graphmode.transforms.positions import Span, code_for_node, module_code, positions_and_parents

MIN_LIMIT = 79
_ROUNDS = 12  # each round wraps one call (or signature) per statement; nesting is rarely deeper


def wrap_long_lines(module: cst.Module, original: str) -> cst.Module:
    """`module` with the long lines it has and `original` has not wrapped to `original`'s longest line."""
    return wrapped_with_code(module, original)[0]


def wrapped_with_code(module: cst.Module, original: str, code: str | None = None) -> tuple[cst.Module, str]:
    """`wrap_long_lines` and the wrapped module's code, which it generates anyway (once per round). `code`: the
    module's code, where the caller has it."""
    known = set(original.splitlines())
    limit = max([MIN_LIMIT, *(len(line) for line in known)])
    if code is None:
        code = module_code(module)
    for _ in range(_ROUNDS):
        lines = code.splitlines()
        long = {number for number, line in enumerate(lines, 1) if len(line) > limit and line not in known}
        if not long:
            break
        wrapped = _wrap_round(module, long, limit, lines)
        wrapped_code = module_code(wrapped)
        if wrapped_code == code:
            break
        module, code = wrapped, wrapped_code
    return module, code


def _wrap_round(module: cst.Module, long: set[int], limit: int, lines: list[str]) -> cst.Module:
    table, parents, twice = positions_and_parents(module)  # libcst's two providers, at a third of their cost
    positions = _Ranges(table)
    if not all(_never_asked(node) for node in twice):
        # A node this pass may ask about sits in two places; libcst's providers give the position of the last one.
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        positions, parents = wrapper.resolve(PositionProvider), wrapper.resolve(ParentNodeProvider)
    chosen: dict[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]] = {}  # node -> its rewrite
    for statement in _nodes(module, cst.SimpleStatementLine):
        span = positions[statement]
        if not long & set(range(span.start.line, span.end.line + 1)):
            continue
        # The outermost call (or bracketed tuple) that opens on a long line; its arguments go on lines of their own.
        for node in _nodes(statement, (cst.Call, cst.Tuple)):
            if (positions[node].start.line in long and _wrappable(node, parents.get(node))
                    and not _in_fstring(node, parents)):
                depth = _wrapped_around(node, statement, parents)
                wrap = _wrap_call if isinstance(node, cst.Call) else _wrap_tuple
                room = limit - span.start.column  # the columns right of the statement's indentation
                chosen[node] = lambda updated, wrap=wrap, depth=depth, room=room: wrap(updated, depth, room)
                break
    for function in _nodes(module, cst.FunctionDef):
        header = positions[function].start.line
        if header in long and function.params.params and not isinstance(function.whitespace_before_params,
                                                                          cst.ParenthesizedWhitespace):
            chosen[function] = _wrap_params
    # An `if`/`elif`/`while` whose test is a chain of `and`s (or `or`s): the operands one per line in brackets.
    for branch in _nodes(module, (cst.If, cst.While)):
        if positions[branch].start.line in long and _chain(branch.test):
            chosen[branch] = _wrap_test
    # Docstrings: a prose paragraph with a long line is re-filled; lists, code and indented lines stay as written.
    for owner in _nodes(module, (cst.FunctionDef, cst.ClassDef)):
        docstring = _docstring(owner)
        if docstring is None:
            continue
        span = positions[docstring]
        rows = {number - span.start.line for number in long if span.start.line <= number <= span.end.line}
        if rows:
            indent = positions[owner.body.body[0]].start.column
            chosen[docstring] = lambda updated, indent=indent, rows=rows: _refilled_docstring(updated, limit, indent,
                                                                                              rows)
    # Comments: a block of comment lines with a long one is re-flowed as paragraphs (one per "# graphmode:").
    # (Comment lines sit only in the leading lines of statements and of the clauses and decorators that have them.)
    owners = [node for node in walk(module) if getattr(node, "leading_lines", None)]
    long_comments = {id(line) for owner in owners for line in owner.leading_lines
                     if line.comment is not None and positions[line].start.line in long}
    for owner in owners:
        leading = owner.leading_lines
        if leading and any(id(line) in long_comments for line in leading):
            number = positions[next(line for line in leading if id(line) in long_comments)].start.line
            width = limit - (len(lines[number - 1]) - len(lines[number - 1].lstrip()))
            marked = {index for index, line in enumerate(leading) if id(line) in long_comments}
            reflow = chosen.get(owner)
            chosen[owner] = lambda updated, width=width, reflow=reflow, marked=marked: _with_reflowed_comments(
                reflow(updated) if reflow else updated, width, marked)
    return module.visit(_Replace(chosen)) if chosen else module


def _never_asked(node: cst.CSTNode) -> bool:
    """Whitespace, a comment, a blank line (rewrites share them: `[cst.EmptyLine()] * 2`): this pass asks positions of
    statements, expressions and comment lines, and parents of expressions."""
    return isinstance(node, (cst.BaseParenthesizableWhitespace, cst.Newline, cst.TrailingWhitespace, cst.Comment)) or (
        isinstance(node, cst.EmptyLine) and node.comment is None)


class _Ranges(dict):
    """A position table read as PositionProvider's: a CodeRange per node."""

    def __init__(self, table: dict[cst.CSTNode, Span]) -> None:
        super().__init__()
        self.table = table

    def __missing__(self, node: cst.CSTNode) -> CodeRange:
        found = self[node] = CodeRange(*self.table[node])
        return found


class _Replace(Transformer):
    """Applies each chosen node's rewrite to the node as its children were rewritten."""

    def __init__(self, chosen: dict[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]]) -> None:
        super().__init__()
        self.chosen = chosen

    def on_leave(self, original_node, updated_node):
        rewrite = self.chosen.get(original_node)
        return rewrite(updated_node) if rewrite is not None else updated_node


def _nodes(root: cst.CSTNode, kind: type) -> list:
    """The nodes of that kind (a statement, a call, a tuple: never whitespace) in the order a visitor meets them."""
    return nodes_of_type(root, kind)


def _wrapped(node: cst.CSTNode) -> bool:
    """Whether a call's arguments (a tuple's elements) already start on a line of their own."""
    if isinstance(node, cst.Call):
        return isinstance(node.whitespace_before_args, cst.ParenthesizedWhitespace)
    if isinstance(node, cst.Tuple) and node.lpar:
        return isinstance(node.lpar[0].whitespace_after, cst.ParenthesizedWhitespace)
    return False


def _wrappable(node: cst.CSTNode, parent: cst.CSTNode | None) -> bool:
    if _wrapped(node):
        return False
    if isinstance(node, cst.Call):  # a trailing comma after a bare generator argument is a syntax error
        return bool(node.args) and not isinstance(node.args[-1].value, cst.GeneratorExp)
    # A tuple in brackets, or the bare tuple of values an assignment or a return gives (brackets added): never a
    # target, which may not be bracketed the same way everywhere.
    value = isinstance(parent, (cst.Assign, cst.Return)) and parent.value is node
    return (bool(node.lpar) or value) and len(node.elements) > 1 and not any(
        isinstance(e, cst.StarredElement) for e in node.elements)


def _new_line(extra: str) -> cst.ParenthesizedWhitespace:
    """A line break inside brackets, the next line at the statement's indentation plus `extra`."""
    return cst.ParenthesizedWhitespace(first_line=cst.TrailingWhitespace(), empty_lines=[], indent=True,
                                       last_line=cst.SimpleWhitespace(extra))


def _wrap_call(call: cst.Call, depth: int, room: int) -> cst.Call:
    """The arguments on one line of their own inside the brackets when they fit in `room` columns there (as a
    formatter hugs them), else each on its own line with a comma after it; one indent in from the brackets around
    the call (`depth` of them already wrapped), the closing parenthesis on a line of its own."""
    inner, closing = "    " * (depth + 1), "    " * depth
    hugged = _hugged(call.args, room - len(inner))
    if hugged is not None:
        return call.with_changes(whitespace_before_args=_new_line(inner),
                                 args=[*hugged[:-1], hugged[-1].with_changes(whitespace_after_arg=_new_line(closing))])
    args = [arg.with_changes(comma=cst.Comma(whitespace_after=_new_line(closing if last else inner)))
            for last, arg in ((i == len(call.args) - 1, a) for i, a in enumerate(call.args))]
    return call.with_changes(whitespace_before_args=_new_line(inner), args=args)


def _hugged(items, room: int) -> list | None:
    """The arguments (or elements) with a comma and a space between them and none after the last, when they are
    written on one line and that line fits in `room` columns; else None."""
    last = len(items) - 1
    hugged = [item.with_changes(comma=cst.MaybeSentinel.DEFAULT if index == last else
                                cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
              for index, item in enumerate(items)]
    if isinstance(hugged[-1], cst.Arg):
        hugged[-1] = hugged[-1].with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
    text = "".join(code_for_node(item) for item in hugged)
    return hugged if "\n" not in text and len(text) <= room else None


def _in_fstring(node: cst.CSTNode, parents) -> bool:
    """Inside an f-string's braces a line break is a syntax error before Python 3.12."""
    parent = parents.get(node)
    while parent is not None:
        if isinstance(parent, cst.FormattedString):
            return True
        parent = parents.get(parent)
    return False


def _wrap_tuple(node: cst.Tuple, depth: int, room: int) -> cst.Tuple:
    """A bracketed tuple's elements hugged on one line, or one per line, as a call's arguments."""
    inner, closing = "    " * (depth + 1), "    " * depth
    hugged = _hugged(node.elements, room - len(inner)) if len(node.elements) > 1 else None
    if not node.lpar:
        node = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    lpar = [node.lpar[0].with_changes(whitespace_after=_new_line(inner)), *node.lpar[1:]]
    if hugged is not None:  # the closing bracket on a line of its own
        rpar = [*node.rpar[:-1], node.rpar[-1].with_changes(whitespace_before=_new_line(closing))]
        return node.with_changes(lpar=lpar, rpar=rpar, elements=hugged)
    elements = [e.with_changes(comma=cst.Comma(whitespace_after=_new_line(closing if last else inner)))
                for last, e in ((i == len(node.elements) - 1, e) for i, e in enumerate(node.elements))]
    return node.with_changes(lpar=lpar, elements=elements)


def _wrapped_around(node: cst.CSTNode, statement: cst.CSTNode, parents) -> int:
    """How many wrapped calls and tuples hold `node` within its statement."""
    count, parent = 0, parents.get(node)
    while parent is not None and parent is not statement:
        count += _wrapped(parent)
        parent = parents.get(parent)
    return count


def _wrap_params(function: cst.FunctionDef) -> cst.FunctionDef:
    params = list(function.params.params)
    others = (function.params.star_arg, function.params.kwonly_params, function.params.star_kwarg,
              function.params.posonly_params)
    if any(o for o in others if not isinstance(o, cst.MaybeSentinel)):
        return function  # a signature with * or ** or / is left as written
    params = [p.with_changes(comma=cst.Comma(whitespace_after=_new_line("" if index == len(params) - 1 else "    ")))
              for index, p in enumerate(params)]
    return function.with_changes(whitespace_before_params=_new_line("    "),
                                 params=function.params.with_changes(params=params))


def _with_reflowed_comments(owner: cst.CSTNode, width: int, marked: set[int]) -> cst.CSTNode:
    """`owner` with each run of comment lines that holds a long one (`marked`: their indexes among its leading
    lines) re-flowed within `width` columns."""
    out: list[cst.EmptyLine] = []
    run: list[tuple[int, cst.EmptyLine]] = []
    for index, line in [*enumerate(owner.leading_lines), (-1, None)]:
        if line is not None and line.comment is not None:
            run.append((index, line))
            continue
        lines = [r for _, r in run]
        out += _reflowed(lines, width) if any(i in marked for i, _ in run) else lines
        run = []
        if line is not None:
            out.append(line)
    return owner.with_changes(leading_lines=out)


def _reflowed(run: list[cst.EmptyLine], width: int) -> list[cst.EmptyLine]:
    """Comment lines as paragraphs (each "# graphmode:" line starts one) filled to `width` columns, words whole."""
    paragraphs: list[list[str]] = []
    for line in run:
        text = line.comment.value
        if text.startswith("# graphmode:") or not paragraphs:
            paragraphs.append([])
        paragraphs[-1] += text.lstrip("#").split()
    filled = [f"# {line}".rstrip() for words in paragraphs for line in _fill(words, width - 2, width - 2) or [""]]
    template = run[0]
    return [template.with_changes(comment=cst.Comment(text)) for text in filled]


def _chain(test: cst.BaseExpression) -> bool:
    """Whether a test is a bare chain of one boolean operator (`a and b and c`), not already in brackets."""
    return isinstance(test, cst.BooleanOperation) and not test.lpar


def _wrap_test(branch: cst.If | cst.While) -> cst.If | cst.While:
    """`if a and b:` as `if (\n    a\n    and b\n):`, the way a formatter breaks a long test."""
    kind = type(branch.test.operator)

    def spread(node: cst.BaseExpression) -> cst.BaseExpression:
        if not (isinstance(node, cst.BooleanOperation) and isinstance(node.operator, kind) and not node.lpar):
            return node
        operator = node.operator.with_changes(whitespace_before=_new_line("    "),
                                              whitespace_after=cst.SimpleWhitespace(" "))
        return node.with_changes(left=spread(node.left), operator=operator)

    test = spread(branch.test).with_changes(lpar=[cst.LeftParen(whitespace_after=_new_line("    "))],
                                            rpar=[cst.RightParen(whitespace_before=_new_line(""))])
    return branch.with_changes(test=test, whitespace_before_test=cst.SimpleWhitespace(" "))


def _docstring(owner: cst.FunctionDef | cst.ClassDef) -> cst.SimpleString | None:
    """The triple-quoted docstring of a function or class, or None."""
    body = owner.body.body if isinstance(owner.body, cst.IndentedBlock) else []
    if not body or not is_docstring(body[0]):
        return None
    value = body[0].body[0].value
    if isinstance(value, cst.SimpleString) and value.value.lstrip("rRuU")[:3] in ('"""', "'''"):
        return value
    return None


_NOT_PROSE = re.compile(r"(?:[-*|>]|\d+[.)]|```|\.\. )")


def _refilled_docstring(node: cst.SimpleString, limit: int, indent: int, rows: set[int]) -> cst.SimpleString:
    """The docstring with each prose paragraph that holds a long line (`rows`: line indexes within it) re-filled to
    `limit` columns; a paragraph is prose when every line sits at the docstring's indentation and none starts a list
    item, a table, a quote or an example."""
    prefix = node.value[:len(node.value) - len(node.value.lstrip("rRuU"))]
    opening = len(prefix) + 3
    lines = node.value[opening:-3].split("\n")
    margin = " " * indent
    paragraphs, start = [], None
    for index, line in enumerate([*lines, ""]):
        if line.strip() and start is None:
            start = index
        elif not line.strip() and start is not None:
            paragraphs.append((start, index))
            start = None
    for first, end in reversed(paragraphs):
        held = range(first, end)
        prose = all(index == 0 or (lines[index].startswith(margin) and not lines[index][indent:].startswith(" "))
                    for index in held) and not any(_NOT_PROSE.match(lines[index].strip()) for index in held)
        if not prose or not rows & set(held):
            continue
        closing = 3 if end == len(lines) else 0  # the closing quotes follow the paragraph's last line
        width = limit - indent - closing
        filled = fill_words(" ".join(lines[index].strip() for index in held),
                            width - (opening if first == 0 else 0), width)
        lines[first:end] = [text if first == 0 and number == 0 else margin + text
                            for number, text in enumerate(filled)]
    return node.with_changes(value=node.value[:opening] + "\n".join(lines) + node.value[-3:])


# A word: a `code span`, or graphmode's own marker "(added by graphmode)", which transforms.output.tidy finds its
# functions by (so a second run still knows them), kept whole; else anything up to a space.
_WORDS = re.compile(r"\(added by graphmode\)\S*|`[^`]*`\S*|\S+")


def fill_words(text: str, first_width: int, width: int) -> list[str]:
    """`text` in lines of at most `width` columns (`first_width` for the first), words (see _WORDS) whole."""
    return _fill(_WORDS.findall(text), first_width, width)


def _fill(words: list[str], first_width: int, width: int) -> list[str]:
    """The words in lines of at most `width` columns (`first_width` for the first), greedily; a word longer than a
    line gets a line of its own."""
    filled: list[str] = []
    current = ""
    for word in words:
        room = first_width if not filled else width
        if current and len(current) + 1 + len(word) > room:
            filled.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    return [*filled, current] if current else filled
