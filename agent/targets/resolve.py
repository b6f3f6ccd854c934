"""What `graphmode adapt` adapts and how it runs, whatever named it: `resolve(spec) -> Target`.

A target takes one of three forms:
- a folder holding the model's sources and a harness.py (`graphmode init` writes one);
- a Hugging Face model (`--hf`): a model type of the target interpreter's transformers, a config.json, or a Hub
  folder whose remote code (config.json's auto_map) is what gets rewritten;
- a folder of model sources whose calling convention a graphmode.toml names: graphmode writes the harness.
A graphmode.toml may name any of them (`[target]`); agent.cli.adapt merges it with the command line first.

`resolve` decides everything that can be decided without writing, so a bad target is refused before a session
starts; `Target.materialize` then writes what the form needs (the --hf harness and sources, the convention's
harness beside a copy of the sources) under the run folder, never into the user's folder.
"""
from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphmode.agent.errors import UserError

if TYPE_CHECKING:
    from graphmode.agent.targets.hf import HFTarget
    from graphmode.agent.targets.target_file import TargetFile
    from graphmode.runners.interpreter import Interpreter

HARNESS, HF, CONVENTION = "harness", "hf", "convention"


@dataclass
class TargetSpec:
    """What the person named: a folder (or its harness.py), or --hf; with the graphmode.toml found for it."""
    path: Path | None
    hf: str | None
    tiny: bool
    steps: int  # Decode steps: an --hf target's static cache and a harness's MAX_SEQ_LEN must hold them
    out: Path
    file: TargetFile | None = None
    rewrite: bool = False  # --rewrite: a type transformers implements is adapted from a copy of its modeling file


@dataclass
class Target:
    kind: str  # HARNESS, HF or CONVENTION
    folder: Path  # the folder the workflow adapts; for HF and CONVENTION, where materialize() writes it
    run_dir: Path
    sources: list[str] | None = None  # graphmode.toml's [target] sources, relative to `folder`
    hf: HFTarget | None = None
    hf_spec: str | None = None
    max_seq_len: int | None = None  # the --hf target's static cache length
    convention_harness: str | None = None  # the harness written for a convention

    def hf_summary(self) -> dict[str, Any] | None:
        """What the documents say about an --hf target (RunOptions.hf); None for the other forms."""
        from graphmode.agent.targets.hf import summary

        return summary(self.hf) if self.hf is not None else None

    def materialize(self, say: Callable[[str], None]) -> Path:
        """Writes what the target's form needs under the run folder and returns the folder to adapt."""
        if self.kind == HF:
            _write_hf_target(self.hf, self.hf_spec, self.folder, self.max_seq_len, say)
        elif self.kind == CONVENTION:
            from graphmode.agent.targets.convention import write_convention_target

            self.folder = write_convention_target(self.folder, self.run_dir / "target", self.convention_harness)
        return self.folder


def resolve(spec: TargetSpec, interpreter: Interpreter, say: Callable[[str], None]) -> Target:
    """The target the spec names, checked; bad input (a UserError) when it cannot be adapted as named."""
    if spec.hf is not None:
        return _hf(spec, interpreter)
    folder = target_folder(spec.path)
    convention = spec.file.target.get("convention") if spec.file else None
    sources = spec.file.sources_in(folder) if spec.file is not None else None
    run_dir = (spec.out / folder.name).resolve()
    if (folder / "harness.py").is_file():
        declared = declared_max_seq_len(folder / "harness.py")
        if declared is not None and spec.steps >= declared:
            raise UserError(f"--steps {spec.steps}: the harness's MAX_SEQ_LEN is {declared}, which must hold the "
                            "prompt and every Decode step")
        return Target(HARNESS, folder, run_dir, sources)
    if convention is None:
        raise UserError(f"{spec.path}: no harness.py there (a target is a folder with the model sources and a "
                        "harness.py, which `graphmode init` writes; or give a Hugging Face model with --hf, or a "
                        "calling convention in graphmode.toml)")
    from graphmode.agent.targets.convention import convention_harness

    harness, found = convention_harness(folder, convention, spec.file.path)
    say(f"no harness.py in {folder}: graphmode writes one for convention {found.convention} "
        f"({'named' if found.named else 'detected'}) into the run folder")
    return Target(CONVENTION, folder, run_dir, sources, convention_harness=harness)


def _hf(spec: TargetSpec, interpreter: Interpreter) -> Target:
    from graphmode.agent.targets.hf import resolve as resolve_hf
    from graphmode.runners.releases import hf_release_problem

    # --hf runs the model on the interpreter's transformers: it must have one, recent enough for the path driven.
    problem = hf_release_problem(spec.hf, interpreter.path, interpreter.transformers)
    if problem:
        raise UserError(f"--hf {spec.hf}: {problem}")
    max_seq_len = hf_max_seq_len(spec.steps)
    found = resolve_hf(spec.hf, spec.tiny, max_seq_len, interpreter.path, spec.rewrite)
    if found.installed_copy:
        _check_same_release(spec.hf, found, interpreter)
    elif found.package:
        # The folder's own code runs on the interpreter's transformers, which graphmode's harness imports. A folder
        # with a harness of its own is not checked: its harness may put another transformers on the path (the test
        # bed runs a release's file against that release's own package, on this interpreter), and a failure then
        # says what it lacks.
        _check_release(*target_code(None, spec.hf), interpreter)
    found.transformers_version = interpreter.transformers or found.transformers_version
    return Target(HF, (spec.out / found.name / "target").resolve(), (spec.out / found.name).resolve(), hf=found,
                  hf_spec=spec.hf, max_seq_len=max_seq_len)


def _check_same_release(hf: str, found: HFTarget, interpreter: Interpreter) -> None:
    """The copy is made from graphmode's own transformers, and imports the interpreter's: they must be one release."""
    if interpreter.transformers and interpreter.transformers != found.transformers_version:
        raise UserError(f"--hf {hf}: the copy of {found.installed_module} is made from graphmode's own transformers "
                        f"{found.transformers_version}, but the model runs under {interpreter.path} with transformers "
                        f"{interpreter.transformers}, whose other modules it would import; run graphmode from that "
                        "interpreter, or drop --python")


def target_folder(path: Path) -> Path:
    """The target folder PATH names (the folder itself, or its harness.py), which must exist."""
    folder = path.resolve()
    if folder.name == "harness.py":
        folder = folder.parent
    if not folder.exists():
        raise UserError(f"{path}: no such file or folder")
    return folder


def hf_max_seq_len(steps: int) -> int:
    """The static cache of an --hf run: the 8-token prompt and every Decode step, at least 64."""
    return max(64, 8 + steps + 8)


def _check_release(folder: Path, texts: dict[str, str], interpreter: Interpreter) -> None:
    """Refuses, before anything runs, code (`texts`, `code_texts` of `folder`) that uses a transformers name
    (runners.releases.RELEASE_FACTS) the interpreter's release lacks, with the releases that have every name the
    code uses."""
    from graphmode.runners.releases import names_used, release_need

    problem = release_need(names_used(texts), interpreter.transformers)
    if problem:
        raise UserError(f"{folder}: {problem}")


def code_texts(folder: Path, files: list[str] | None) -> dict[str, str]:
    """{path relative to `folder`: text} of `files` (None: the folder's own .py files); unreadable ones left out
    (analysis reports them with their own message)."""
    paths = [folder / f for f in files] if files is not None else sorted(folder.glob("*.py"))
    texts = {}
    for path in paths:
        try:
            texts[str(path.relative_to(folder))] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError, ValueError):
            continue
    return texts


def target_code(path: Path | None, hf: str | None) -> tuple[Path | None, dict[str, str]]:
    """The folder of the code a target runs and its texts, read without running anything: a folder target's
    sources (the harness's literal SOURCES, else its .py files), a remote-code folder's .py files; none for a
    model type transformers implements."""
    if hf is not None:
        folder = Path(hf).expanduser()
        folder = folder.parent if folder.is_file() else folder
        return (folder, code_texts(folder, None)) if folder.is_dir() else (None, {})
    folder = target_folder(path)
    harness = folder / "harness.py"
    return folder, code_texts(folder, declared_sources(harness) if harness.is_file() else None)


def declared_sources(harness: Path) -> list[str] | None:
    """`SOURCES = [...]` at the top of the harness when it is a list of strings, read without running it; else None."""
    try:
        tree = ast.parse(harness.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SOURCES" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return list(value) if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) else None
    return None


def declared_max_seq_len(harness: Path) -> int | None:
    """`MAX_SEQ_LEN = N` at the top of the harness, read without running it; None when not written so."""
    try:
        tree = ast.parse(harness.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # analysis reports the harness's own problem with its file and line
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MAX_SEQ_LEN" for t in node.targets) \
                and isinstance(node.value, ast.Constant) and type(node.value.value) is int:
            return node.value.value
    return None


def _write_hf_target(hf_target: HFTarget, spec: str, folder: Path, max_seq_len: int,
                     say: Callable[[str], None]) -> None:
    from graphmode.agent.targets.hf import write_target

    path = Path(spec).expanduser()
    write_target(hf_target, path if path.exists() else None, folder, max_seq_len)
    if hf_target.installed_copy:
        what = (f"the installed {hf_target.installed_module} is what gets rewritten, in a copy "
                f"({', '.join(hf_target.sources)}) under {folder}, its relative imports made absolute, every line "
                "where it was; the installed file is not touched")
    elif hf_target.package:
        what = (f"its own code ({', '.join(hf_target.sources)}) is what gets rewritten, in a copy under "
                f"{folder} (the same lines as in {path})")
    else:
        what = "transformers' code is not rewritten: graphmode drives its static-cache path"
    weights = "tiny random weights" if hf_target.tiny else f"weights from {hf_target.weights_folder}"
    say(f"{hf_target.model_type} with transformers {hf_target.transformers_version}, {weights}; {what}. "
        f"Harness: {folder / 'harness.py'}")
    for note in hf_target.notes:
        say(f"[yellow]note:[/] {note}")
