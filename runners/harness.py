"""Loading a harness folder (harness.py beside the model sources) and reading model outputs.

The harness contract: build_model(), make_prompt(), prefill(model, tokens) and
decode(model, token, state) in the original model's calling convention, plus the optional
MAX_SEQ_LEN (default 64) and SOURCES. An adapted folder holds an unchanged copy of the
same harness.py next to the rewritten sources, so the same build_model() (same seed)
gives the same weights on both sides.
"""
from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

import torch

from graphmode.transforms.output.helper_module_name import MODULE_NAME as HELPER_MODULE

HARNESS_FILE = "harness.py"
REQUIRED_FUNCTIONS = ("build_model", "make_prompt", "prefill", "decode")
DEFAULT_MAX_SEQ_LEN = 64


class HarnessError(RuntimeError):
    """The harness is missing, raised on import, or breaks the contract; one-line message."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def where_raised(exc: BaseException, folder: Path) -> str:
    """'file:line' of the innermost traceback frame inside `folder`, or '' if none is.

    The innermost frame in the user's folder is the line they can act on; frames in torch or
    in graphmode are noise for them.
    """
    folder = folder.resolve()
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if path.is_absolute() and path.resolve().is_relative_to(folder):
            found = f"{path}:{frame.lineno}"
    return found


def describe_exception(exc: BaseException, folder: Path) -> str:
    """'Type: message (at file:line)', on one line, for errors raised by user code; where no frame is in `folder`
    (a model whose code is an installed package's, transformers' modeling file), 'Type: message (at
    package/file.py:line `its code`)' for the innermost frame of an installed package other than torch."""
    where = where_raised(exc, folder) or installed_frame(exc)
    text = f"{type(exc).__name__}: {_one_line(exc)}"
    return f"{text} (at {where})" if where else text


def installed_frame(exc: BaseException) -> str:
    """'package/file.py:line `code`' of the innermost traceback frame in an installed package (site-packages)
    that is not torch's, or ''. A shape error raised in torch reads as the model's line that made it."""
    from graphmode.runners.measure.dynamo_watch import code_excerpt, is_library, short_path

    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        short = short_path(frame.filename)
        if short != frame.filename and not is_library(frame.filename):
            code = code_excerpt(frame.line or "")
            found = f"{short}:{frame.lineno}" + (f" `{code}`" if code else "")
    return found


def _evict_shadowed_modules(folder: Path) -> None:
    # The harness does `from model import ...`. If another folder's `model` is already in
    # sys.modules (a second load in one process), Python would silently reuse it. graphmode's
    # helper module stays: it is the same text in every adapted folder, and a model built from
    # an earlier folder keeps matching it (Dynamo imports a traced helper's module by name and
    # guards on its classes being the ones the model's module holds).
    for source in folder.glob("*.py"):
        if source.stem == HELPER_MODULE:
            continue
        cached = sys.modules.get(source.stem)
        cached_file = getattr(cached, "__file__", None)
        if cached is not None and (cached_file is None or Path(cached_file).resolve().parent != folder):
            del sys.modules[source.stem]


def load_harness(folder: Path) -> ModuleType:
    """Imports folder/harness.py with `folder` first on sys.path and checks the contract."""
    folder = Path(folder).resolve()
    path = folder / HARNESS_FILE
    if not path.is_file():
        raise HarnessError(f"no {HARNESS_FILE} in {folder}: a harness folder needs one beside the model sources")

    _evict_shadowed_modules(folder)
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("harness", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before exec: dataclasses and pickling look the module up by name.
    sys.modules["harness"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # SystemExit from a harness must not end the caller either
        del sys.modules["harness"]
        where = where_raised(exc, folder) or str(path)
        raise HarnessError(
            f"{where}: importing {path.name} raised {type(exc).__name__}: {_one_line(exc)}") from exc

    _check_contract(module, path)
    return module


def _check_contract(module: ModuleType, path: Path) -> None:
    """The harness defines the required functions, and its settings are well formed."""
    missing = [name for name in REQUIRED_FUNCTIONS if not callable(getattr(module, name, None))]
    if missing:
        raise HarnessError(
            f"{path}: the harness does not define {', '.join(missing)} "
            f"(required: {', '.join(REQUIRED_FUNCTIONS)})")
    _check_settings(module, path)


def _check_settings(module: ModuleType, path: Path) -> None:
    """MAX_SEQ_LEN a positive int, SOURCES (where given) a list of file names."""
    max_seq_len = getattr(module, "MAX_SEQ_LEN", DEFAULT_MAX_SEQ_LEN)
    if not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool) or max_seq_len <= 0:
        raise HarnessError(f"{path}: MAX_SEQ_LEN must be a positive int, got {max_seq_len!r}")
    sources = getattr(module, "SOURCES", None)
    if sources is not None and (not isinstance(sources, (list, tuple))
                                or not all(isinstance(s, str) for s in sources)):
        raise HarnessError(f"{path}: SOURCES must be a list of file names, got {sources!r}")


def max_seq_len(harness: ModuleType) -> int:
    return getattr(harness, "MAX_SEQ_LEN", DEFAULT_MAX_SEQ_LEN)


def static_length(harness: ModuleType, given: int | None = None) -> int:
    """The positions an adapted model's static path is set up for: `given` (a person revised the session's
    max_seq_len at confirmation), else the harness's MAX_SEQ_LEN."""
    return given if given is not None else max_seq_len(harness)


def size_static_path(model: torch.nn.Module, harness: ModuleType, max_batch_size: int,
                     length: int | None = None) -> None:
    """Allocates an adapted model's static buffers for its static length, through graphmode's `setup_caches` (the
    one its entries come with, which says so). A model's own `setup_caches` (the harness calls it) and a model
    without one are left alone."""
    setup = getattr(model, "setup_caches", None)
    if callable(setup) and "graphmode" in (getattr(setup, "__doc__", None) or ""):
        setup(max_batch_size=max_batch_size, max_seq_length=static_length(harness, length))


def sources(harness: ModuleType, folder: Path) -> list[str]:
    """The files graphmode may rewrite: SOURCES, else every .py in the folder but the harness."""
    declared = getattr(harness, "SOURCES", None)
    if declared is not None:
        return list(declared)
    return sorted(p.name for p in Path(folder).glob("*.py") if p.name != HARNESS_FILE)


def logits_of(out: object) -> object:
    """The logits in what a model returns: `out.logits` (a ModelOutput), out[0] (a tuple or list), else out."""
    if isinstance(getattr(out, "logits", None), torch.Tensor):
        return out.logits
    return out[0] if isinstance(out, (tuple, list)) else out


def next_token_logits(out: object) -> torch.Tensor:
    """The (B, V) next-token logits from what an adapted model's prefill/decode returns.

    The logits are `out.logits` for a Hugging Face ModelOutput, out[0] when forward returns a tuple
    or list (logits plus extras), else out itself; they are (B, T, V) and the next token comes from
    the last position.
    """
    logits = logits_of(out)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise HarnessError(f"the adapted model must return logits of shape (B, T, V) "
                           f"(or a tuple starting with them); got {shape}")
    return logits[:, -1, :]


def require_entry_points(model: torch.nn.Module, hint: str) -> None:
    """HarnessError unless the model has the adapted contract's prefill/decode(tokens, input_pos)."""
    missing = [name for name in ("prefill", "decode") if not callable(getattr(model, name, None))]
    if missing:
        raise HarnessError(f"the adapted model ({type(model).__name__}) has no {' or '.join(missing)} method "
                           f"(prefill/decode(tokens, input_pos)); {hint}")
