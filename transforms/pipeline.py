"""Runs the selected codemods over one source file and reports every edit in the original's lines."""
from __future__ import annotations

import ast
import difflib
import gc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from libcst.codemod import CodemodContext, SkipFile

from graphmode.transforms.codemods import CHAIN, CODEMODS, Edit, PartialMatch, Options
from graphmode.transforms.codemods.caches.cache_object import NO_MASK_HELPER
from graphmode.transforms.findings import Finding
from graphmode.transforms.line_matching import carried_numbers
from graphmode.transforms.output.helper_module import move_helpers_out
from graphmode.transforms.output.line_wrap import wrapped_with_code
from graphmode.transforms.output.no_entry import without_entry_promises
from graphmode.transforms.output.static_path import (already_adapted, fork_lines, function_spans, keep_original_path,
                                              twin_spans)
from graphmode.transforms.output.tidy import tidy
from graphmode.transforms.parsed import ParsedSource
from graphmode.transforms.positions import module_code_reusing


@dataclass
class FileAdaptation:
    path: str
    original: str
    adapted: str
    edits: list[Edit] = field(default_factory=list)  # lines refer to the original source
    manual: list[PartialMatch] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # codemods that changed this file, in order
    # The codemods' rewrite before the original bodies were put back beside it (transforms/output/static_path.py): what
    # the static path runs, function for function in the original's places. Empty: the same as `adapted`.
    static_view: str = ""

    @property
    def changed(self) -> bool:
        return self.adapted != self.original

    def diff(self) -> str:
        """The adapted file against the original: what is written (with the helper module beside it,
        `helper_module.helper_module_diffs`)."""
        return self._diff(self.adapted)

    def static_diff(self) -> str:
        """The static path against the original, each rewritten function where it was: what a change does."""
        return self._diff(self.static_view or self.adapted)

    def _diff(self, new: str) -> str:
        return "".join(difflib.unified_diff(
            self.original.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=f"a/{self.path}", tofile=f"b/{self.path}",
        ))


def adapt_files(texts: Iterable[tuple[str, str]], selected: Iterable[str] | None,
                options_of: Callable[[str], Options]) -> dict[str, FileAdaptation]:
    """`adapt_source` over a target's files ((path, text) pairs; `options_of(path)`: each file's options). A Hub folder
    may keep its model class, and the mask it builds, in one file and the attention in another (Hunyuan-A13B:
    hunyuan.py imports its layers from modeling_hunyuan.py). The cache and its mask change together or not at all,
    so such a pair is adapted again, each file told of the other (`Options.static_caches_in`, `Options.masks_in`),
    and kept only where both sides changed."""
    texts = dict(texts)
    chosen = None if selected is None else set(selected)
    adapted = {path: adapt_source(text, path, chosen, options_of(path)) for path, text in texts.items()}
    stems = {PurePosixPath(path).stem: path for path in texts}
    static = {stem for stem, path in stems.items() if "cache_object" in adapted[path].applied}
    unmasked = {stem for stem, path in stems.items() if _no_mask_of_its_own(adapted[path])}
    if not static | unmasked:
        return adapted  # no cache made static, none left for want of a mask: no file to read the imports of
    for path, text in texts.items():
        layers_from = _imported_modules(text) & (static | unmasked) - {PurePosixPath(path).stem}
        if layers_from and "cache_object" not in adapted[path].applied:
            adapted.update(_adapted_pair(path, {stems[stem] for stem in layers_from & unmasked}, layers_from, texts,
                                         chosen, options_of))
    return adapted


def _adapted_pair(model: str, unmasked: set[str], layers_from: set[str], texts: dict[str, str],
                  chosen: set[str] | None, options_of: Callable[[str], Options]) -> dict[str, FileAdaptation]:
    """The model's file adapted with its layers' modules (`layers_from`, by stem) known static, and the layers' files
    that build no mask (`unmasked`, by path) with the model's file known to mask them; {} unless every one of them
    made its cache or mask static."""
    adapted = {model: adapt_source(texts[model], model, chosen,
                                   replace(options_of(model), static_caches_in=tuple(sorted(layers_from))))}
    for path in sorted(unmasked):
        adapted[path] = adapt_source(texts[path], path, chosen,
                                     replace(options_of(path), masks_in=(PurePosixPath(model).stem,)))
    return adapted if all("cache_object" in a.applied for a in adapted.values()) else {}


def _no_mask_of_its_own(adaptation: FileAdaptation) -> bool:
    """cache_object left the file's cache as it was for want of a mask helper in that file alone."""
    return any(m.codemod == "cache_object" and m.reason.endswith(NO_MASK_HELPER) for m in adaptation.manual)


def _imported_modules(source: str) -> set[str]:
    """The last component of every module a `from X import ...` of the source names (`from .modeling_x import A`:
    "modeling_x"), and the names of `from . import modeling_x`."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.module:
                found.add(node.module.rsplit(".", 1)[-1])
            else:
                found |= {alias.name for alias in node.names}
    return found


def adapt_source(source: str, path: str, selected: Iterable[str] | None, options: Options) -> FileAdaptation:
    """Applies the selected codemods (all when None). Never returns a half rewrite: a codemod whose
    prerequisite could not be applied is left out, and that is reported as a manual item."""
    with _cyclic_gc_paused():
        return _adapt(source, path, selected, options)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The chain allocates millions of short-lived objects beside trees of some 100,000 live ones, so Python's
    cyclic collector runs again and again over the trees: a fifth of the chain's time. Reference counting frees
    almost all of it anyway; what sits in a cycle is collected once the collector runs again after the chain."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _adapt(source: str, path: str, selected: Iterable[str] | None, options: Options) -> FileAdaptation:
    if already_adapted(source):
        # Its static path is written, and the code beside it is the model's own, which stays as it is: a second run
        # changes nothing. graphmode adapts from the original.
        return FileAdaptation(path=path, original=source, adapted=source)
    names = set(CODEMODS) if selected is None else set(selected)
    dropped: list[PartialMatch] = []
    while True:
        result = _run_chain(source, path, names, options)
        broken = [
            (name, req) for name in result.applied for req in CODEMODS[name].REQUIRES
            if req in names and req not in result.applied and any(m.codemod == req for m in result.manual)
        ]
        if not broken:
            result.manual = dropped + result.manual
            return result
        for name, req in broken:
            names.discard(name)
            first = next(e for e in result.edits if e.codemod == name)
            dropped.append(PartialMatch(name, first.function, first.start_line,
                                      f"not applied: it needs `{req}`, which could not be applied here",
                                      CODEMODS[name].SKILL))


def _run_chain(source: str, path: str, names: set[str], options: Options) -> FileAdaptation:
    result = FileAdaptation(path=path, original=source, adapted=source)
    to_original: list[int | None] = list(range(1, source.count("\n") + 2))
    current = source
    parsed = original = ParsedSource(source)  # the current text, parsed when a codemod first needs it
    for codemod_class in CHAIN:
        if codemod_class.NAME not in names:
            continue
        moved = _in_current_lines(options, path, to_original)
        if not codemod_class.may_apply(parsed, moved):
            continue
        codemod = codemod_class(CodemodContext(filename=path), moved)
        try:
            tree = codemod.transform_source(parsed)
        except SkipFile:
            continue
        # A codemod records an edit for every span it rewrites (tests/test_pipeline_shortcuts.py holds them to it), so
        # one that recorded none left the text as it was, and generating it again would only cost time.
        generated = ParsedSource.generated(tree, parsed) if codemod.edits else parsed
        new = generated.text
        result.manual += [replace(m, line=_span(to_original, m.line, m.line)[0]) for m in codemod.manual]
        if new == current:
            continue
        result.applied.append(codemod_class.NAME)
        for edit in codemod.edits:
            start, end = _span(to_original, edit.start_line, edit.end_line)
            result.edits.append(replace(edit, start_line=start, end_line=end))
        to_original = _carry_line_map(current, new, to_original)
        current, parsed = new, generated
    if parsed.text is not source:
        # The static path is an addition: every function the chain changed keeps its original body beside it.
        result.static_view = current
        # The helpers the codemods inserted go to graphmode_static.py beside the file, which it imports.
        split = move_helpers_out(keep_original_path(original.module, parsed.module, source, parsed.method_text),
                                 original.module, source)
        module = tidy(split)
        if options.entry_class is None:  # no entries, so no `setup_caches` for graphmode's words to point to
            module = without_entry_promises(module, source)
        # The statements, methods and statements of methods the chain's layouts generated are not generated again.
        layouts = [found.__dict__["layout"] for found in (original, parsed) if "layout" in found.__dict__]
        current = wrapped_with_code(module, source, module_code_reusing(module, layouts))[1]
        ast.parse(current)  # the output always parses; a failure here is a codemod bug
        if current == source:  # the chain only renamed parameters, and the original body serves as it is
            result.applied, result.edits, result.static_view = [], [], ""
    result.adapted = current
    return result


def _in_current_lines(options: Options, path: str, to_original: list[int | None]) -> Options:
    """The options with the evidence's lines (lines of the original) moved to where the earlier codemods of the
    chain left them; a line they rewrote has no evidence any more."""
    if not (options.evidence_caches or options.evidence_cache_writes or options.host_sync_lines
            or options.position_lines or options.cache_reads or options.position_tests):
        return options
    current = {line: index + 1 for index, line in enumerate(to_original) if line is not None}

    def moved(entries: tuple[tuple, ...]) -> tuple[tuple, ...]:  # (file, line, ...) entries; other files' stay
        return tuple((file, current[line], *rest) if file == path else (file, line, *rest)
                     for file, line, *rest in entries if file != path or line in current)

    return replace(options, evidence_caches=moved(options.evidence_caches),
                   evidence_cache_writes=moved(options.evidence_cache_writes),
                   host_sync_lines=moved(options.host_sync_lines), position_lines=moved(options.position_lines),
                   cache_reads=moved(options.cache_reads), position_tests=moved(options.position_tests))


def original_to_adapted(original: str, adapted: str) -> dict[int, int]:
    """Line numbers of the original's unchanged lines in the adapted text. A line of a function with a static twin
    maps into the twin, which is what the entries run (its copy in the original body runs for other callers); one of
    a method that forks on the switch maps as static_path.fork_lines says."""
    identity: list[int | None] = list(range(1, original.count("\n") + 2))
    mapped = _carry_line_map(original, adapted, identity)
    lines = {line: index + 1 for index, line in enumerate(mapped) if line is not None}
    original_lines, adapted_lines = original.splitlines(), adapted.splitlines()
    originals = function_spans(ast.parse(original))
    for qualname, (start, end) in twin_spans(ast.parse(adapted)).items():
        if qualname not in originals:
            continue
        first, last = originals[qualname]
        in_twin = _carry_line_map("\n".join(original_lines[first - 1:last]), "\n".join(adapted_lines[start - 1:end]),
                                  list(range(first, last + 1)))
        lines.update({line: start + index for index, line in enumerate(in_twin) if line is not None})
    lines.update(fork_lines(original, adapted))
    return lines


def _carry_line_map(old: str, new: str, to_original: list[int | None]) -> list[int | None]:
    """Original line numbers for the new text: unchanged lines keep theirs, written ones get None."""
    # One entry more than lines, as the chain's first map has (one for the empty text after the last newline).
    return carried_numbers(old.splitlines(), new.splitlines(), to_original) + [None]


def _span(to_original: list[int | None], start: int, end: int) -> tuple[int, int]:
    lines = [to_original[i - 1] for i in range(start, end + 1) if 0 < i <= len(to_original) and to_original[i - 1]]
    if lines:
        return min(lines), max(lines)
    earlier = [to_original[i] for i in range(min(start, len(to_original)) - 1, -1, -1) if to_original[i]]
    line = earlier[0] if earlier else 1
    return line, line


def fixed_by(finding: Finding, edits: Iterable[Edit]) -> str | None:
    """The first codemod (in chain order) whose edit covers the finding and that fixes its kind."""
    for edit in sorted(edits, key=lambda e: list(CODEMODS).index(e.codemod)):
        if finding.code in CODEMODS[edit.codemod].FIXES and edit.start_line <= finding.line <= edit.end_line:
            return edit.codemod
    return None
