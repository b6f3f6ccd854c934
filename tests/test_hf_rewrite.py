"""`graphmode adapt --hf MODEL_TYPE --rewrite`: the installed transformers' own modeling file, copied and rewritten.

The copy is the installed file with its relative imports made absolute (libcst) and every line where it was; the
installed file is only read. One end-to-end run (module-scoped, eager backend, one run a side) checks that a codemod
rewrote the copy and that the adapted model verifies with no graph break.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

from graphmode.agent.errors import UserError  # noqa: E402
from graphmode.agent.targets.hf import resolve  # noqa: E402
from graphmode.agent.targets.installed_copy import absolute_imports, copy_modeling_file, recurrent_state_write  # noqa: E402,E501

# The smallest type whose copy verifies on the rewrite path (bench/hf_zoo.py --rewrite has the others).
E2E_TYPE = "llama"


def test_relative_imports_become_absolute_and_every_line_keeps_its_number():
    source = ('"""doc"""\n'
              "from ...activations import ACT2FN\n"
              "from ...modeling_utils import (\n"
              "    PreTrainedModel,\n"
              "    no_init_weights,\n"
              ")\n"
              "from .configuration_foo import FooConfig\n"
              "from . import helpers\n"
              "import torch\n"
              "\n"
              "x = 1  # from .not_an_import\n")
    out = absolute_imports(source, "transformers.models.foo.modeling_foo")
    assert out.splitlines() == ['"""doc"""',
                                "from transformers.activations import ACT2FN",
                                "from transformers.modeling_utils import (",
                                "    PreTrainedModel,",
                                "    no_init_weights,",
                                ")",
                                "from transformers.models.foo.configuration_foo import FooConfig",
                                "from transformers.models.foo import helpers",
                                "import torch",
                                "",
                                "x = 1  # from .not_an_import"]
    with pytest.raises(UserError, match="goes above the package"):
        absolute_imports("from .....x import y\n", "transformers.models.foo.modeling_foo")


def test_the_installed_llama_file_is_copied_line_for_line_and_left_as_it_was(tmp_path):
    import transformers.models.llama.modeling_llama as installed_module

    installed = Path(installed_module.__file__)
    before = hashlib.sha256(installed.read_bytes()).hexdigest()
    copy = copy_modeling_file(installed, installed_module.__name__, tmp_path)
    assert copy.name == "modeling_llama.py"
    assert hashlib.sha256(installed.read_bytes()).hexdigest() == before
    original, copied = installed.read_text().splitlines(), copy.read_text().splitlines()
    assert len(original) == len(copied)
    differ = [i for i, (a, b) in enumerate(zip(original, copied)) if a != b]
    assert differ and all(original[i].lstrip().startswith("from .") for i in differ)  # the imports alone
    assert all(node.level == 0 for node in ast.walk(ast.parse(copy.read_text()))
               if isinstance(node, ast.ImportFrom))


def test_rewrite_makes_the_copy_the_source_and_refuses_what_no_rewrite_serves(tmp_path):
    target = resolve("llama", True, 64, rewrite=True)
    assert target.package is None and target.sources == ["modeling_llama.py"]
    assert target.model_refs == ["modeling_llama.LlamaForCausalLM"]
    assert target.installed_copy.endswith("transformers/models/llama/modeling_llama.py")
    assert resolve("llama", True, 64).installed_copy is None  # without --rewrite: transformers' static path
    # gemma3_text's causal LM lives in models/gemma3/: that file is the one copied
    if "gemma3_text" in transformers.CONFIG_MAPPING:
        assert resolve("gemma3_text", True, 64, rewrite=True).sources == ["modeling_gemma3.py"]
    # a recurrent state is no key/value cache: neither the static path nor a rewrite serves it
    with pytest.raises(UserError, match=r"takes `mems` instead.*no rewrite of its code serves it"):
        resolve("xlnet", True, 64, rewrite=True)
    # a recurrent state (Mamba's) is overwritten, not grown: no rewrite serves it, transformers' static path does
    if "mamba" in transformers.CONFIG_MAPPING:
        with pytest.raises(UserError, match=r"modeling_mamba.py:\d+ calls `update_\w+_state`: .*recurrent state"):
            resolve("mamba", True, 64, rewrite=True)
    # RecurrentGemma keeps its states in module attributes, computed anew from themselves every step
    if "recurrent_gemma" in transformers.CONFIG_MAPPING:
        with pytest.raises(UserError, match=r"modeling_recurrent_gemma.py:\d+ rebinds `self.recurrent_states` in "
                                            r"`RecurrentGemmaRglru.forward` from its own value: .*recurrent state"):
            resolve("recurrent_gemma", True, 64, rewrite=True)
    # remote code is rewritten already
    with pytest.raises(UserError, match="--rewrite is for a model type"):
        resolve(str(Path(__file__).parent / "fixtures" / "hub_remote_code"), True, 64, rewrite=True)


def test_a_state_a_module_computes_from_itself_is_told_from_a_cache_it_grows_or_a_value_it_casts(tmp_path):
    def state_of(body: str) -> str | None:
        (tmp_path / "modeling_x.py").write_text(
            "import torch\n\n\nclass Block(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.state = None\n\n    def forward(self, x):\n{body}        return x\n")
        return recurrent_state_write(tmp_path / "modeling_x.py")

    # a convolution state: the last columns of itself and the new input (RecurrentGemma's conv1d_state)
    assert state_of("        window = torch.cat((self.state, x), -1)\n        self.state = window[:, :, 1:]\n") == \
        "modeling_x.py:11 rebinds `self.state` in `Block.forward` from its own value"
    # a scan carried on from its last value
    assert state_of("        x, last = scan(x, self.state)\n        self.state = last\n") is not None
    # keys grown by a bare cat (a legacy cache kept in an attribute) and a state only cast are no such state
    assert state_of("        self.state = torch.cat([self.state, x], dim=1)\n") is None
    assert state_of("        keys = torch.cat([self.state, x], dim=1)\n        self.state = keys\n") is None
    assert state_of("        self.state = self.state.to(x.dtype) if self.state is not None else None\n") is None
    assert state_of("        self.state = x.sum()\n") is None  # computed from the input alone


@pytest.mark.skipif("deepseek_v4" not in transformers.CONFIG_MAPPING, reason="a transformers 5.x model type")
def test_layers_static_cache_cannot_hold_make_graphmode_rewrite_the_copy_by_itself():
    """DeepSeek-V4's compressed attention layers have no kind of layer in transformers' StaticCache, which then cannot
    even be built: the copy is rewritten without --rewrite, and the note says why, naming the layer types."""
    target = resolve("deepseek_v4", True, 64)
    assert target.sources == ["modeling_deepseek_v4.py"]
    note, = target.notes
    assert "'heavily_compressed_attention'" in note and "no kind of layer in this transformers' StaticCache" in note
    assert "rewrites a copy of transformers/models/deepseek_v4/modeling_deepseek_v4.py" in note
    assert resolve("gemma2", True, 64).sources == []  # sliding and full layers: StaticCache holds both


def test_the_target_folder_holds_the_copy_beside_the_harness_for_a_type_and_for_a_folder(tmp_path):
    from graphmode.agent.targets.hf import write_target

    folder = tmp_path / "llama-folder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for spec, source in (("llama", None), (str(folder), folder)):
        target = resolve(spec, True, 64, rewrite=True)
        dest = write_target(target, source, tmp_path / f"target-{source is not None}", 64)
        assert sorted(p.name for p in dest.iterdir() if p.suffix == ".py") == ["harness.py", "modeling_llama.py"]
        harness = (dest / "harness.py").read_text()
        ast.parse(harness)
        assert "from modeling_llama import LlamaForCausalLM" in harness
        assert ('AutoConfig.from_pretrained(HERE / "model"' in harness) == (source is not None)
        assert (dest / "model" / "config.json").is_file() == (source is not None)


def graphmode(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=600)


def test_rewrite_without_hf_is_refused(tmp_path):
    done = graphmode("adapt", str(tmp_path), "--rewrite", home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2 and "--rewrite goes with --hf" in done.stderr


@pytest.fixture(scope="module")
def rewritten_run(tmp_path_factory):
    """One `adapt --hf E2E_TYPE --tiny --rewrite` run, shared by the assertions below; the installed file's hash
    before it."""
    module = __import__(f"transformers.models.{E2E_TYPE}.modeling_{E2E_TYPE}", fromlist=["_"])
    installed = Path(module.__file__)
    before = hashlib.sha256(installed.read_bytes()).hexdigest()
    tmp = tmp_path_factory.mktemp("rewrite")
    done = graphmode("adapt", "--hf", E2E_TYPE, "--tiny", "--rewrite", "--yes", "--backend", "eager", "--runs", "1",
                     "--out", str(tmp / "out"), home=tmp / "home", cwd=tmp)
    return done, tmp / "out" / f"hf-{E2E_TYPE}-tiny", installed, before


@pytest.mark.slow
def test_the_copy_is_rewritten_and_verifies_with_the_installed_file_untouched(rewritten_run):
    done, run, installed, before = rewritten_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["passed"] and report["tokens_equal"] and report["graph_breaks"] == 0
    assert report["hf"]["rewritten"] and "copied into the run folder" in report["hf"]["code"]
    assert report["changes_applied"]  # at least one codemod rewrote the copy
    copy = run / "target" / f"modeling_{E2E_TYPE}.py"
    adapted = run / "adapted" / f"modeling_{E2E_TYPE}.py"
    assert adapted.read_text() != copy.read_text()
    assert hashlib.sha256(installed.read_bytes()).hexdigest() == before
    assert "the installed file is not touched" in (run / "design.md").read_text()
