"""`graphmode adapt --hf`: Hugging Face models without a harness written by hand.

Real transformers, real tiny models built from transformers' own config classes. The remote-code fixture
(tests/fixtures/hub_remote_code) is a Hub-style folder written for these tests: config.json with an auto_map, a
configuration and a modeling file with relative imports, a tuple KV cache grown with torch.cat, and an unguarded
import of a package this machine lacks (flash_attn). tests/fixtures/hub_glm_style is ChatGLM-shaped: auto_map with only
AutoModel and AutoModelForSeq2SeqLM, its own prepare_inputs_for_generation and _update_model_kwargs_for_generation,
[gMASK]/sop ids in config.json, and a `forward` that asserts the attention mask.
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
from graphmode.agent.targets.hf import _missing_imports, resolve  # noqa: E402
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
    ("roberta", True, "describes an encoder"),  # its causal LM head is causal only with is_decoder=True
])
def test_a_spec_that_names_no_model_is_refused_with_what_to_do(spec, tiny, says):
    with pytest.raises(UserError, match=says):
        resolve(spec, tiny, 64)


@pytest.mark.parametrize("spec, says", [
    # XLM attends both ways unless its config's `causal` is set (its CLM checkpoints set it; the class does not)
    ("xlm", r"XLMConfig describes an encoder \(causal is false"),
    ("xlnet", r"XLNetLMHeadModel's forward takes no cache .*takes `mems` instead"),  # past hidden states
    ("xlstm", r"keeps its state in xLSTMCache, a class of its own that is not a transformers Cache"),
    ("openai-gpt", r"takes no cache .*keeps nothing between steps"),
    ("minimax", r"takes its own MiniMaxCache alone"),  # its code refuses any other cache object
])
def test_a_type_whose_state_no_static_cache_holds_is_refused_naming_it(spec, says):
    from transformers import CONFIG_MAPPING

    if spec not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {spec}")
    with pytest.raises(UserError, match=says):
        resolve(spec, True, 64)


def test_a_type_transformers_doubts_compiles_is_driven_with_a_note_not_refused():
    # transformers 5.x keeps `_can_compile_fullgraph = False` on a few models: Aria's text model is one, and its static
    # path compiles to one graph (bench/hf_zoo.py verifies it), so the flag is said, not obeyed.
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    from graphmode.runners.hf_driver import declared_not_compilable

    if "aria_text" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no aria_text")
    model_class = AutoModelForCausalLM._model_mapping[CONFIG_MAPPING["aria_text"]]
    doubt = declared_not_compilable(model_class)
    if doubt is None:
        pytest.skip(f"{model_class.__name__} no longer declares _can_compile_fullgraph = False")
    target = resolve("aria_text", True, 64)
    assert any(note.startswith(doubt) and "report counts what breaks" in note for note in target.notes)


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
    from graphmode_test_absent_pkg.ops import fused_attention  # not installed: the placeholder answers

    class Subclass(fused_attention):  # a placeholder class can be subclassed at import time
        pass

    with pytest.raises(optional_imports.MissingPackageError,
                       match="graphmode_test_absent_pkg, which is not installed .*modeling_x.py:3"):
        fused_attention(torch.ones(1))
    assert "graphmode_test_absent_pkg" in sys.modules


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "opt", "falcon", "gemma3_text"])
def test_the_written_harness_is_python_that_builds_the_tiny_model(tmp_path, model_type):
    from graphmode.agent.targets.hf import write_target
    from graphmode.runners.harness import load_harness

    folder = write_target(resolve(model_type, True, 64), None, tmp_path / "target", 64)
    harness = load_harness(folder)
    model = harness.build_model()
    assert isinstance(model, StaticCacheDecoder) and model.config.tie_word_embeddings is False
    assert model.config.num_hidden_layers == 2 and harness.SOURCES == []
    # Every build is the same model, bit for bit (what __init__ leaves unwritten is filled from the seed).
    again = harness.build_model().state_dict()
    assert all(torch.equal(tensor, again[name]) for name, tensor in model.state_dict().items())


# -- transformers' own static-cache path -----------------------------------------------------------------------

@pytest.mark.parametrize("model_type", ["llama", "gpt2", "falcon"])
def test_tiny_configs_take_the_sizes_under_each_familys_own_names(model_type):
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    config = config_class(**tiny_config_overrides(config_class))
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.vocab_size) == \
        (64, 2, 4, 256)


@pytest.mark.parametrize("model_type", ["gptj", "hunyuan_v1_dense", "deepseek_v3", "gpt_neo", "ernie4_5_moe"])
def test_tiny_configs_keep_the_configs_own_constraints(model_type):
    # GPT-J's rotary part fits the tiny head, HunYuan's head_dim (None by default) is set, DeepSeek's MLA has a
    # key/value head per head, GPT-Neo's per-layer attention pattern covers the tiny layers (its config checks the
    # count), ERNIE 4.5's experts per token (moe_k) are no more than the tiny experts; each tiny model then runs
    # transformers' static-cache Decode to the dynamic cache's tokens.
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type](**tiny_config_overrides(CONFIG_MAPPING[model_type]))
    head = config.hidden_size // config.num_attention_heads
    assert getattr(config, "rotary_dim", None) is None or config.rotary_dim <= head
    assert getattr(config, "head_dim", head) is not None
    if getattr(config, "kv_lora_rank", None):
        assert config.num_key_value_heads == config.num_attention_heads
    if getattr(config, "moe_k", None):
        assert config.moe_k <= config.moe_num_experts
    dynamic, static = _greedy(model_type, steps=4)
    assert torch.equal(dynamic, static)


@pytest.mark.parametrize("model_type", ["dory", "dots1"])
def test_tiny_configs_keep_the_layer_sections_and_expert_counts_the_class_leaves_open(model_type):
    # Dory splits its stack into input, looped and output sections whose counts only have to add up: at their full
    # sizes in a 2-layer stack every layer ran twice and wrote its cache twice (the Decode's keys one position
    # longer than its mask). dots.llm1's class leaves its expert count None (torch.empty(None, ...) in __init__).
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type](**tiny_config_overrides(CONFIG_MAPPING[model_type]))
    if model_type == "dory":
        assert (config.n_input_layers, config.n_recurrent_layers, config.n_output_layers) == (0, 1, 1)
    else:
        assert (config.n_routed_experts, config.num_experts_per_tok) == (4, 2)
    dynamic, static = _greedy(model_type, steps=4)
    assert torch.equal(dynamic, static)


@pytest.mark.parametrize("model_type", ["bailing_hybrid", "bamba"])
def test_tiny_hybrid_stacks_keep_an_attention_layer_beside_their_recurrent_ones(model_type):
    # Ling's stack has one attention layer in six, Bamba's class defaults name none (its checkpoints do): cut to two
    # layers, both stacks held linear-attention state only and transformers' own mask code refused the cache.
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type](**tiny_config_overrides(CONFIG_MAPPING[model_type]))
    assert list(config.layer_types if model_type != "bamba" else config.layers_block_type) == \
        ["linear_attention", "full_attention"]
    dynamic, static = _greedy(model_type, steps=4)
    assert torch.equal(dynamic, static)


@pytest.mark.parametrize("model_type, expected", [
    ("zaya", {"num_experts_per_tok": 1}),  # its config accepts only 1: the tiny count is no larger than the class's
    # Cohere Compass reads rope_parameters[layer_type], which its class leaves {}
    ("cohere_compass_text", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # Gemma 3n's last 15 of 35 layers reuse an earlier layer's keys and values: one of the two tiny layers does, and
    # its per-layer input embeddings (262k rows) take the tiny vocabulary
    ("gemma3n_text", {"num_kv_shared_layers": 1, "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 16}),
    # Qwen4-Exp's attention layers build the QSA indexer its class leaves unset (its Decode then breaks the graph
    # in the indexer's own per-query torch.nonzero: built and run here, not compiled)
    ("qwen4_exp_text", {"indexer_kv_heads": 1, "indexer_budget": 16, "layer_types": ["linear_attention",
                                                                                     "indexed_attention"]}),
    # LFM2-MoE's class leaves its stack to the checkpoint (its layers read config.layer_types[i])
    ("lfm2_moe", {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1}),
    ("mamba2", {"num_heads": 8}),  # its heads tile hidden_size * expand (64 * 2 = 8 heads of 16)
    ("kolibri1_1", {"index_num_heads": 2}),  # no more indexer heads than the query heads of one key head
    ("inkling2_text", {"unpadded_vocab_size": 256}),  # its LM head's width
    # its layers hold linear-attention state beside a sliding window: a full-size hybrid layer that still says it
    # slides compiles Decode once (the sliding one recompiled at every step)
    ("inkling_text", {}),
])
def test_tiny_configs_fill_what_the_class_leaves_to_its_checkpoints_and_keep_its_limits(model_type, expected):
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    config = CONFIG_MAPPING[model_type](**tiny_config_overrides(CONFIG_MAPPING[model_type]))
    assert {name: getattr(config, name) for name in expected} == expected
    if model_type == "qwen4_exp_text":
        with torch.no_grad():
            logits = AutoModelForCausalLM.from_config(config)(torch.tensor([[1, 2, 3]])).logits
        assert logits.shape == (1, 3, 256)
        return
    dynamic, static = _greedy(model_type, steps=4)
    assert torch.equal(dynamic, static)


@pytest.mark.parametrize("model_type", ["dbrx", "dots3_note"])
def test_tiny_builds_a_model_whose_class_defaults_build_none(model_type):
    # DBRX's attention reads attn_config.rope_theta and clip_qkv, which its class no longer defines or leaves None;
    # dots.ocr 3's vision and audio adapters are checked against their part's hidden size.
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    model = AutoModelForCausalLM.from_config(CONFIG_MAPPING[model_type](
        **tiny_config_overrides(CONFIG_MAPPING[model_type])))
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 256)


def test_a_hybrid_whose_attention_layers_slide_decodes_as_generate_does(tmp_path):
    # RecurrentGemma's stack is named in block_types (recurrent, recurrent, attention): the tiny stack keeps an
    # attention layer through it. Its sliding layer, held as a full static layer, still says it slides, or the mask
    # code sizes the mask from the recurrent layer 0 and each query sees position 0 alone. Its output carries no
    # cache: the harness passes the one generate() makes, or every step would start from an empty cache.
    from transformers import CONFIG_MAPPING

    from graphmode.agent.targets.hf import write_target
    from graphmode.runners.harness import load_harness

    if "recurrent_gemma" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no recurrent_gemma")
    config = CONFIG_MAPPING["recurrent_gemma"](**tiny_config_overrides(CONFIG_MAPPING["recurrent_gemma"]))
    assert config.block_types == ["recurrent", "attention"]
    harness = load_harness(write_target(resolve("recurrent_gemma", True, 64), None, tmp_path / "target", 64))
    model = harness.build_model()
    prompt = harness.make_prompt()
    got = _harness_tokens(harness, model, 6)
    with torch.no_grad():
        generated = model.generate(prompt, max_new_tokens=6, do_sample=False)[0, prompt.shape[1]:].tolist()
        logits, static = model.prefill(prompt, torch.arange(8)), []
        for step in range(6):
            static.append(int(logits[0, -1].argmax()))
            logits = model.decode(torch.tensor([[static[-1]]]), torch.tensor([8 + step]))
    assert got == generated == static and len(set(got)) > 1


def test_tiny_shrinks_each_part_of_a_composite_config(tmp_path):
    # Gemma 3's text model and vision tower are configs of their own: left at full size the tiny build held a
    # 400M-weight vision tower and a 262k-token embedding, and was killed for memory. From a folder, the parts'
    # per-layer lists are cut to the tiny layer count as the top level's are.
    from transformers import AutoConfig, AutoModelForCausalLM, CONFIG_MAPPING

    CONFIG_MAPPING["gemma3"]().save_pretrained(tmp_path)
    for config in (AutoConfig.for_model("gemma3", **tiny_config_overrides(CONFIG_MAPPING["gemma3"])),
                   AutoConfig.from_pretrained(tmp_path, **resolve(str(tmp_path), True, 64).config_overrides)):
        assert (config.text_config.hidden_size, config.text_config.num_hidden_layers, config.text_config.vocab_size,
                config.vision_config.hidden_size, config.vision_config.num_hidden_layers) == (64, 2, 256, 64, 2)
    model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 256)


@pytest.mark.parametrize("model_type", ["mistral", "gemma2"])
def test_sliding_window_layers_decode_compiled_once_with_the_dynamic_caches_tokens(model_type):
    # A window of 5 positions slides many times over the 6-token prompt and 12 steps: transformers' own sliding
    # layer recompiled the Decode at every step; as a full layer under the model's sliding-window mask it compiles
    # once and its attention sees what the window shows.
    dynamic, static = _greedy(model_type, steps=12, sliding_window=5)
    assert torch.equal(dynamic, static)


def _greedy(model_type: str, steps: int = 12, **config):
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    torch.manual_seed(0)
    model = reinitialise(AutoModelForCausalLM.from_config(config_class(**tiny_config_overrides(config_class),
                                                                       **config)))
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


# Opt-in: CI adapts a remote-code folder end to end in the GLM-style test below (its folder left untouched too); the
# placeholders and the folder read as a package are checked in process above.
@pytest.mark.slow
@pytest.mark.extended
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
    from graphmode.agent.targets.hf import write_target

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


# -- driving the model as its own generate() does ----------------------------------------------------------------

GLM = Path(__file__).parent / "fixtures" / "hub_glm_style"


def _forward_calls(model: torch.nn.Module) -> list[dict]:
    """What each top-level `forward` call received, recorded by a real forward pre-hook."""
    calls: list[dict] = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    return calls


def _harness_tokens(harness, model, steps: int) -> list[int]:
    with torch.no_grad():
        logits, state = harness.prefill(model, harness.make_prompt())
        tokens = []
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            tokens.append(token.item())
            logits, state = harness.decode(model, token, state)
    return tokens


def test_a_glm_style_folder_is_read_with_its_lm_class_and_its_gmask_prefix():
    target = resolve(str(GLM), True, 64)
    assert target.model_refs == ["modeling_glmstyle.GLMStyleForConditionalGeneration"]
    assert set(target.auto_map) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    assert any("names no AutoModelForCausalLM" in note for note in target.notes)
    # [gMASK] and sop are beyond the tiny vocabulary: moved to distinct ids, the config told the same ids
    gmask, sop = target.config_overrides["gmask_token_id"], target.config_overrides["sop_token_id"]
    assert target.prompt_prefix == [gmask, sop] and gmask != sop and max(gmask, sop) < 256
    assert {gmask, sop, 0, 2} <= set(target.special_ids)  # pad and eos stay out of the random ids too
    assert "gmask_token_id 64790 (config.json)" in target.prompt_evidence[0]


def test_the_hf_harness_drives_a_glm_style_model_as_its_generate_does(tmp_path):
    from graphmode.agent.targets.hf import write_target
    from graphmode.runners.harness import load_harness

    target = resolve(str(GLM), True, 64)
    harness = load_harness(write_target(target, GLM, tmp_path / "target", 64))
    model = harness.build_model()
    prompt = harness.make_prompt()
    assert prompt[0, :2].tolist() == target.prompt_prefix
    assert not set(prompt[0, 2:].tolist()) & set(target.special_ids)
    calls = _forward_calls(model)
    got = _harness_tokens(harness, model, 4)
    # Prefill: the whole prompt; then the model's own prepare_inputs_for_generation keeps the new token and its
    # (batch, tokens) position, and the mask grows by a column each step.
    assert [tuple(c["input_ids"].shape) for c in calls] == [(1, 8)] + [(1, 1)] * 4
    assert [c["position_ids"].tolist() for c in calls[1:]] == [[[8]], [[9]], [[10]], [[11]]]
    assert [c["attention_mask"].shape[1] for c in calls] == [8, 9, 10, 11, 12]
    assert all(c["return_last_logit"] is True for c in calls)  # what its own prepare_inputs_for_generation adds
    # the same greedy tokens as the whole sequence recomputed, with no cache
    sequence, want = prompt, []
    with torch.no_grad():
        for _ in range(4):
            positions = torch.arange(sequence.shape[1])[None]
            logits = model(input_ids=sequence, position_ids=positions, attention_mask=torch.ones_like(sequence)).logits
            want.append(logits[0, -1].argmax().item())
            sequence = torch.cat([sequence, torch.tensor([[want[-1]]])], dim=1)
    assert got == want and len(set(got)) > 1


def test_the_hf_harness_gives_transformers_own_generate_tokens_for_a_model_type(tmp_path):
    from graphmode.agent.targets.hf import write_target
    from graphmode.runners.harness import load_harness

    target = resolve("llama", True, 64)
    assert target.prompt_prefix == [1] and target.prompt_evidence == ["bos 1 (bos_token_id)"]
    harness = load_harness(write_target(target, None, tmp_path / "target", 64))
    model = harness.build_model()
    prompt = harness.make_prompt()
    calls = _forward_calls(model)
    got = _harness_tokens(harness, model, 6)
    assert [c["attention_mask"].shape[1] for c in calls] == [8, 9, 10, 11, 12, 13, 14]
    with torch.no_grad():
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                                   do_sample=False)
    assert got == generated[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("model_type", ["phi3", "qwen2"])
def test_the_hf_harness_feeds_one_new_token_a_step_as_generate_does(tmp_path, model_type):
    # Phi-3's prepare_inputs_for_generation takes **kwargs and hands them on to transformers' own, which cuts the
    # sequence by the step's length: every later step's forward gets the new token alone, and the tokens are
    # generate()'s.
    from graphmode.agent.targets.hf import write_target
    from graphmode.runners.harness import load_harness

    harness = load_harness(write_target(resolve(model_type, True, 64), None, tmp_path / "target", 64))
    model = harness.build_model()
    prompt = harness.make_prompt()
    calls = _forward_calls(model)
    got = _harness_tokens(harness, model, 8)
    assert [c["input_ids"].shape[1] for c in calls] == [prompt.shape[1]] + [1] * 8
    with torch.no_grad():
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                                   do_sample=False)
    assert got == generated[0, prompt.shape[1]:].tolist()


def test_auto_map_classes_without_an_lm_head_are_named_when_the_harness_builds(tmp_path):
    from graphmode.agent.targets.hf import write_target
    from graphmode.runners.harness import load_harness

    folder = tmp_path / "headless"
    shutil.copytree(GLM, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_glmstyle.GLMStyleConfig",
                          "AutoModel": "modeling_glmstyle.GLMStyleTransformer"}
    (folder / "config.json").write_text(json.dumps(config))
    harness = load_harness(write_target(resolve(str(folder), True, 64), folder, tmp_path / "target", 64))
    with pytest.raises(ValueError, match=r"none of the model classes .*\(modeling_glmstyle.GLMStyleTransformer\) "
                                         r"has an LM head \(a linear onto the 256-token vocabulary\)"):
        harness.build_model()
    config["auto_map"] = {"AutoConfig": "configuration_glmstyle.GLMStyleConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="auto_map has no AutoModel\\* entry; .*with an LM head"):
        resolve(str(folder), True, 64)


@pytest.mark.parametrize("config, tokenizer, prefix", [
    ({"bos_token_id": 1, "eos_token_id": 2}, None, [1]),                       # Llama: <s> first
    ({"bos_token_id": 50256, "eos_token_id": 50256}, None, []),                # GPT-2: bos is eos, not prepended
    ({"bos_token_id": 1, "eos_token_id": 2}, {"add_bos_token": False}, []),    # the tokenizer says no
    ({"eos_token_id": [151329, 151336]},                                       # GLM-4: only the tokenizer has them
     {"added_tokens_decoder": {"151331": {"content": "[gMASK]", "special": True},
                               "151333": {"content": "<sop>", "special": True}}}, [151331, 151333]),
])
def test_the_prompt_prefix_comes_from_the_folders_own_files(tmp_path, config, tokenizer, prefix):
    from graphmode.agent.targets.hf_prompt import prompt_tokens, tiny_special_ids

    if tokenizer is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    tokens = prompt_tokens(config, tmp_path)
    assert tokens.prefix == prefix and set(prefix) <= set(tokens.special)
    moved = tiny_special_ids(config, 256, tokens)
    assert all(i < 256 for i in tokens.prefix) and len(set(tokens.prefix)) == len(prefix)
    for key, value in moved.items():  # every moved config id lands below the vocabulary, distinct from the others
        assert all(i < 256 for i in (value if isinstance(value, list) else [value])), key


# -- --tiny for MoE and MLA configs ----------------------------------------------------------------------------

# DeepSeek-V2-Lite's shape (config.json's MoE and MLA fields), under transformers' own deepseek_v2 model type.
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "intermediate_size": 10944, "moe_intermediate_size": 1408, "vocab_size": 102400,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "topk_method": "greedy", "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "max_position_embeddings": 163840, "bos_token_id": 100000, "eos_token_id": 100001,
}


def test_tiny_keeps_an_moe_layer_and_shrinks_expert_and_mla_sizes(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from graphmode.agent.targets.hf import _tiny_overrides_from_dict

    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V2_LITE))
    target = resolve(str(tmp_path), True, 64)
    tiny = target.config_overrides
    assert (tiny["n_routed_experts"], tiny["n_shared_experts"], tiny["num_experts_per_tok"]) == (4, 1, 2)
    assert (tiny["moe_intermediate_size"], tiny["kv_lora_rank"], tiny["qk_rope_head_dim"]) == (32, 32, 8)
    assert tiny["first_k_dense_replace"] == 1 and tiny["num_hidden_layers"] == 2
    assert "q_lora_rank" not in tiny  # V2-Lite has none: left None
    assert target.prompt_prefix == [tiny["bos_token_id"]] and tiny["bos_token_id"] != tiny["eos_token_id"]
    # the remote-code path (DeepSeek's own code reads config.json as a dict) shrinks the same fields
    remote = _tiny_overrides_from_dict(DEEPSEEK_V2_LITE, 64)
    assert {k: remote[k] for k in ("n_routed_experts", "num_experts_per_tok", "kv_lora_rank", "v_head_dim",
                                   "first_k_dense_replace")} == {k: tiny[k] for k in ("n_routed_experts",
                                   "num_experts_per_tok", "kv_lora_rank", "v_head_dim", "first_k_dense_replace")}
    # runtime evidence: the tiny model builds, layer 0 dense and layer 1 MoE, and it is small
    config = AutoConfig.from_pretrained(tmp_path, **tiny)
    model = AutoModelForCausalLM.from_config(config)
    experts = [name for name, module in model.named_modules() if name.endswith("mlp.experts")]
    assert experts == ["model.layers.1.mlp.experts"]
    assert sum(p.numel() for p in model.parameters()) < 500_000
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 256)


@pytest.mark.slow
def test_adapt_hf_glm_style_folder_verifies_driven_as_its_generate_does(tmp_path):
    """auto_map with only AutoModel/AutoModelForSeq2SeqLM, (batch, tokens) positions and the new-token slice from
    its own prepare_inputs_for_generation, [gMASK] sop first in every prompt. The adapted entries pass no mask yet,
    so the copy lets `forward` do without one (require_attention_mask false); the harness still passes it."""
    folder = tmp_path / "GLM-Hub"
    shutil.copytree(GLM, folder)
    config = json.loads((folder / "config.json").read_text())
    config["require_attention_mask"] = False
    (folder / "config.json").write_text(json.dumps(config))
    before = tree_fingerprint(folder)
    done = graphmode("adapt", "--hf", str(folder), "--tiny", "--yes", "--backend", "eager", "--runs", "1",
                     "--out", str(tmp_path / "out"), home=tmp_path / "home", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "auto_map names no AutoModelForCausalLM" in done.stdout
    assert tree_fingerprint(folder) == before
    run = tmp_path / "out" / "hf-GLM_Hub-tiny"
    report = json.loads((run / "report.json").read_text())
    assert report["passed"] and report["tokens_equal"] and report["recompiles"] == 0 and report["hf"]["rewritten"]
    assert report["hf"]["prompt_prefix"].startswith("gmask_token_id 64790 (config.json)")
    design = (run / "design.md").read_text()  # what the harness passed: positions from the model's own method
    assert "| `position_ids` | passed | passed | positions | int tensor [1, 1] holding 8, 9, 10" in design
    assert "| `attention_mask` | passed | passed | state | int tensor whose last dim grows 8 -> 9, 10" in design
