"""A remote-code tokenizer's prompt layout, read from its `build_inputs_with_special_tokens`
(agent.targets.tokenizer_layout), and the prompts the `--hf` harness builds from it. The tokenizer sources below have
the shapes of published ones: GLM v1 puts its mask and start tokens after the text, GLM v2/v3 before it,
Llama-style tokenizers switch `<s>` on `add_bos_token`."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from graphmode.agent.targets.hf_prompt import prompt_tokens, tiny_special_ids
from graphmode.agent.targets.tokenizer_layout import TokenRef, special_layout

GLM_V1 = '''
class ChatGLMTokenizer(PreTrainedTokenizer):
    def __init__(self, vocab_file, bos_token="<sop>", gmask_token="[gMASK]", **kwargs):
        self.bos_token, self.gmask_token = bos_token, gmask_token

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        """The text, then [gMASK] and <sop>."""
        gmask_id = self.sp_tokenizer[self.gmask_token]
        eos_id = self.sp_tokenizer[self.eos_token]
        token_ids_0 = token_ids_0 + [gmask_id, self.sp_tokenizer[self.bos_token]]
        if token_ids_1 is not None:
            token_ids_0 = token_ids_0 + token_ids_1 + [eos_id]
        return token_ids_0
'''

GLM_V2 = '''
class ChatGLMTokenizer(PreTrainedTokenizer):
    def get_prefix_tokens(self):
        prefix_tokens = [self.get_command("[gMASK]"), self.get_command("sop")]
        return prefix_tokens

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        prefix_tokens = self.get_prefix_tokens()
        token_ids_0 = prefix_tokens + token_ids_0
        if token_ids_1 is not None:
            token_ids_0 = token_ids_0 + token_ids_1 + [self.get_command("<eos>")]
        return token_ids_0
'''

LLAMA_STYLE = '''
class MyTokenizer(PreTrainedTokenizer):
    def __init__(self, vocab_file, add_bos_token=True, add_eos_token=False, **kwargs):
        self.add_bos_token, self.add_eos_token = add_bos_token, add_eos_token

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        bos_token_id = [self.bos_token_id] if self.add_bos_token else []
        eos_token_id = [self.eos_token_id] if self.add_eos_token else []
        output = bos_token_id + token_ids_0 + eos_token_id
        if token_ids_1 is not None:
            output = output + bos_token_id + token_ids_1 + eos_token_id
        return output
'''

LOOPING = '''
class OddTokenizer(PreTrainedTokenizer):
    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        for special in self.all_special_ids:
            token_ids_0 = [special] + token_ids_0
        return token_ids_0
'''


def _folder(tmp_path: Path, source: str, tokenizer_config: dict | None = None) -> Path:
    (tmp_path / "tokenization_model.py").write_text(textwrap.dedent(source))
    if tokenizer_config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return tmp_path


@pytest.mark.parametrize("source, tokenizer_config, prefix, suffix", [
    (GLM_V1, {}, [], [TokenRef("gmask_token"), TokenRef("bos_token")]),
    (GLM_V2, {}, [TokenRef("[gMASK]", literal=True), TokenRef("sop", literal=True)], []),
    (LLAMA_STYLE, {}, [TokenRef("bos_token_id")], []),                        # __init__'s defaults
    (LLAMA_STYLE, {"add_bos_token": False, "add_eos_token": True}, [], [TokenRef("eos_token_id")]),
])
def test_the_layout_is_read_from_the_tokenizers_own_method(tmp_path, source, tokenizer_config, prefix, suffix):
    layout = special_layout(_folder(tmp_path, source), tokenizer_config)
    assert (layout.prefix, layout.suffix) == (prefix, suffix)
    line = next(n for n, text in enumerate(textwrap.dedent(source).splitlines(), 1) if "def build_inputs" in text)
    assert layout.where == f"tokenization_model.py:{line}"


def test_a_method_it_cannot_follow_gives_no_layout(tmp_path):
    assert special_layout(_folder(tmp_path, LOOPING), {}) is None
    assert special_layout(tmp_path / "nothing-here", {}) is None


def test_a_glm_v1_prompt_ends_with_its_mask_and_start_tokens(tmp_path):
    config = {"bos_token_id": 130004, "eos_token_id": 130005, "mask_token_id": 130000, "gmask_token_id": 130001,
              "pad_token_id": 3}
    tokens = prompt_tokens(config, _folder(tmp_path, GLM_V1))
    assert (tokens.prefix, tokens.suffix) == ([], [130001, 130004])
    assert "placed by tokenization_model.py" in tokens.evidence[0] and "gmask_token_id" in tokens.evidence[0]
    moved = tiny_special_ids(config, 256, tokens)
    # the ids the config names move below the tiny vocabulary, and the suffix moves with them
    assert tokens.suffix == [moved["gmask_token_id"], moved["bos_token_id"]]
    assert len(tokens.evidence) == 2 and all("moved to" in line for line in tokens.evidence)


def test_without_ids_for_its_tokens_the_config_rules_hold(tmp_path):
    # The tokenizer names `sop`, which neither the config nor tokenizer_config.json gives an id: the config's bos
    # rule applies as it did before the tokenizer was read.
    tokens = prompt_tokens({"bos_token_id": 1, "eos_token_id": 2}, _folder(tmp_path, GLM_V2))
    assert (tokens.prefix, tokens.suffix) == ([1], [])


def test_the_hf_harness_puts_the_suffix_last(tmp_path):
    from graphmode.agent.targets.hf import resolve, write_target
    from graphmode.runners.harness import load_harness

    folder = tmp_path / "glm"
    shutil.copytree(Path(__file__).parent / "fixtures" / "hub_glm_style", folder)
    (folder / "tokenization_glmstyle.py").write_text(textwrap.dedent(GLM_V1))
    config = json.loads((folder / "config.json").read_text())
    config["bos_token_id"] = config["sop_token_id"]  # GLM v1 calls its start token bos
    (folder / "config.json").write_text(json.dumps(config))
    target = resolve(str(folder), True, 64)
    assert target.prompt_prefix == [] and len(target.prompt_suffix) == 2
    prompt = load_harness(write_target(target, folder, tmp_path / "target", 64)).make_prompt()[0].tolist()
    assert prompt[-2:] == target.prompt_suffix
    assert not set(prompt[:-2]) & set(target.special_ids)
