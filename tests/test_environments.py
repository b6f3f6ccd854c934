"""A target's own interpreter (graphmode.toml's python, a manifest's, --python), and what a release lacks.

The second interpreter is a real venv made in a temporary folder with no pip and no system site packages: a `.pth`
file gives it this interpreter's site-packages folder (torch and transformers, shared, nothing installed), while
graphmode's own editable-install hook there is not run (a `.pth` file is read only in a site folder), so graphmode is
importable in it only through the folder graphmode puts on its workers' PYTHONPATH.
"""
from __future__ import annotations

import json
import os
import platform
import runpy
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

import pytest

from graphmode.agent.cli.consoles import EXIT_STOPPED
from graphmode.runners.interpreter import release
from graphmode.runners.probe.crash import exception_chain
from graphmode.runners.releases import (RELEASE_FACTS, ROPE_SCALING_DICT_FROM, SUPPORTED_FROM, common_releases,
                                       diagnose, hf_release_problem, names_used, release_need)

ROOT = Path(__file__).parents[1]
LEGACY = ROOT / "examples" / "legacy_llm"
HUB = Path(__file__).parent / "fixtures" / "hub_remote_code"
INSTALLED = version("transformers")


def graphmode(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=900)


def make_venv(folder: Path, *, share_packages: bool) -> Path:
    """A venv without pip; with share_packages, this interpreter's site-packages through a .pth file: every one on
    its path, so that a suite run in a venv with the system site-packages shares both (the .pth lines only add
    folders: their own .pth files, graphmode's editable install among them, are not read)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    if share_packages:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        shared = dict.fromkeys([sysconfig.get_paths()["purelib"], *(p for p in sys.path if p.endswith("-packages"))])
        Path(site, "shared-packages.pth").write_text("".join(f"{folder}\n" for folder in shared))
    return python


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    python = make_venv(tmp_path_factory.mktemp("venv") / "shared", share_packages=True)
    seen = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('graphmode') is None)"],
                          capture_output=True, text=True, check=True)
    assert seen.stdout.strip() == "True", "the venv must not see graphmode's own installation"
    return python


# -- refused before anything runs ---------------------------------------------------------------------------------

def test_an_interpreter_that_does_not_exist_is_bad_input_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "bin" / "python"
    done = graphmode("adapt", str(LEGACY), "--python", str(missing), "--out", str(tmp_path / "out"),
                     home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--python {missing}: no such file" in done.stderr and "python -m venv DIR" in done.stderr
    assert not (tmp_path / "out" / "legacy_llm" / "logs").exists()  # no worker started


def test_an_interpreter_without_torch_is_refused_with_the_install_command(tmp_path):
    bare = make_venv(tmp_path / "bare", share_packages=False)
    folder = tmp_path / "model"
    shutil.copytree(LEGACY, folder)
    (folder / "graphmode.toml").write_text("[target]\npython = '../bare/bin/python'\n")
    done = graphmode("adapt", str(folder), "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    torch_release = ".".join(map(str, release(version("torch"))))
    assert f"[target] python {bare}: {bare} has no torch" in said, said
    assert f"`{bare} -m pip install torch=={torch_release}`" in said, said


def test_a_manifest_names_a_python_per_target_and_checks_each_before_anything_runs(tmp_path, venv_python):
    from graphmode.agent.batch.manifest import load_manifest
    from graphmode.agent.errors import UserError

    manifest = tmp_path / "manifest.toml"
    manifest.write_text(f"[[target]]\npath = '{LEGACY}'\npython = '{venv_python}'\n\n"
                        f"[[target]]\nname = 'system'\npath = '{LEGACY}'\n")
    own, system = load_manifest(manifest, out=tmp_path / "out").targets
    assert own.target["python"] == str(venv_python) and "python" not in system.target
    assert f'python = "{venv_python}"' in own.target_file_text()  # what the target's adapt reads
    manifest.write_text(f"[[target]]\npath = '{LEGACY}'\npython = 'venvs/missing/bin/python'\n")
    with pytest.raises(UserError, match=r"\[\[target\]\] legacy_llm python .*venvs/missing/bin/python: no such file"):
        load_manifest(manifest, out=tmp_path / "out")


def test_hf_needs_a_release_of_its_path_in_the_targets_interpreter(tmp_path):
    python = "/venvs/old/bin/python"
    assert "has no transformers: `/venvs/old/bin/python -m pip install 'transformers>=4.36,<6'`" in \
        hf_release_problem("llama", python, None)
    assert "graphmode supports 4.36 onward" in hf_release_problem("llama", python, "4.35.2")
    # transformers' own models are driven on StaticCache (4.38); remote code brings its own cache.
    assert "StaticCache path, which arrived in 4.38" in hf_release_problem("llama", python, "4.37.2")
    remote = tmp_path / "remote"
    shutil.copytree(HUB, remote)
    assert hf_release_problem(str(remote), python, "4.37.2") is None
    assert hf_release_problem("llama", python, INSTALLED) is None


# -- what a release lacks --------------------------------------------------------------------------------------------

def _failure(code: str, folder: Path) -> list[BaseException]:
    """The exceptions of running `code` as a model file of `folder` (a real file: the diagnosis reads its lines)."""
    path = folder / "modeling_release.py"
    path.write_text(code + "\n")
    try:
        runpy.run_path(str(path))
    except Exception as error:  # noqa: BLE001 - the failure is what is examined
        return exception_chain(error)
    return []


@pytest.mark.parametrize("symbol, code", [
    ("Cache.get_usable_length", "from transformers import DynamicCache\nDynamicCache().get_usable_length(1)"),
    ("DynamicCache.from_legacy_cache", "from transformers import DynamicCache\nDynamicCache.from_legacy_cache(None)"),
    ("transformers.utils.is_torch_fx_available", "from transformers.utils import is_torch_fx_available"),
    ("transformers.modeling_attn_mask_utils",
     "from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask"),
])
def test_a_name_the_installed_release_lacks_is_said_with_the_releases_that_have_it(tmp_path, symbol, code):
    fact = next(f for f in RELEASE_FACTS if f.symbol == symbol)
    if fact.has(INSTALLED):
        pytest.skip(f"transformers {INSTALLED} has {symbol}")
    said = diagnose(_failure(code, tmp_path), INSTALLED)
    assert said is not None and said.startswith(f"the model's code needs `{symbol}` ({fact.releases}); this "
                                                f"interpreter has transformers {INSTALLED}: run the target under"), said


def test_rope_scaling_read_the_4x_way_is_diagnosed_from_5_on(tmp_path):
    if release(INSTALLED) < release(ROPE_SCALING_DICT_FROM):
        pytest.skip(f"transformers {INSTALLED} keeps rope_scaling None")
    chain = _failure("from transformers import LlamaConfig\nconfig = LlamaConfig(rope_scaling=None)\n"
                     "scaling = config.rope_scaling['type'] if config.rope_scaling is not None else None", tmp_path)
    said = diagnose(chain, INSTALLED)
    assert said is not None and "reads `rope_scaling` as transformers 4.x gave it" in said, said
    assert diagnose(_failure("{}['type']", tmp_path), INSTALLED) is None  # a KeyError elsewhere is not the release's


def test_a_failure_that_is_not_the_releases_is_not_diagnosed(tmp_path):
    assert diagnose(_failure("from transformers import NoSuchThing", tmp_path), INSTALLED) is None
    assert diagnose(_failure("import transformers\ntransformers.DynamicCache().no_such_method()", tmp_path),
                    INSTALLED) is None


def test_remote_code_importing_what_the_release_lacks_stops_with_the_diagnosis(tmp_path):
    fact = next((f for f in RELEASE_FACTS if f.symbol == "transformers.modeling_attn_mask_utils"), None)
    if fact.has(INSTALLED):
        pytest.skip(f"transformers {INSTALLED} has {fact.symbol}")
    folder = tmp_path / "hub"
    shutil.copytree(HUB, folder)
    modeling = folder / "modeling_tinylm.py"
    modeling.write_text(modeling.read_text().replace(
        "from .configuration_tinylm import TinyLMConfig",
        "from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask\n"
        "from .configuration_tinylm import TinyLMConfig"))
    done = graphmode("adapt", "--hf", str(folder), "--tiny", "--yes", "--backend", "eager", "--runs", "1",
                     "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout + done.stderr
    # Read from the code before anything runs (no worker started, no run folder written).
    assert "(`transformers.modeling_attn_mask_utils` at modeling_tinylm.py:" in said, said
    assert (f": {fact.releases.removeprefix('transformers ')}); this interpreter has transformers {INSTALLED}: run the "
            "target under an interpreter with such a release") in said, said
    assert not (tmp_path / "out").exists()


def test_every_transformers_name_the_code_uses_is_read_and_the_releases_having_them_all_are_said():
    code = ("from transformers.utils import is_torch_fx_available, LossKwargs\n"
            "import transformers.modeling_attn_mask_utils\n"
            "class Model:\n"
            "    def forward(self, cache, head_mask):\n"
            "        head_mask = self.get_head_mask(head_mask, 2)\n"
            "        return cache.get_usable_length(1, 0)\n")
    uses = names_used({"modeling_x.py": code})
    assert {(u.fact.symbol, u.where) for u in uses} == {
        ("transformers.utils.is_torch_fx_available", "modeling_x.py:1"), ("transformers.utils.LossKwargs",
                                                                         "modeling_x.py:1"),
        ("transformers.modeling_attn_mask_utils", "modeling_x.py:2"), ("PreTrainedModel.get_head_mask",
                                                                       "modeling_x.py:5"),
        ("Cache.get_usable_length", "modeling_x.py:6")}
    # Each name's releases intersected: LossKwargs from 4.47, get_usable_length until 4.53.
    lossy = next(u.fact for u in uses if u.fact.name == "LossKwargs")
    usable = next(u.fact for u in uses if u.fact.name == "get_usable_length")
    assert common_releases(uses) == [(release(lossy.first), release(usable.last))]
    inside = f"{lossy.first}.1"
    assert release_need(uses, inside) is None
    said = release_need(uses, "5.25.0")
    assert said.startswith(f"the model's code needs transformers {lossy.first} to {usable.last} (`"), said
    assert all(f"`{u.fact.symbol}` at {u.where}: {u.fact.releases.removeprefix('transformers ')}" in said for u in uses)
    assert "this interpreter has transformers 5.25.0: run the target under an interpreter with such a release" in said
    # A method the code defines itself is its own, whatever the release.
    own = "class C:\n    def get_usable_length(self):\n        return self.get_usable_length()\n"
    assert names_used({"m.py": own}) == []
    # Names whose releases meet in one minor release: that release is said alone.
    flash = next(f for f in RELEASE_FACTS if f.name == "LlamaFlashAttention2")
    both = names_used({"m.py": "from transformers.utils import LossKwargs\n"
                               f"from transformers.models.llama.modeling_llama import {flash.name}\n"})
    assert common_releases(both) == [(release(lossy.first), release(flash.last))]
    if lossy.first == flash.last:
        assert f"needs transformers {lossy.first} (`" in release_need(both, "5.25.0")
    assert release_need([], "5.25.0") is None


def test_a_keyword_a_release_dropped_is_a_release_fact_of_its_own():
    # ChatGLM-6B's _update_model_kwargs_for_generation: the method went after 4.48, its keyword after 4.43.
    code = ("from transformers import PreTrainedModel\n"
            "class Model(PreTrainedModel):\n"
            "    def _update_model_kwargs_for_generation(self, outputs, kwargs, standardize_cache_format=False):\n"
            "        kwargs['past'] = self._extract_past_from_model_output(\n"
            "            outputs, standardize_cache_format=standardize_cache_format)\n")
    uses = names_used({"modeling_glm.py": code})
    method = next(u.fact for u in uses if u.fact.keyword_of is None)
    keyword = next(u.fact for u in uses if u.fact.keyword_of == method.name)
    assert {u.where for u in uses} == {"modeling_glm.py:4"} and len(uses) == 2
    assert common_releases(uses) == [((), release(keyword.last))] and release(keyword.last) < release(method.last)
    assert release_need(uses, keyword.last) is None and release_need(uses, method.last) is not None
    # The code calling the method without the keyword is held to the method's releases alone.
    plain = names_used({"modeling_glm.py": code.replace("outputs, standardize_cache_format=standardize_cache_format",
                                                        "outputs")})
    assert [u.fact for u in plain] == [method]
    # A worker's TypeError for the keyword is diagnosed with the releases that take it.
    error = TypeError("GenerationMixin._extract_past_from_model_output() got an unexpected keyword argument "
                      "'standardize_cache_format'")
    assert f"`{keyword.symbol}` ({keyword.releases})" in diagnose([error], "4.48.3")


def _needing_loss_kwargs(tmp_path: Path) -> Path:
    """The remote-code fixture, importing a name transformers had from 4.47 to 4.53 only."""
    folder = tmp_path / "hub"
    shutil.copytree(HUB, folder)
    modeling = folder / "modeling_tinylm.py"
    modeling.write_text(modeling.read_text().replace(
        "from .configuration_tinylm import TinyLMConfig",
        "from transformers.utils import LossKwargs\nfrom .configuration_tinylm import TinyLMConfig"))
    return folder


def test_code_using_names_the_installed_release_lacks_is_refused_before_anything_runs(tmp_path):
    folder = _needing_loss_kwargs(tmp_path)
    uses = names_used({"modeling_tinylm.py": (folder / "modeling_tinylm.py").read_text()})
    if release_need(uses, INSTALLED) is None:
        pytest.skip(f"transformers {INSTALLED} has every name the code uses")
    done = graphmode("adapt", "--hf", str(folder), "--tiny", "--yes", "--backend", "eager", "--runs", "1",
                     "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the model's code needs transformers " in said and "`transformers.utils.LossKwargs` at modeling_tinylm.py:" \
        in said, said
    assert not (tmp_path / "out").exists()


def test_python_auto_asks_for_the_newest_releases_that_have_every_name_the_code_uses():
    from graphmode.runners.environments import transformers_requirement

    needs = names_used({"m.py": "from transformers.utils import LossKwargs\n"
                                "def f(cache):\n    return cache.get_usable_length(1)\n"})
    lossy = next(u.fact for u in needs if u.fact.name == "LossKwargs")
    usable = next(u.fact for u in needs if u.fact.name == "get_usable_length")
    high = release(usable.last)
    assert transformers_requirement(needs) == f"transformers>={lossy.first},<{high[0]}.{high[1] + 1}"
    # Code that uses none of the names: any release graphmode supports.
    assert transformers_requirement(names_used({"m.py": "import torch\n"})) == f"transformers>={SUPPORTED_FROM}"


def test_python_auto_reuses_a_made_environment_and_runs_the_target_there(tmp_path, monkeypatch):
    # The environment the code needs, already made (its manifest written): the run takes it without installing
    # anything. It is a venv sharing this interpreter's packages, so its transformers is this one's, which lacks
    # LossKwargs: the target is then refused under it, naming that interpreter; nothing ran.
    from graphmode.agent.targets.auto_python import environment_needs
    from graphmode.runners.environments import MANIFEST, environment_folder

    folder = _needing_loss_kwargs(tmp_path)
    home = tmp_path / "home"
    needs = environment_needs(None, str(folder))
    if needs is None:
        pytest.skip(f"transformers {INSTALLED} serves the code")
    requirement, packages = needs
    assert "flash_attn" in packages  # imported by the fixture, installed nowhere here
    monkeypatch.setenv("GRAPHMODE_HOME", str(home))  # where environment_folder looks, as the run's process will
    made = environment_folder(requirement, packages)
    python = make_venv(made, share_packages=True)
    (made / MANIFEST).write_text(json.dumps({"requirement": requirement}))
    done = graphmode("adapt", "--hf", str(folder), "--tiny", "--python", "auto", "--yes", "--backend", "eager",
                     "--out", str(tmp_path / "out"), home=home, cwd=tmp_path)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert f"python auto: reusing {made} ({requirement})" in said
    assert f"this interpreter has transformers {INSTALLED}" in said and not (tmp_path / "out").exists()
    assert python.exists() and (made / MANIFEST).is_file()


def test_python_auto_says_which_command_failed_and_leaves_no_half_made_environment(tmp_path, monkeypatch):
    from graphmode.runners.environments import EnvironmentMakeError, environment_folder, environment_for

    monkeypatch.setenv("GRAPHMODE_HOME", str(tmp_path / "home"))
    heard: list[str] = []
    with pytest.raises(EnvironmentMakeError, match=r"`.* install .*transformers>=99` failed \(exit \d+\)"):
        environment_for("transformers>=99", [], heard.append)
    assert heard and heard[0].startswith("python auto: making an environment with transformers>=99")
    assert not environment_folder("transformers>=99", []).exists()


@pytest.mark.extended
def test_python_auto_makes_the_environment_the_code_needs_and_the_next_run_reuses_it(tmp_path):
    """Opt-in (`-m extended`): installs transformers from the package index (about a minute)."""
    folder = _needing_loss_kwargs(tmp_path)
    if release_need(names_used({"m.py": (folder / "modeling_tinylm.py").read_text()}), INSTALLED) is None:
        pytest.skip(f"transformers {INSTALLED} serves the code")
    runs = []
    for run in ("first", "second"):
        done = graphmode("adapt", "--hf", str(folder), "--tiny", "--python", "auto", "--yes", "--backend", "eager",
                         "--runs", "1", "--out", str(tmp_path / run), home=tmp_path / "home", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        runs.append(done.stdout)
    assert "python auto: making an environment with transformers>=" in runs[0]
    assert "python auto: reusing " in runs[1] and "making" not in runs[1]
    report = json.loads((tmp_path / "second" / "hf-hub-tiny" / "report.json").read_text())
    assert report["passed"] and report["hf"]["transformers"] != INSTALLED


def test_the_workers_import_with_only_what_a_targets_interpreter_has():
    # A target's venv has torch, transformers and the model's own packages, not graphmode's (libcst, jinja2, rich,
    # langgraph, pydantic, ray): every module a worker or a written harness imports must do without them.
    from graphmode.runners.interpreter import WORKER_MODULES

    modules = (*WORKER_MODULES, "graphmode.runners.hf_driver", "graphmode.runners.seeded_build",
               "graphmode.runners.verify.generate_steps", "graphmode.runners.optional_imports",
               "graphmode.runners.npu_standin")
    done = subprocess.run([sys.executable, "-c", (
        "import importlib, sys\n"
        "for name in ('libcst', 'jinja2', 'rich', 'langgraph', 'pydantic', 'ray'):\n"
        "    sys.modules[name] = None  # an import of it fails\n"
        f"for module in {modules!r}:\n"
        "    importlib.import_module(module)\n")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_packages_the_code_imports_are_looked_up_in_the_targets_interpreter(tmp_path):
    from graphmode.agent.targets.hf import absent_packages

    bare = make_venv(tmp_path / "bare", share_packages=False)
    names = {"torch", "no_such_package_here"}
    assert absent_packages(names, None) == {"no_such_package_here"}
    assert absent_packages(names, str(bare)) == names  # the bare venv has no torch


# -- the model runs under the target's interpreter ------------------------------------------------------------------

def _sides(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())["env"]["sides"]


@pytest.mark.slow
def test_adapt_with_python_analyses_under_it_and_the_design_names_it(tmp_path, venv_python):
    """Analysis only (no --yes: it stops at the confirmation): the traced run and the probe ran under the venv's
    Python. The verify side is the batch test's below, whose target file names the interpreter instead."""
    done = graphmode("adapt", str(LEGACY), "--python", str(venv_python), "--backend", "eager",
                     "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == EXIT_STOPPED and "graphmode resume" in done.stdout, done.stdout + done.stderr
    run = tmp_path / "out" / "legacy_llm"
    assert f"| Interpreter | `{venv_python}`, Python {platform.python_version()} (the target's own" in \
        (run / "design.md").read_text()
    assert not (run / "report.json").exists()
    # graphmode was imported there through the folder of links under GRAPHMODE_HOME, never installed.
    assert list((tmp_path / "home" / "import-path").glob("*/graphmode/runners"))


@pytest.mark.slow
def test_a_batch_target_runs_under_the_python_its_manifest_names(tmp_path):
    """One target, to keep the test short: a manifest mixing interpreters is checked above without running; here the
    batch's adapt reads the target's python from the target file the batch writes, and every worker runs there."""
    manifest = tmp_path / "manifest.toml"
    python = make_venv(tmp_path / "venvs" / "own", share_packages=True)
    manifest.write_text(f"[defaults]\nbackend = 'eager'\nruns = 1\n\n"
                        f"[[target]]\nname = 'own'\npath = '{LEGACY}'\npython = 'venvs/own/bin/python'\n")
    done = graphmode("batch", str(manifest), "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run = next((tmp_path / "out" / "own").rglob("report.json")).parent
    # The venv is made from this interpreter: the same Python, and transformers shared.
    expected = {"executable": str(python), "python": platform.python_version(), "transformers": INSTALLED}
    assert _sides(run) == {"original": expected, "adapted": expected}
    assert f"| Interpreter | `{python}`, Python {expected['python']} (both sides): the target's own |" in \
        (run / "report.md").read_text()
