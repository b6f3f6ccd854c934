"""What graphmode passes to the Ascend backends, built and checked without torch_npu.

Pure functions: nothing here imports torch, torch_npu or torchair, so the configuration can be
built, checked and tested on any host.

- npugraph_ex: `torch.compile(fn, backend="npugraph_ex", options=...)` hands `options` to
  `_process_kwargs_options` (torch_npu 2.13.0 `dynamo/npugraph_ex/configs/compiler_config.py`
  L179-211, called from `npu_fx_compiler.py` L883), which sets each key on a fresh
  `CompilerConfig` (same file, L31-61): an unknown key or a value of the wrong type raises
  ValueError/TypeError there, at the first compile, deep inside Dynamo. `check_npugraph_ex_options`
  gives the same verdict before `torch.compile` is called, with a message naming the key.
- ge: `torchair.CompilerConfig()` fields, as dotted paths (`experimental_config.frozen_parameter`)
  mapped to values; `apply_config_fields` sets them on the real object.

NPUGRAPH_EX_OPTIONS and GE_FIELDS mirror the real classes; tests/test_npu_backends.py (marker
`npu_api`) checks them against torch_npu 2.13.0's own classes, key by key.

- compile caches: `ge_cache_compile_kwargs` / `npugraph_ex_cache_compile_kwargs` are the keyword
  arguments of the real `cache_compile` functions (see the notes above them), and
  `compile_cache_setting` reads the `--compile-cache` folder the verifier hands the worker.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

TORCH_NPU_VERSION = "2.13.0"  # the torch_npu release the option tables below mirror
INT64_MAX = 2**63 - 1


class NpuConfigError(ValueError):
    """An option or field the real torch_npu classes would reject; the message is one line."""


@dataclass(frozen=True)
class Spec:
    """The values one option accepts: `problem(value)` is None when accepted, else why not."""
    describe: str
    problem: Callable[[Any], str | None]
    samples_ok: tuple[Any, ...]   # accepted by the real class too (checked by the npu_api test)
    samples_bad: tuple[Any, ...]  # rejected by the real class too (checked by the npu_api test)


def _got(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _bool() -> Spec:
    # Real OptionValue(default, [True, False]) tests `v in [True, False]`, which also lets 0 and 1
    # through (1 == True); we ask for a real bool, so we are stricter there, never looser.
    return Spec("a bool", lambda v: None if isinstance(v, bool) else f"must be a bool, got {_got(v)}",
                (True, False), ("1", "true", 2, None))


def _int_range(low: int, high: int) -> Spec:
    def problem(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be an int, got {_got(v)}"
        if not low <= v <= high:
            return f"must be in [{low}, {high}], got {v}"
        return None
    return Spec(f"an int in [{low}, {high}]", problem, (low, low + 1), (low - 1, "8", 1.5))


def _one_of(*choices: Any) -> Spec:
    def problem(v: Any) -> str | None:
        ok = any(type(v) is type(c) and v == c for c in choices)
        return None if ok else f"must be one of {list(choices)!r}, got {_got(v)}"
    return Spec(f"one of {list(choices)!r}", problem, choices, ("no-such-value",))


def _optional(kind: type | tuple[type, ...], name: str, ok: Any, bad: Any) -> Spec:
    def problem(v: Any) -> str | None:
        return None if v is None or isinstance(v, kind) else f"must be {name} or None, got {_got(v)}"
    return Spec(f"{name} or None", problem, (None, ok), (bad,))


def _int_list() -> Spec:
    def problem(v: Any) -> str | None:
        if v is None:
            return None
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) for x in v):
            return f"must be a list of ints or None, got {_got(v)}"
        return None
    return Spec("a list of ints or None", problem, (None, [1, 8]), ("1,8", [1.5]))


def _callable() -> Spec:
    def problem(v: Any) -> str | None:
        return None if v is None or callable(v) else f"must be callable or None, got {_got(v)}"
    return Spec("a callable or None", problem, (None, print), ("print",))


def _existing_dir() -> Spec:
    def problem(v: Any) -> str | None:
        if isinstance(v, (str, os.PathLike)) and os.path.isdir(v):
            return None
        return f"must be an existing directory, got {_got(v)}"
    return Spec("an existing directory", problem, ("./",), ("/no/such/dir/graphmode",))


def _anything() -> Spec:
    return Spec("any value (passed through)", lambda v: None, (None,), ())


# torch_npu 2.13.0 dynamo/npugraph_ex/configs/compiler_config.py L31-61: every attribute of
# CompilerConfig() that `_process_kwargs_options` can set (its `_fixed_attrs`).
NPUGRAPH_EX_OPTIONS: dict[str, Spec] = {
    "force_eager": _bool(),
    "use_graph_pool": _anything(),  # a plain attribute, not an OptionValue: the real class checks nothing
    "reuse_graph_pool_in_same_fx": _bool(),
    "capture_limit": _int_range(1, INT64_MAX),
    "clone_input": _bool(),
    "clone_output": _bool(),
    "disable_static_kernel_compile_cache": _bool(),
    "static_kernel_compile": _bool(),
    "frozen_parameter": _bool(),
    "remove_noop_ops": _bool(),
    "remove_cat_ops": _bool(),
    "inplace_pass": _bool(),
    "input_inplace_pass": _bool(),
    "pattern_fusion_pass": _bool(),
    "post_grad_custom_pre_pass": _callable(),
    "post_grad_custom_post_pass": _callable(),
    "dump_tensor_data": _bool(),
    "data_dump_stage": _one_of("original", "optimized"),
    "data_dump_dir": _existing_dir(),
    "_vllm_aclnn_static_kernel_sym_index": _int_range(0, INT64_MAX),
    "_vllm_aclnn_static_kernel_sym_range": _int_list(),
    "super_kernel_optimize": _bool(),
    "super_kernel_optimize_options": _optional(dict, "a dict", {}, "a=1"),
    "super_kernel_debug_options": _optional(dict, "a dict", {}, "a=1"),
    "deadlock_check": _bool(),
    "capture_error_mode": _one_of("global", "thread_local", "relaxed"),
    "mode": _one_of("npugraph_ex"),
    "force_recapture": _bool(),
    "unsafe_skip_npugraph_capture_validation": _bool(),
    "record_statistics_debug_info": _bool(),
}

# torch_npu 2.13.0 dynamo/torchair/configs/: the torchair.CompilerConfig fields graphmode sets or
# lets a user set for the GE backend (a subset; each one is checked against the real class).
GE_FIELDS: dict[str, Spec] = {
    "mode": _one_of("max-autotune", "reduce-overhead", "npugraph_ex"),      # compiler_config.py L39
    "experimental_config.frozen_parameter": _bool(),                         # experimental_config.py L18
    "experimental_config.tiling_schedule_optimize": _bool(),                 # L28
    "experimental_config.topology_sorting_strategy": _one_of("BFS", "DFS", "RDFS", "StableRDFS"),  # L24
    "experimental_config.keep_inference_input_mutations": _bool(),           # L16
    "experimental_config.memory_efficiency": _bool(),                        # L17
    "experimental_config.cc_parallel_enable": _bool(),                       # L15
    "experimental_config.enable_view_optimize": _bool(),                     # L26
    "experimental_config.remove_noop_ops": _bool(),                          # L27
    "experimental_config.pattern_fusion_pass": _bool(),                      # L29
    "debug.run_eagerly": _bool(),                                            # debug_config.py L110
    "ge_config.oo_level": _one_of("O1", "O3"),                               # ge_config.py L14
}

GE_MODE = "max-autotune"  # torchair's name for the GE graph engine (its default mode)


def _check(table: Mapping[str, Spec], what: str, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        spec = table.get(key)
        if spec is None:
            close = difflib.get_close_matches(str(key), table, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise NpuConfigError(f"unknown {what} {key!r}{hint}; valid in torch_npu {TORCH_NPU_VERSION}: "
                                 f"{', '.join(sorted(table))}")
        problem = spec.problem(value)
        if problem is not None:
            raise NpuConfigError(f"{what} {key!r} {problem}")


def check_npugraph_ex_options(options: Mapping[str, Any]) -> None:
    """Raises NpuConfigError naming the first key the real npugraph_ex CompilerConfig would reject."""
    _check(NPUGRAPH_EX_OPTIONS, "npugraph_ex option", options)


def check_ge_fields(fields: Mapping[str, Any]) -> None:
    """Raises NpuConfigError naming the first torchair.CompilerConfig field path we do not know or
    whose value the real field would reject."""
    _check(GE_FIELDS, "torchair CompilerConfig field", fields)


def _merge(what: str, check: Callable[[Mapping[str, Any]], None], knobs: Mapping[str, Any],
           extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Our knobs (None: not given) plus `extra`; a key given both ways with different values is an error."""
    extra = dict(extra or {})
    check(extra)  # bad keys/values in extra get the type message, not a conflict message
    merged = {key: value for key, value in knobs.items() if value is not None}
    for key, value in extra.items():
        if key in merged and merged[key] != value:
            raise NpuConfigError(f"{what} {key!r} is given both as a keyword ({merged[key]!r}) "
                                 f"and in extra ({value!r})")
        merged[key] = value
    check(merged)
    return merged


def npugraph_ex_options(*, frozen_parameter: bool | None = None, capture_limit: int | None = None,
                        static_kernel_compile: bool | None = None, force_eager: bool | None = None,
                        extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `options=` dict for `torch.compile(..., backend="npugraph_ex")`, checked.

    None means "not given": the option is left out and the real default applies, except
    frozen_parameter, which graphmode turns on for Decode (as cann-recipes-infer does): parameter
    addresses are fixed, so they are neither copied into capture buffers nor hashed into the
    capture key. capture_limit defaults to 64 in torch_npu. `extra` adds any other real option
    (e.g. {"force_recapture": True}); it may repeat a knob only with the same value.
    """
    options = _merge("npugraph_ex option", check_npugraph_ex_options,
                     {"capture_limit": capture_limit, "static_kernel_compile": static_kernel_compile,
                      "force_eager": force_eager, "frozen_parameter": frozen_parameter}, extra)
    options.setdefault("frozen_parameter", True)
    return options


def npugraph_ex_dynamic(seq_lengths_as_list: bool) -> bool:
    """`dynamic=` for npugraph_ex. With fused-attention `actual_seq_lengths` passed as list[int],
    dynamic=True makes them SymInts that npugraph_ex patches at replay; dynamic=False would
    specialise every new length and recompile (cann-recipes-infer npu_graph_optimization.md
    L154, L237). Without such lists, dynamic=False: one static shape per capture."""
    return bool(seq_lengths_as_list)


def ge_compiler_config_fields(*, frozen_parameter: bool | None = None, tiling_schedule_optimize: bool | None = None,
                              topology_sorting_strategy: str | None = None,
                              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Dotted torchair.CompilerConfig field paths -> values for the GE backend, checked.

    mode is always GE ("max-autotune"); frozen_parameter is on unless turned off. None means "not
    given" (the real default applies: tiling_schedule_optimize False, topology "DFS").
    tiling_schedule_optimize needs static shapes (GE is compiled with dynamic=False);
    cann-recipes-infer uses it with topology "StableRDFS". `extra` adds other known fields.
    """
    fields = _merge("torchair CompilerConfig field", check_ge_fields,
                    {"experimental_config.frozen_parameter": frozen_parameter,
                     "experimental_config.tiling_schedule_optimize": tiling_schedule_optimize,
                     "experimental_config.topology_sorting_strategy": topology_sorting_strategy}, extra)
    if fields.setdefault("mode", GE_MODE) != GE_MODE:
        raise NpuConfigError(f"the ge backend compiles with torchair mode {GE_MODE!r}; got mode "
                             f"{fields['mode']!r} (use --backend npugraph_ex for capture/replay)")
    fields.setdefault("experimental_config.frozen_parameter", True)
    return {"mode": fields.pop("mode"), **fields}


def apply_config_fields(config: Any, fields: Mapping[str, Any]) -> Any:
    """Sets each dotted field on `config` (a torchair.CompilerConfig) and returns it."""
    for path, value in fields.items():
        *parents, leaf = path.split(".")
        target = config
        for part in parents:
            target = getattr(target, part)
        setattr(target, leaf, value)
    return config


TASK_QUEUE_VAR = "TASK_QUEUE_ENABLE"
NPUGRAPH_EX_TASK_QUEUE = "1"


def task_queue_advice(environ: Mapping[str, str] | None = None) -> str:
    """One sentence about TASK_QUEUE_ENABLE for npugraph_ex (advice only; graphmode never sets it
    unless asked). npugraph_ex supports task-queue levels 0 and 1 only; cann-recipes-infer sets 1
    for npugraph_ex and 2 for the other modes (executor/utils/graph_utils.py)."""
    current = (os.environ if environ is None else environ).get(TASK_QUEUE_VAR)
    if current == NPUGRAPH_EX_TASK_QUEUE:
        return f"{TASK_QUEUE_VAR}=1 is set, as npugraph_ex wants (it supports only 0 or 1)."
    now = "unset" if current is None else f"{current!r}"
    return (f"npugraph_ex supports only {TASK_QUEUE_VAR}=0 or 1 and cann-recipes-infer runs it with "
            f"{TASK_QUEUE_VAR}=1; here it is {now}: export {TASK_QUEUE_VAR}=1 before starting the process "
            "(graphmode does not change it for you).")



# --- compile caches (`--compile-cache DIR|off`) -------------------------------------------------
# The verifier gives the graph runs one shared folder: inductor reads it as TORCHINDUCTOR_CACHE_DIR,
# which is set for every graph run (an empty per-run folder under "off", so inductor is always
# cold). The NPU backends need to tell "off" apart, since under "off" they must not go through
# cache_compile at all (it forces fullgraph and skips guards once loaded), so the folder reaches
# them as an argument of its own (the worker's --npu-compile-cache, then `compile(..., compile_cache=)`),
# "off" unless a cache is asked for (runners/verify/verify.py).
CACHE_COMPILE_SUBDIR = "cache_compile"  # the NPU caches' part of the shared folder (beside inductor's)
COMPILE_CACHE_OFF = "off"

# The real entry points (torch_npu 2.13.0; paths inside the wheel):
# - GE: torch_npu/dynamo/torchair/inference/__init__.py L12-32 `cache_compile(func, *, config=None,
#   dynamic=True, cache_dir=None, global_rank=None, tp_rank=None, pp_rank=None, **kwargs)`, which
#   forwards to inference/_cache_compiler.py L679-726 (adds `backend`, `custom_decompositions`,
#   `ge_cache=False`; any other keyword is swallowed by its **kwargs and ignored).
# - npugraph_ex: torch_npu/npu/npugraph_ex/inference/__init__.py L4-12 (`torch.npu.npugraph_ex.
#   inference.cache_compile(func, *, dynamic=True, cache_dir=None, global_rank=None, tp_rank=None,
#   pp_rank=None, **kwargs)`): `options=` goes through the same `_process_kwargs_options` as
#   torch.compile's, onto a fresh npugraph_ex CompilerConfig with mode "npugraph_ex", then to
#   dynamo/npugraph_ex/inference/_cache_compiler.py L644-685.
GE_CACHE_COMPILE = "torchair.inference.cache_compile"
NPUGRAPH_EX_CACHE_COMPILE = "torch.npu.npugraph_ex.inference.cache_compile"


def compile_cache_setting(value: str | os.PathLike[str] | None = None) -> str | None:
    """The compile-cache folder to use, or None for none (None, "off" or ""). The folder is made absolute because
    cache_compile keys nothing on the working directory."""
    if value is None:
        return None
    value = os.fspath(value)
    if value in ("", COMPILE_CACHE_OFF):
        return None
    return os.path.abspath(os.path.expanduser(value))


def ge_cache_compile_kwargs(cache_dir: str) -> dict[str, Any]:
    """Keyword arguments (besides func and config) for torchair.inference.cache_compile.

    dynamic=False: its default is True (inference/__init__.py L16), and GE is static-only here.
    ge_cache=True: also hands GE's own compiled-graph cache the same folder
    ("ge.graph_compiler_cache_dir", _cache_compiler.py L482, used by the generated code in
    _ge_concrete_graph/fx2ge_converter.py L1383-1388), so a warm run skips the GE graph build and
    not only Dynamo's trace (cann-recipes-infer passes the same). No `fullgraph`: cache_compile
    always compiles with fullgraph=True (_cache_compiler.py L498) and would swallow it unread.
    """
    return {"dynamic": False, "cache_dir": cache_dir, "ge_cache": True}


def npugraph_ex_cache_compile_kwargs(cache_dir: str, compile_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments (besides func) for torch.npu.npugraph_ex.inference.cache_compile, from
    the checked `npugraph_ex_compile_kwargs(...)`: the same dynamic and options as torch.compile.
    Its dynamic also defaults to True (torch_npu/npu/npugraph_ex/inference/__init__.py L4), so it
    is always passed."""
    return {"dynamic": compile_kwargs["dynamic"], "cache_dir": cache_dir,
            "options": dict(compile_kwargs["options"])}
