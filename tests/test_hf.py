"""`graphmode adapt --hf`: Hugging Face models without a harness written by hand.

Real transformers, real tiny models built from transformers' own config classes. The remote-code fixture
(tests/fixtures/hub_remote_code) is a Hub-style folder written for these tests: config.json with an auto_map, a
configuration and a modeling file with relative imports, a tuple KV cache grown with torch.cat, and an unguarded
import of a package this machine lacks (flash_attn).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from graphmode.agent.errors import UserError  # noqa: E402
from graphmode.agent.hf_target import _missing_imports, resolve  # noqa: E402
from graphmode.runners import optional_imports  # noqa: E402
from graphmode.runners.hf_driver import StaticCacheDecoder, reinitialise, tiny_config_overrides  # noqa: E402

HUB = Path(__file__).parent / "fixtures" / "hub_remote_code"


def graphmode(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=600)


def tree_fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- what --hf accepts, and what it refuses before any model runs ---------------------------------------------

@pytest.mark.parametrize("spec, tiny, says", [
    ("lama", True, "did you mean llama"),
    ("llama", False, "add --tiny"),
    ("no/such/folder", True, "no such file or folder"),
    ("t5", True, "no causal language model"),
])
def test_a_spec_that_names_no_model_is_refused_with_what_to_do(spec, tiny, says):
    with pytest.raises(UserError, match=says):
        resolve(spec, tiny, 64)


def test_folders_without_a_config_unknown_model_types_and_missing_weights_are_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no config.json .*graphmode init"):
        resolve(str(empty), True, 64)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "llamma", "hidden_size": 8}))
    with pytest.raises(UserError, match="'llamma' is unknown to the installed transformers .*did you mean llama"):
        resolve(str(unknown), True, 64)
    known = tmp_path / "known"
    known.mkdir()
    (known / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="no weights in .*add --tiny"):
        resolve(str(known), False, 64)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": ')
    with pytest.raises(UserError, match="not readable JSON"):
        resolve(str(broken), True, 64)


def test_an_auto_map_naming_a_missing_file_or_another_repository_is_refused(tmp_path):
    folder = tmp_path / "remote"
    shutil.copytree(HUB, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = "modeling_other.OtherForCausalLM"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="modeling_other.py does not exist"):
        resolve(str(folder), True, 64)
    config["auto_map"]["AutoModelForCausalLM"] = "someone/repo--modeling_tinylm.TinyLMForCausalLM"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="another repository"):
        resolve(str(folder), True, 64)


def test_the_remote_code_folder_is_read_as_a_package_of_sources_with_its_missing_imports_named():
    target = resolve(str(HUB), True, 64)
    assert target.package == "hub_remote_code"
    assert target.sources == ["hub_remote_code/modeling_tinylm.py"]
    assert target.auto_map["AutoModelForCausalLM"] == "modeling_tinylm.TinyLMForCausalLM"
    assert target.missing_imports == {"flash_attn": "modeling_tinylm.py:16"}
    # config.json's sizes shrunk for --tiny, under the names the config uses
    assert target.config_overrides["hidden_size"] == 64 and target.config_overrides["num_hidden_layers"] == 2
    assert target.prompt_vocab == 256


def test_guarded_imports_are_left_to_the_code_and_only_unguarded_missing_ones_get_placeholders(tmp_path):
    source = tmp_path / "modeling_x.py"
    source.write_text(
        "import os\n"
        "import torch\n"
        "try:\n    import no_such_package_a\nexcept ImportError:\n    no_such_package_a = None\n"
        "if is_no_such_package_b_available():\n    import no_such_package_b\n"
        "from no_such_package_c.layers import fused\n"
        "from . import sibling\n")
    assert _missing_imports(source) == {"no_such_package_c": "modeling_x.py:9"}


def test_a_placeholder_imports_but_fails_naming_the_package_when_called():
    optional_imports.install({"graphmode_test_absent_pkg": "modeling_x.py:3"})
    from graphmode_test_absent_pkg.ops import fused_attention  # noqa: the placeholder answers

    class Subclass(fused_attention):  # a placeholder class can be subclassed at import time
        pass

    with pytest.raises(optional_imports.MissingPackageError,
                       match="graphmode_test_absent_pkg, which is not installed .*modeling_x.py:3"):
        fused_attention(torch.ones(1))
    assert "graphmode_test_absent_pkg" in sys.modules


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "opt", "falcon", "gemma3_text"])
def test_the_written_harness_is_python_that_builds_the_tiny_model(tmp_path, model_type):
    from graphmode.agent.hf_target import write_target
    from graphmode.runners.harness import load_harness

    folder = write_target(resolve(model_type, True, 64), None, tmp_path / "target", 64)
    harness = load_harness(folder)
    model = harness.build_model()
    assert isinstance(model, StaticCacheDecoder) and model.config.tie_word_embeddings is False
    assert model.config.num_hidden_layers == 2 and harness.SOURCES == []


# -- transformers' own static-cache path -----------------------------------------------------------------------

@pytest.mark.parametrize("model_type", ["llama", "gpt2", "falcon"])
def test_tiny_configs_take_the_sizes_under_each_familys_own_names(model_type):
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    config = config_class(**tiny_config_overrides(config_class))
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.vocab_size) == \
        (64, 2, 4, 256)


def _greedy(model_type: str, steps: int = 12):
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    torch.manual_seed(0)
    model = reinitialise(AutoModelForCausalLM.from_config(config_class(**tiny_config_overrides(config_class))))
    driver = StaticCacheDecoder(model.eval(), max_seq_len=32)
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    name = driver.cache_argument
    with torch.no_grad():
        out = driver(input_ids=prompt, use_cache=True)
        cache, dynamic = out[name], [out.logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(steps):
            out = driver(input_ids=dynamic[-1], **{name: cache}, use_cache=True)
            cache = out[name]
            dynamic.append(out.logits[:, -1].argmax(-1, keepdim=True))
        logits = driver.prefill(prompt, torch.arange(6))
        decode = torch.compile(driver.decode, backend="eager", dynamic=False)
        static = [logits[:, -1].argmax(-1, keepdim=True)]
        for step in range(steps):
            if step == 1:
                torch.compiler.set_stance("fail_on_recompile")
            try:
                logits = decode(static[-1].clone(), torch.tensor([6 + step]))
            finally:
                torch.compiler.set_stance("default")
            static.append(logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(dynamic, 1), torch.cat(static, 1)


def test_the_static_cache_path_compiled_once_gives_the_dynamic_caches_tokens():
    torch._dynamo.reset()
    dynamic, static = _greedy("llama")
    assert len(set(dynamic[0].tolist())) > 3, "the tiny model should not repeat one token"
    assert torch.equal(dynamic, static)


# -- end to end, as a user runs it ------------------------------------------------------------------------------

@pytest.mark.slow
def test_adapt_hf_llama_tiny_verifies_transformers_own_path_with_nothing_rewritten(tmp_path):
    done = graphmode("adapt", "--hf", "llama", "--tiny", "--yes", "--backend", "eager", "--runs", "1",
                     "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "out" / "hf-llama-tiny"
    report = json.loads((run / "report.json").read_text())
    assert report["passed"] and report["tokens_equal"] and report["recompiles"] == 0
    assert report["hf"]["model_type"] == "llama" and not report["hf"]["rewritten"]
    assert report["changes_applied"] == []
    assert "transformers' own code, not rewritten" in (run / "report.md").read_text()
    harness = (run / "target" / "harness.py").read_text()
    assert "SOURCES = []" in harness and "StaticCacheDecoder" in harness


@pytest.mark.slow
def test_adapt_hf_remote_code_folder_rewrites_its_modeling_file_and_leaves_the_folder_untouched(tmp_path):
    folder = tmp_path / "TinyLM-Hub"
    shutil.copytree(HUB, folder)
    before = tree_fingerprint(folder)
    done = graphmode("adapt", "--hf", str(folder), "--tiny", "--yes", "--backend", "eager", "--runs", "1",
                     "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "modeling_tinylm.py:16 imports flash_attn, which is not installed" in done.stdout
    assert tree_fingerprint(folder) == before
    run = tmp_path / "out" / "hf-TinyLM_Hub-tiny"
    report = json.loads((run / "report.json").read_text())
    assert report["passed"] and report["graph_breaks"] == 0 and report["recompiles"] == 0
    assert "carried_cache" in report["changes_applied"] and report["hf"]["rewritten"]
    adapted = (run / "adapted" / "TinyLM_Hub" / "modeling_tinylm.py").read_text()
    assert "StaticKVBuffers" in adapted and "def decode(self, input_ids, input_pos)" in adapted


@pytest.mark.parametrize("args, says", [
    (["--hf", "llama"], "add --tiny"),
    (["--hf", "gpt-9", "--tiny"], "not a model type"),
    (["examples/legacy_llm", "--hf", "llama", "--tiny"], "not both"),
    (["--tiny"], "no target"),
])
def test_bad_hf_input_exits_2_with_one_message_and_writes_nothing(tmp_path, args, says):
    done = graphmode("adapt", *args, "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_remote_code_file_that_raises_on_import_exits_2_naming_its_line(tmp_path):
    folder = tmp_path / "raises"
    shutil.copytree(HUB, folder)
    modeling = folder / "modeling_tinylm.py"
    modeling.write_text(modeling.read_text().replace(
        "class TinyLMRMSNorm", "raise RuntimeError('this checkpoint needs a GPU')\n\n\nclass TinyLMRMSNorm"))
    done = graphmode("adapt", "--hf", str(folder), "--tiny", "--yes", "--backend", "eager", "--runs", "1",
                     "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "this checkpoint needs a GPU" in done.stderr and "modeling_tinylm.py:" in done.stderr


# -- a local model folder with weights -------------------------------------------------------------------------

def _save_tiny_llama(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    config_class = CONFIG_MAPPING["llama"]
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config_class(**tiny_config_overrides(config_class)))
    model.save_pretrained(folder)
    return model


def test_a_model_folder_is_built_from_its_own_weights_read_in_place(tmp_path):
    from graphmode.agent.hf_target import write_target

    saved = _save_tiny_llama(tmp_path / "my-llama")
    target = resolve(str(tmp_path / "my-llama"), False, 64)
    assert target.weights_folder == str((tmp_path / "my-llama").resolve()) and not target.tiny
    folder = write_target(target, tmp_path / "my-llama", tmp_path / "run" / "target", 64)
    assert not (folder / "model.safetensors").exists(), "weights are read in place, never copied"
    check = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import harness; m = harness.build_model(); "
             "torch.save({k: v for k, v in m.model.state_dict().items()}, sys.argv[2])")
    done = subprocess.run([sys.executable, "-c", check, str(folder), str(tmp_path / "built.pt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    built = torch.load(tmp_path / "built.pt")
    assert all(torch.equal(built[name], value) for name, value in saved.state_dict().items())


def test_weights_that_do_not_match_the_config_are_refused_before_anything_runs(tmp_path):
    _save_tiny_llama(tmp_path / "mismatched")
    config = json.loads((tmp_path / "mismatched" / "config.json").read_text())
    config["intermediate_size"] = 96
    (tmp_path / "mismatched" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"weights do not match config.json: .*mlp.* is \[.*128.*\] in the weights"):
        resolve(str(tmp_path / "mismatched"), False, 64)
