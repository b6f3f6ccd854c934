"""The Ascend NPU backends (npugraph_ex, ge) on a host without an NPU.

Most tests need nothing but torch CPU. The `npu_api` tests check graphmode's NPU configuration
against torch_npu 2.13.0's own config classes: they download the wheel (never install it), unpack
only the Python sources they need into a temporary folder (tests/torch_npu_wheel.py), and import the real
classes in a subprocess with only that folder added to sys.path. torch_npu's C extension is never
loaded, and nothing that is validated is stubbed.
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import textwrap
import time
import types
import warnings
from pathlib import Path

import pytest
import torch

from graphmode.runners import backends
from graphmode.runners.backends import BACKEND_NAMES, BackendUnavailable, CompileCacheUnused, resolve
from graphmode.runners.backends._npu_config import (
    GE_FIELDS,
    NPUGRAPH_EX_OPTIONS,
    NpuConfigError,
    apply_config_fields,
    check_ge_fields,
    check_npugraph_ex_options,
    compile_cache_setting,
    ge_cache_compile_kwargs,
    ge_compiler_config_fields,
    npugraph_ex_options,
    task_queue_advice,
)
from torch_npu_wheel import torch_npu_tree

PROJECT_ROOT = Path(__file__).resolve().parents[1]

HAS_TORCH_NPU = __import__("importlib.util").util.find_spec("torch_npu") is not None
no_torch_npu = pytest.mark.skipif(HAS_TORCH_NPU, reason="torch_npu is installed on this host")


def _run_python(code: str, *, env_extra: dict[str, str] | None = None, timeout: int = 180) -> str:
    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


# --- import hygiene ---------------------------------------------------------------------------

def test_importing_graphmode_never_imports_torch_npu():
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0: on an Ascend host `import torch` itself loads torch_npu
    # through its [torch.backends] entry point; what is checked here is graphmode's own imports.
    out = _run_python(
        "import sys, graphmode.runners.backends, graphmode.agent.cli, graphmode.runners.workers.verify_worker, "
        "graphmode.runners.workers.probe_worker, graphmode.runners.verify.verify\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch_npu', 'torchair', 'npugraph_ex')))\n",
        env_extra={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.strip() == "[]"


# --- registry ---------------------------------------------------------------------------------

def test_registry_names_devices_and_knobs():
    assert BACKEND_NAMES == ("auto", "eager", "aot_eager", "inductor", "cudagraphs", "npugraph_ex", "ge",
                             "inductor_cuda")
    assert {name: backends.get(name).device for name in BACKEND_NAMES[1:]} == {
        "eager": "cpu", "aot_eager": "cpu", "inductor": "cpu", "cudagraphs": "cuda",
        "npugraph_ex": "npu", "ge": "npu", "inductor_cuda": "cuda"}
    assert set(backends.get("npugraph_ex").knobs) == {
        "frozen_parameter", "capture_limit", "static_kernel_compile", "force_eager",
        "seq_lengths_as_list", "options"}
    assert set(backends.get("ge").knobs) == {
        "frozen_parameter", "tiling_schedule_optimize", "topology_sorting_strategy", "fields"}
    assert backends.get("inductor").knobs == ()
    # Only the NPU backends have a compile cache of their own; every backend's compile() takes the argument.
    assert {b.name for b in map(backends.get, BACKEND_NAMES[1:]) if b.takes_compile_cache} == {"npugraph_ex", "ge"}


def test_each_backend_is_one_module_of_the_package_and_everything_else_reads_it_from_there():
    """Adding a backend is adding one file: the package imports every module in it, `--help` and `auto` list what
    registered, and the probe's triage asks the backend for its stages."""
    modules = [m.name for m in pkgutil.iter_modules(backends.__path__)
               if not m.name.startswith("_") and m.name != "base"]
    assert sorted(modules) == sorted(BACKEND_NAMES[1:])
    for name in modules:
        assert type(backends.get(name)).__module__ == f"{backends.__name__}.{name}"
    text = backends.help_text()
    assert all(f"{b.name} = {b.summary}" in text for b in map(backends.get, BACKEND_NAMES[1:]))
    assert backends.get("aot_eager").force_eager().compile is None  # no separate eager mode: stage 2 is skipped
    assert backends.get("cudagraphs").stage_label.startswith("cudagraphs (inductor")


def test_unknown_knob_is_a_type_error_naming_the_valid_ones():
    with pytest.raises(TypeError, match=r"'inductor' takes no knob 'capture_limit'.*none"):
        backends.get("inductor").compile_decode(lambda x: x, capture_limit=8)
    with pytest.raises(TypeError, match=r"'ge' takes no knob 'seq_lengths_as_list'.*frozen_parameter"):
        backends.get("ge").compile_decode(lambda x: x, seq_lengths_as_list=True)


def test_compile_decode_is_fullgraph_and_the_old_compile_still_works():
    torch._dynamo.reset()
    backend = backends.get("aot_eager")
    x = torch.randn(3, 5)
    torch.testing.assert_close(backend.compile(lambda t: t.sin() * 2, fullgraph=False)(x), x.sin() * 2)

    def breaks(t):
        torch._dynamo.graph_break()
        return t + 1

    with pytest.raises(torch._dynamo.exc.Unsupported):
        backend.compile_decode(breaks)(x)
    torch.testing.assert_close(backend.compile_decode(breaks, fullgraph=False)(x), x + 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA host: auto picks cudagraphs")
@no_torch_npu
def test_auto_on_this_host_is_inductor_and_says_why():
    backend, reason = resolve("auto")
    assert backend.name == ("inductor" if backends.get("inductor").available() is None else "aot_eager")
    assert f"auto chose {backend.name}" in reason and "Ascend NPU" in reason and "torch_npu" in reason
    assert "CUDA" in reason and "\n" not in reason


def test_auto_picks_npugraph_ex_when_an_ascend_npu_is_available(monkeypatch):
    monkeypatch.setattr(type(backends.get("npugraph_ex")), "available", lambda self: None)
    backend, reason = resolve("auto")
    assert backend.name == "npugraph_ex" and "Ascend NPU is available" in reason


# --- availability -----------------------------------------------------------------------------

@no_torch_npu
@pytest.mark.parametrize("name", ["npugraph_ex", "ge"])
def test_npu_backend_unavailable_without_torch_npu(name):
    reason = backends.get(name).available()
    assert reason.startswith(f"{name} needs torch_npu with CANN on an Ascend host: install graphmode[npu] there")
    assert "torch_npu is not installed here" in reason and "\n" not in reason
    with pytest.raises(BackendUnavailable) as info:
        resolve(name)
    assert reason in str(info.value) and all(valid in str(info.value) for valid in BACKEND_NAMES)


@pytest.fixture
def fake_torch_npu(tmp_path, monkeypatch):
    """A stand-in `torch_npu` on sys.path (this process only) whose import runs `body`."""
    def make(body: str) -> None:
        package = tmp_path / "torch_npu"
        package.mkdir()
        (package / "__init__.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    yield make
    sys.modules.pop("torch_npu", None)


@pytest.mark.parametrize("name", ["npugraph_ex", "ge"])
def test_npu_backend_unavailable_when_torch_npu_fails_to_import(name, fake_torch_npu):
    fake_torch_npu("raise OSError('libascendcl.so: cannot open shared object file')\n")
    reason = backends.get(name).available()
    assert "`import torch_npu` failed: OSError: libascendcl.so" in reason
    assert "CANN" in reason and "graphmode[npu]" in reason and "\n" not in reason


@pytest.mark.parametrize("name", ["npugraph_ex", "ge"])
def test_npu_backend_unavailable_without_a_visible_npu(name, fake_torch_npu, monkeypatch):
    fake_torch_npu("")
    monkeypatch.setattr(torch, "npu", type("npu", (), {"is_available": staticmethod(lambda: False)}),
                        raising=False)
    reason = backends.get(name).available()
    assert "torch.npu.is_available() is False" in reason and "graphmode[npu]" in reason


def test_npu_synchronize_is_a_no_op_without_torch_npu(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    backends.get("npugraph_ex").synchronize()
    backends.get("ge").synchronize()


def test_task_queue_advice_is_advice_only(monkeypatch):
    monkeypatch.delenv("TASK_QUEUE_ENABLE", raising=False)
    advice = backends.get("npugraph_ex").env_advice()
    assert "TASK_QUEUE_ENABLE=1" in advice and "unset" in advice and "does not change it" in advice
    assert "TASK_QUEUE_ENABLE" not in os.environ
    assert "'2'" in task_queue_advice({"TASK_QUEUE_ENABLE": "2"})
    assert "is set" in task_queue_advice({"TASK_QUEUE_ENABLE": "1"})
    assert backends.get("ge").env_advice() is None


# --- configuration, built and checked without torch_npu ----------------------------------------

def test_npugraph_ex_compile_kwargs():
    assert backends.npugraph_ex_compile_kwargs() == {
        "backend": "npugraph_ex", "dynamic": False, "options": {"frozen_parameter": True}}
    kwargs = backends.npugraph_ex_compile_kwargs(
        seq_lengths_as_list=True, capture_limit=16, static_kernel_compile=True, force_eager=True,
        frozen_parameter=False, options={"force_recapture": True, "capture_error_mode": "relaxed"})
    assert kwargs["dynamic"] is True
    assert kwargs["options"] == {"frozen_parameter": False, "capture_limit": 16, "static_kernel_compile": True,
                                 "force_eager": True, "force_recapture": True, "capture_error_mode": "relaxed"}


@pytest.mark.parametrize(("options", "message"), [
    ({"frozen_parameters": True},
     r"unknown npugraph_ex option 'frozen_parameters' \(did you mean 'frozen_parameter'\?\)"),
    ({"max_autotune": True},
     r"unknown npugraph_ex option 'max_autotune'; valid in torch_npu 2\.13\.0: .*capture_limit"),
    ({"capture_limit": 0}, r"npugraph_ex option 'capture_limit' must be in \[1, "),
    ({"capture_limit": "64"}, r"'capture_limit' must be an int, got '64' \(str\)"),
    ({"capture_limit": True}, r"'capture_limit' must be an int, got True \(bool\)"),
    ({"frozen_parameter": "1"}, r"'frozen_parameter' must be a bool, got '1' \(str\)"),
    ({"mode": "reduce-overhead"}, r"'mode' must be one of \['npugraph_ex'\]"),
    ({"capture_error_mode": "strict"}, r"'capture_error_mode' must be one of"),
    ({"data_dump_dir": "/no/such/dir"}, r"'data_dump_dir' must be an existing directory"),
    ({"super_kernel_optimize_options": "x"}, r"must be a dict or None"),
    ({"_vllm_aclnn_static_kernel_sym_range": [1.5]}, r"must be a list of ints or None"),
])
def test_npugraph_ex_precheck_rejects_with_a_clear_message(options, message):
    with pytest.raises(NpuConfigError, match=message) as info:
        check_npugraph_ex_options(options)
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)
    # The same check guards the compile call, before torch_npu is touched.
    with pytest.raises(NpuConfigError, match=message):
        backends.get("npugraph_ex").compile_decode(lambda x: x, options=options)


def test_knob_and_extra_option_conflict():
    with pytest.raises(NpuConfigError, match="'frozen_parameter' is given both"):
        npugraph_ex_options(frozen_parameter=True, extra={"frozen_parameter": False})
    assert npugraph_ex_options(extra={"frozen_parameter": True}) == {"frozen_parameter": True}


def test_ge_compiler_config_fields():
    assert ge_compiler_config_fields() == {"mode": "max-autotune", "experimental_config.frozen_parameter": True}
    assert ge_compiler_config_fields(tiling_schedule_optimize=True, topology_sorting_strategy="StableRDFS",
                                     extra={"debug.run_eagerly": True}) == {
        "mode": "max-autotune", "experimental_config.frozen_parameter": True,
        "experimental_config.tiling_schedule_optimize": True,
        "experimental_config.topology_sorting_strategy": "StableRDFS", "debug.run_eagerly": True}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"topology_sorting_strategy": "stable"}, r"'experimental_config.topology_sorting_strategy' must be one of"),
    ({"extra": {"experimental_config.frozen_parameters": True}},
     r"unknown torchair CompilerConfig field 'experimental_config.frozen_parameters' \(did you mean"),
    ({"extra": {"mode": "npugraph_ex"}}, r"compiles with torchair mode 'max-autotune'"),
    ({"frozen_parameter": 1}, r"'experimental_config.frozen_parameter' must be a bool"),
])
def test_ge_precheck_rejects_with_a_clear_message(kwargs, message):
    with pytest.raises(NpuConfigError, match=message):
        ge_compiler_config_fields(**kwargs)


def test_apply_config_fields_walks_dotted_paths():
    config = type("C", (), {})()
    config.experimental_config = type("E", (), {})()
    apply_config_fields(config, {"mode": "max-autotune", "experimental_config.frozen_parameter": True})
    assert config.mode == "max-autotune" and config.experimental_config.frozen_parameter is True


def test_tables_are_well_formed():
    for table, check in ((NPUGRAPH_EX_OPTIONS, check_npugraph_ex_options), (GE_FIELDS, check_ge_fields)):
        for key, spec in table.items():
            for value in spec.samples_ok:
                check({key: value})
            for value in spec.samples_bad:
                with pytest.raises(NpuConfigError):
                    check({key: value})


# --- compile caches (cache_compile), decided without torch_npu ---------------------------------

class _TinyDecoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def decode(self, t: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.proj(t), dim=-1)


def test_compile_cache_setting_follows_the_argument_alone(tmp_path, monkeypatch):
    assert compile_cache_setting() is None
    assert compile_cache_setting("off") is None and compile_cache_setting("") is None
    assert compile_cache_setting(tmp_path) == str(tmp_path)
    assert compile_cache_setting("rel") == os.path.abspath("rel")
    monkeypatch.setenv("GRAPHMODE_COMPILE_CACHE", str(tmp_path))  # the variable earlier versions read
    assert compile_cache_setting() is None


def test_cache_compile_applies_only_to_a_whole_graph_nn_module_method():
    model = _TinyDecoder()
    assert backends.cache_compile_problem(model.decode, fullgraph=True) is None
    assert "graph breaks" in backends.cache_compile_problem(model.decode, fullgraph=False)
    assert "bound method of a torch.nn.Module" in backends.cache_compile_problem(lambda t: t, fullgraph=True)
    assert "method of a torch.nn.Module, got a method of" in backends.cache_compile_problem(
        types.MethodType(lambda self, t: t, object()), fullgraph=True)


def test_model_cache_dir_is_keyed_on_the_model_code(tmp_path):
    model = _TinyDecoder()
    folder = backends.model_cache_dir(str(tmp_path), model.decode)
    assert Path(folder).parent == tmp_path / "cache_compile"
    assert backends.model_cache_dir(str(tmp_path), _TinyDecoder().decode) == folder  # same code, same folder
    other = types.ModuleType("graphmode_other_model")
    (tmp_path / "other.py").write_text("# another model\n")
    other.__file__ = str(tmp_path / "other.py")
    sys.modules[other.__name__] = other
    try:
        Other = type("Other", (_TinyDecoder,), {"__module__": other.__name__})
        assert backends.model_cache_dir(str(tmp_path), Other().decode) != folder
    finally:
        del sys.modules[other.__name__]


@no_torch_npu
@pytest.mark.parametrize("name", ["npugraph_ex", "ge"])
def test_a_cache_that_cannot_apply_is_announced_not_dropped(name, tmp_path):
    # The decision comes before torch_npu is imported, so it shows here; the compile then needs torch_npu.
    with pytest.warns(CompileCacheUnused, match=rf"{name}: the compile cache .* is not used .*graph breaks"):
        with pytest.raises(ModuleNotFoundError, match="torch_npu"):
            backends.get(name).compile(_TinyDecoder().decode, fullgraph=False, compile_cache=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a usable target and "off": nothing to announce
        for cache, decode in (("off", lambda t: t), (tmp_path, _TinyDecoder().decode)):
            with pytest.raises(ModuleNotFoundError, match="torch_npu"):
                backends.get(name).compile(decode, fullgraph=True, compile_cache=cache)


def test_compile_options_report_the_cache(tmp_path):
    ge, npx = backends.get("ge"), backends.get("npugraph_ex")
    assert ge.compile_options(True)["cache_compile"] is None
    assert npx.compile_options(True, "off")["cache_compile"] is None
    assert ge.compile_options(True, tmp_path)["cache_compile"] == {
        "api": "torchair.inference.cache_compile", "cache_dir": str(tmp_path / "cache_compile" / "<model key>"),
        "used": True, "config": "<compiler_config>", "dynamic": False, "ge_cache": True}
    assert npx.compile_options(True, tmp_path)["cache_compile"] == {
        "api": "torch.npu.npugraph_ex.inference.cache_compile",
        "cache_dir": str(tmp_path / "cache_compile" / "<model key>"),
        "used": True, "dynamic": False, "options": {"frozen_parameter": True}}
    unused = npx.compile_options(False, tmp_path)["cache_compile"]
    assert unused["used"] is False and "graph breaks" in unused["why"]
    assert "cache_compile" not in backends.get("inductor").compile_options(True, tmp_path)


# --- against the real torch_npu 2.13.0 classes (opt-in: pytest -m npu_api) ---------------------

@pytest.fixture(scope="module")
def torch_npu_sources(tmp_path_factory) -> Path:
    """torch_npu's dynamo/ folder (npugraph_ex and torchair .py files only), from the wheel (tests/torch_npu_wheel.py:
    downloaded once a test process, or GRAPHMODE_TORCH_NPU_SRC's already extracted tree)."""
    return torch_npu_tree(tmp_path_factory) / "torch_npu" / "dynamo"


# Runs in a fresh interpreter: argv[1] is torch_npu's extracted dynamo/ folder. Prints one JSON.
_REAL_API_CHECK = textwrap.dedent('''
    import atexit, importlib, json, sys, types, warnings
    dynamo = sys.argv[1]
    sys.path.insert(0, dynamo)  # the extracted sources only: torch_npu itself is not importable
    import torch
    from graphmode.runners import backends
    from graphmode.runners.backends import _npu_config as cfg

    # npugraph_ex imports standalone with torch CPU (torch_npu registers it as top-level "npugraph_ex").
    import npugraph_ex
    atexit.unregister(npugraph_ex._finalize)  # its exit hook imports torch_npu's C extension
    from npugraph_ex.configs.compiler_config import CompilerConfig as NpxConfig, _process_kwargs_options
    # torchair/__init__.py needs torchair's C extension and protobuf: import only its configs package.
    torchair = types.ModuleType("torchair")
    torchair.__path__ = [dynamo + "/torchair"]
    sys.modules["torchair"] = torchair
    from torchair.configs.compiler_config import CompilerConfig as GeConfig, _check_config_support
    REJECTED = (ValueError, TypeError, FileNotFoundError)
    out = {"loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("torch_npu", "torchair", "npugraph_ex")),
           "npugraph_ex_file": sys.modules["npugraph_ex.configs.compiler_config"].__file__,
           "torchair_file": sys.modules["torchair.configs.compiler_config"].__file__,
           "mismatches": []}
    miss = out["mismatches"].append

    def real_npx(options):
        config = NpxConfig()
        try:
            _process_kwargs_options(config, {"options": options})
        except REJECTED as error:
            return None, type(error).__name__
        return config, None

    def raw(option):  # what was stored: OptionValue.value stringifies ints (and torchair's, bools)
        return getattr(option, "_value", option)

    def ours(check, values):
        try:
            check(values)
            return None
        except cfg.NpuConfigError as error:
            return str(error)

    # 1. The keys: exactly the real CompilerConfig's settable attributes.
    out["npx_real_keys"] = sorted(set(NpxConfig()._fixed_attrs))  # it lists the custom passes twice
    out["npx_our_keys"] = sorted(cfg.NPUGRAPH_EX_OPTIONS)
    # 2. Every key's sample values: accepted by both, or rejected by both.
    for key, spec in cfg.NPUGRAPH_EX_OPTIONS.items():
        for value in spec.samples_ok:
            if real_npx({key: value})[1] or ours(cfg.check_npugraph_ex_options, {key: value}):
                miss(f"npugraph_ex {key}={value!r}: should be accepted by both")
        for value in spec.samples_bad:
            if not real_npx({key: value})[1] or not ours(cfg.check_npugraph_ex_options, {key: value}):
                miss(f"npugraph_ex {key}={value!r}: should be rejected by both")
    # 3. What graphmode generates, whole: accepted, and read back with our values.
    generated = [backends.npugraph_ex_compile_kwargs(**k)["options"] for k in (
        {}, {"frozen_parameter": False}, {"capture_limit": 8, "static_kernel_compile": True},
        {"force_eager": True, "seq_lengths_as_list": True},
        {"options": {"force_recapture": True, "capture_error_mode": "relaxed", "clone_output": True}})]
    for options in generated:
        config, error = real_npx(options)
        if error:
            miss(f"npugraph_ex rejected our options {options}: {error}")
            continue
        for key, value in options.items():
            if raw(getattr(config, key)) != value:
                miss(f"npugraph_ex {key}: set {value!r}, read back {raw(getattr(config, key))!r}")
        config.as_dict()
    out["npx_generated"] = generated
    out["npx_defaults"] = {k: getattr(NpxConfig(), k).value for k in ("capture_limit", "frozen_parameter", "mode",
                                                                     "force_eager", "static_kernel_compile")}
    # 4. Negative cases: the same verdict from the real class and from our pre-check.
    out["negative"] = {}
    for options in ({"frozen_parameters": True}, {"capture_limit": 0}, {"frozen_parameter": "1"},
                    {"mode": "max-autotune"}, {"as_dict": 1}, {"_fixed_attrs": []}):
        out["negative"][json.dumps(options)] = [real_npx(options)[1], ours(cfg.check_npugraph_ex_options, options)]

    # 5. GE: every field path exists on torchair.CompilerConfig() and takes our sample values.
    def real_ge(fields):
        config = GeConfig()
        try:
            cfg.apply_config_fields(config, fields)
        except REJECTED as error:
            return None, type(error).__name__
        return config, None

    def resolve(config, path):
        *parents, leaf = path.split(".")
        for part in parents:
            config = getattr(config, part)
        return config, leaf

    out["ge_paths"] = {}
    for path, spec in cfg.GE_FIELDS.items():
        try:
            parent, leaf = resolve(GeConfig(), path)
            exists = leaf in parent._fixed_attrs
        except AttributeError:
            exists = False
        out["ge_paths"][path] = exists
        for value in spec.samples_ok:
            if real_ge({path: value})[1] or ours(cfg.check_ge_fields, {path: value}):
                miss(f"ge {path}={value!r}: should be accepted by both")
        for value in spec.samples_bad:
            if not real_ge({path: value})[1] or not ours(cfg.check_ge_fields, {path: value}):
                miss(f"ge {path}={value!r}: should be rejected by both")
    out["ge_default_mode"] = GeConfig().mode.value
    out["ge_generated"] = []
    for kwargs in ({}, {"tiling_schedule_optimize": True, "topology_sorting_strategy": "StableRDFS"},
                   {"frozen_parameter": False, "extra": {"debug.run_eagerly": True}}):
        fields = cfg.ge_compiler_config_fields(**kwargs)
        config, error = real_ge(fields)
        if error:
            miss(f"ge rejected our fields {fields}: {error}")
            continue
        for path, value in fields.items():
            parent, leaf = resolve(config, path)
            if raw(getattr(parent, leaf)) != value:
                miss(f"ge {path}: set {value!r}, read back {raw(getattr(parent, leaf))!r}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _check_config_support(config)  # what torchair.get_npu_backend runs first (npu_fx_compiler.py L1053)
        local, global_ = config.as_dict()
        out["ge_generated"].append({"fields": fields, "warnings": [str(w.message) for w in caught],
                                    "ge_options": {k: v for k, v in local.items() if k.startswith("ge.") or
                                                   k in ("frozen_parameter", "mode", "run_eagerly")}})
    out["ge_negative"] = {}
    for fields in ({"experimental_config.topology_sorting_strategy": "stable"},
                   {"experimental_config.frozen_parameters": True}, {"mode": "eager"}):
        out["ge_negative"][json.dumps(fields)] = [real_ge(fields)[1], ours(cfg.check_ge_fields, fields)]

    # 6. The compile calls, end to end through torch 2.13's torch.compile. torch_npu would register
    # the "npugraph_ex" Dynamo backend; here a backend under that name runs what torch_npu's runs
    # first (npu_fx_compiler.py L881-883: a CompilerConfig, then _process_kwargs_options(config,
    # kwargs)) on the real classes, then returns the graph to run eagerly.
    sys.modules["torch_npu"] = types.ModuleType("torch_npu")  # only so `import torch_npu` succeeds
    seen = {}

    def npugraph_ex_stand_in(gm, example_inputs, **kwargs):
        config = NpxConfig()
        _process_kwargs_options(config, kwargs)
        seen["npugraph_ex"] = {"kwargs": sorted(kwargs), "options": kwargs.get("options"),
                               "capture_limit": config.capture_limit.value,
                               "frozen_parameter": config.frozen_parameter.value}
        return gm.forward

    torch._dynamo.register_backend(npugraph_ex_stand_in, name="npugraph_ex")
    x = torch.randn(4, 8)
    step = lambda t: torch.softmax(t * 2, dim=-1)
    y = backends.get("npugraph_ex").compile_decode(step, capture_limit=8, seq_lengths_as_list=True)(x)
    seen["npugraph_ex"]["matches_eager"] = bool(torch.allclose(y, step(x)))

    def get_npu_backend(*, compiler_config=None, custom_decompositions={}):
        _check_config_support(compiler_config)
        def backend(gm, example_inputs, **kwargs):
            seen["ge"] = {"type": type(compiler_config).__module__ + "." + type(compiler_config).__name__,
                          "local": compiler_config.as_dict()[0]}
            return gm.forward
        return backend

    torchair.CompilerConfig = GeConfig  # torchair/__init__.py exports the same class
    torchair.get_npu_backend = get_npu_backend
    torch._dynamo.reset()
    y = backends.get("ge").compile_decode(step, tiling_schedule_optimize=True,
                                          topology_sorting_strategy="StableRDFS")(x)
    seen["ge"]["matches_eager"] = bool(torch.allclose(y, step(x)))
    out["compile"] = seen

    # 7. Compile caches. npugraph_ex: our backend hands Decode to the real
    # torch.npu.npugraph_ex.inference.cache_compile (loaded from the wheel under its real name; it
    # imports only npugraph_ex), which returns the real LazyCompiledModel: nothing compiles until
    # the first call, which needs an NPU. GE: torchair.inference imports protobuf-generated GE IR
    # modules, so a recorder takes that call (running the real _check_config_support first, as the
    # real CacheBackend does, _cache_compiler.py L399-400); the test checks the keywords it got
    # against the real signatures, parsed from the sources with ast.
    import importlib.util, os, tempfile
    spec = importlib.util.spec_from_file_location(
        "torch_npu.npu.npugraph_ex.inference", dynamo + "/../npu/npugraph_ex/inference/__init__.py")
    public = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(public)
    sys.modules[spec.name] = public
    from npugraph_ex.inference._cache_compiler import CompiledModel

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def decode(self, t):
            return torch.softmax(self.proj(t), dim=-1)

    model, root = Tiny(), tempfile.mkdtemp()
    cache = out["cache"] = {}
    lazy = backends.get("npugraph_ex").compile(model.decode, fullgraph=True, compile_cache=root, capture_limit=8)
    placeholder = sys.modules.pop("torch_npu")  # get_cache_bin would ask a loaded torch_npu (L202-203)
    cache_bin = CompiledModel.get_cache_bin(lazy.func, config=lazy.config, dynamic=lazy.dynamic,
                                            cache_dir=lazy.cache_dir)
    sys.modules["torch_npu"] = placeholder
    cache["npugraph_ex"] = {
        "type": type(lazy).__module__ + "." + type(lazy).__name__, "func_is_decode": lazy.func == model.decode,
        "dynamic": lazy.dynamic, "cache_bin": os.path.relpath(cache_bin, root),
        "mode": lazy.config.mode.value, "capture_limit": lazy.config.capture_limit.value,
        "frozen_parameter": lazy.config.frozen_parameter.value, "nothing_written": os.listdir(root) == []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = backends.get("npugraph_ex").compile(step, fullgraph=True, compile_cache=root)
    cache["npugraph_ex_fallback"] = {"warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                                     "torch_compile": getattr(plain, "_torchdynamo_orig_callable", None) is step}

    def cache_compile(func, **kwargs):
        _check_config_support(kwargs["config"])
        cache["ge"] = {"func_is_decode": func == model.decode, "kwargs": sorted(kwargs),
                       "dynamic": kwargs["dynamic"], "ge_cache": kwargs.get("ge_cache"),
                       "cache_dir": os.path.relpath(kwargs["cache_dir"], root),
                       "config": type(kwargs["config"]).__module__ + "." + type(kwargs["config"]).__name__,
                       "local": kwargs["config"].as_dict()[0]}
        return func

    sys.modules["torchair.inference"] = types.ModuleType("torchair.inference")
    sys.modules["torchair.inference"].cache_compile = cache_compile
    backends.get("ge").compile(model.decode, fullgraph=True, compile_cache=root, tiling_schedule_optimize=True)
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def real_api(torch_npu_sources) -> dict:
    started = time.perf_counter()
    out = _run_python(_REAL_API_CHECK.replace("sys.argv[1]", repr(str(torch_npu_sources))), timeout=300)
    result = json.loads(out.strip().splitlines()[-1])
    result["seconds"] = time.perf_counter() - started
    return result


@pytest.mark.npu_api
def test_real_classes_load_without_torch_npu(real_api, torch_npu_sources):
    assert not [m for m in real_api["loaded"] if m.split(".")[0] == "torch_npu"]
    assert real_api["npugraph_ex_file"].startswith(str(torch_npu_sources))
    assert real_api["torchair_file"].startswith(str(torch_npu_sources))


@pytest.mark.npu_api
def test_npugraph_ex_options_match_the_real_compiler_config(real_api):
    assert real_api["npx_our_keys"] == real_api["npx_real_keys"]
    assert real_api["mismatches"] == []
    assert real_api["npx_defaults"] == {"capture_limit": "64", "frozen_parameter": False, "mode": "npugraph_ex",
                                        "force_eager": False, "static_kernel_compile": False}


@pytest.mark.npu_api
def test_wrong_options_get_the_same_verdict_from_the_real_class_and_our_precheck(real_api):
    for options, (real_error, our_error) in real_api["negative"].items():
        assert real_error is not None and our_error is not None, options
    assert real_api["negative"]['{"frozen_parameters": true}'][0] == "ValueError"
    for fields, (real_error, our_error) in real_api["ge_negative"].items():
        assert real_error is not None and our_error is not None, fields


@pytest.mark.npu_api
def test_ge_fields_exist_on_the_real_torchair_compiler_config(real_api):
    assert all(real_api["ge_paths"].values()), real_api["ge_paths"]
    assert real_api["ge_default_mode"] == "max-autotune"
    default, tuned, eager = real_api["ge_generated"]
    assert all(case["warnings"] == [] for case in real_api["ge_generated"])
    assert default["ge_options"]["frozen_parameter"] == "1" and default["ge_options"]["ge.topoSortingMode"] == "1"
    assert tuned["ge_options"]["ge.tiling_schedule_optimize"] == "1"
    assert tuned["ge_options"]["ge.topoSortingMode"] == "3"  # StableRDFS
    assert eager["ge_options"]["frozen_parameter"] == "0" and eager["ge_options"]["run_eagerly"] == "1"


@pytest.mark.npu_api
def test_compile_calls_reach_the_real_option_processing(real_api):
    npx, ge = real_api["compile"]["npugraph_ex"], real_api["compile"]["ge"]
    assert npx["kwargs"] == ["options"]
    assert npx["options"] == {"frozen_parameter": True, "capture_limit": 8}
    assert npx["capture_limit"] == "8" and npx["frozen_parameter"] is True and npx["matches_eager"]
    assert ge["type"] == "torchair.configs.compiler_config.CompilerConfig" and ge["matches_eager"]
    assert ge["local"]["mode"] == "max-autotune" and ge["local"]["ge.tiling_schedule_optimize"] == "1"
    assert ge["local"]["frozen_parameter"] == "1" and ge["local"]["ge.topoSortingMode"] == "3"
    print(f"npu_api subprocess: {real_api['seconds']:.1f} s")


# --- compile caches against the real sources ----------------------------------------------------

def _real_function(path: Path, name: str) -> tuple[inspect.Signature, ast.FunctionDef]:
    """The signature of top-level function `name` in `path`, parsed (not imported: torchair's
    inference package needs protobuf and torchair's C extension). Defaults are their source text."""
    tree = ast.parse(path.read_text(), str(path))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    args, kind = node.args, inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    defaults = [kind.empty] * (len(positional) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
    params = [kind(a.arg, kind.POSITIONAL_ONLY if a in args.posonlyargs else kind.POSITIONAL_OR_KEYWORD, default=d)
              for a, d in zip(positional, defaults)]
    if args.vararg:
        params.append(kind(args.vararg.arg, kind.VAR_POSITIONAL))
    params += [kind(a.arg, kind.KEYWORD_ONLY, default=kind.empty if d is None else ast.unparse(d))
               for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        params.append(kind(args.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(params), node


def _named(signature: inspect.Signature) -> set[str]:
    """Keywords a function names (a keyword only its **kwargs takes is swallowed unread)."""
    return {p.name for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _forwards_kwargs(node: ast.FunctionDef, callee: str) -> bool:
    return any(isinstance(c, ast.Call) and ast.unparse(c.func) == callee
               and any(k.arg is None and ast.unparse(k.value) == "kwargs" for k in c.keywords)
               for c in ast.walk(node))


@pytest.mark.npu_api
def test_ge_cache_compile_call_matches_the_real_signature(real_api, torch_npu_sources):
    call = real_api["cache"]["ge"]
    assert call["kwargs"] == sorted({"config", *ge_cache_compile_kwargs("/c")}) == [
        "cache_dir", "config", "dynamic", "ge_cache"]
    # torchair.inference.cache_compile (inference/__init__.py L12-32) names config/dynamic/cache_dir
    # and passes the rest on in **kwargs to _cache_compiler.cache_compile (L679-726), which must
    # name every keyword we pass: there an unknown one would be swallowed silently.
    public, public_node = _real_function(torch_npu_sources / "torchair/inference/__init__.py", "cache_compile")
    inner, _ = _real_function(torch_npu_sources / "torchair/inference/_cache_compiler.py", "cache_compile")
    public.bind(object(), **dict.fromkeys(call["kwargs"]))
    inner.bind(object(), **dict.fromkeys(call["kwargs"]))
    assert set(call["kwargs"]) - _named(public) <= {"ge_cache"} and _forwards_kwargs(public_node, "_cache_compile")
    assert set(call["kwargs"]) <= _named(inner)
    assert public.parameters["dynamic"].default == "True"  # why dynamic=False is always passed
    # What we hand it: Decode itself, a static graph, GE's own graph cache on, our real CompilerConfig.
    assert call["func_is_decode"] and call["dynamic"] is False and call["ge_cache"] is True
    assert call["config"] == "torchair.configs.compiler_config.CompilerConfig"
    assert call["local"]["ge.tiling_schedule_optimize"] == "1" and call["local"]["frozen_parameter"] == "1"
    assert Path(call["cache_dir"]).parent == Path("cache_compile")


@pytest.mark.npu_api
def test_npugraph_ex_cache_compile_runs_the_real_function(real_api, torch_npu_sources):
    lazy = real_api["cache"]["npugraph_ex"]
    assert lazy["type"] == "npugraph_ex.inference._cache_compiler.LazyCompiledModel" and lazy["func_is_decode"]
    assert lazy["mode"] == "npugraph_ex" and lazy["capture_limit"] == "8" and lazy["frozen_parameter"] is True
    assert lazy["dynamic"] is False and lazy["nothing_written"]  # lazy: compiles and writes on the first call
    # <--compile-cache>/cache_compile/<model key>/<Class>_<static|dynamic>_aclgraphcache_<md5>/<method>/compiled_module
    # (npugraph_ex/inference/_cache_compiler.py L216-220)
    parts = Path(lazy["cache_bin"]).parts
    assert parts[0] == "cache_compile" and parts[3:] == ("decode", "compiled_module"), parts
    assert parts[2].startswith("Tiny_static_aclgraphcache_")
    # The public function: options= goes through the strict _process_kwargs_options (L10), not **kwargs alone.
    public, node = _real_function(torch_npu_sources.parent / "npu/npugraph_ex/inference/__init__.py", "cache_compile")
    assert {"dynamic", "cache_dir"} <= _named(public) and public.parameters["dynamic"].default == "True"
    assert any(isinstance(c, ast.Call)
               and ast.unparse(c) == "compiler_config._process_kwargs_options(compile_config, kwargs)"
               for c in ast.walk(node))
    fallback = real_api["cache"]["npugraph_ex_fallback"]
    assert fallback["torch_compile"] and len(fallback["warnings"]) == 1  # plain torch.compile, announced
    assert fallback["warnings"][0].startswith("CompileCacheUnused: npugraph_ex: the compile cache")


@pytest.mark.npu_api
def test_cache_compile_constraints_we_check_are_the_real_ones(torch_npu_sources):
    for path in ("torchair/inference/_cache_compiler.py", "npugraph_ex/inference/_cache_compiler.py"):
        source = (torch_npu_sources / path).read_text()
        assert 'raise ValueError(f"Only method can be cached now, got {func}")' in source, path
        assert 'raise ValueError(f"Only torch.nn.Module method can be cached now, got {func}")' in source, path
        assert "torch.compile(func, backend=cache_backend, fullgraph=True, dynamic=dynamic)" in source, path
        assert "os.getenv('TORCHAIR_CACHE_HOME', os.path.join(os.getcwd(), \".torchair_cache\"))" in source, path
