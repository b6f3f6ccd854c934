"""Hub remote code (`trust_remote_code`) and research code: targets from GitHub mirrors (issue 23).

A case is `remote==TRANSFORMERS_VERSION:MODEL`, MODEL a key of MODELS below. Each model names the
GitHub mirror of its Hub repository (or the research repository) and the commit it is read at. The
case runs against the transformers release VERSION (the release its code was written for): a copy of
the extracted "site" the transformers family builds (hf.prepare_site) plus the light packages and
stand-ins remote code imports (DEPENDENCIES, SHIMS), so nothing is installed and graphmode itself runs
in the interpreter of the test; the harness puts the site first on sys.path in every worker.

CI has no GitHub access, so the files are read from a cache folder that a one-time step fills:

    cd tests && python -m corpus.remote fill              # git clone from GitHub, then `git show COMMIT:PATH`
    cd tests && python -m corpus.remote fill --mirrors D  # from local bare copies D/OWNER+NAME/repo instead

The cache is GRAPHMODE_REMOTE_CODE_CACHE, by default GRAPHMODE_CORPUS_CACHE/remote-code (or
~/.cache/graphmode-corpus/remote-code). A case whose files are absent is skipped with that command.

The target folder holds the model's Python files, imports between them made local (line numbers
kept), and a harness that drives the model the way its own generation does:

- Hub models (convention "generate"): `prepare_inputs_for_generation` and
  `_update_model_kwargs_for_generation` of the model itself, with a 2-D attention_mask grown by one
  each step and `use_cache=True`, as transformers' greedy loop of that release does. The prompt
  starts with the config's bos_token_id when it names one, or ends with the ids the model's own
  tokenizer ends every prompt with (`RemoteModel.prompt_end`: ChatGLM-6B's `[gMASK] <sop>`).
- research code with no KV cache (convention "whole_sequence"): the whole sequence every step,
  cropped to the block size, as its own `generate` does (greedy instead of sampling).

Tiny configs start from the Hub config.json and shrink it (hidden 64, 2 layers, vocab 256, special
ids below 256, flash attention off); a MoE model keeps one dense and one MoE layer. Every parameter
is set from a seed (corpus_support.init_parameters) and the output projection is never tied.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from . import core, hf
from .core import Case, CaseError, CaseSkipped

PACKAGE = "remote"
CACHE_ENV = "GRAPHMODE_REMOTE_CODE_CACHE"


@dataclass(frozen=True)
class RemoteModel:
    hub: str                    # what it is (the Hub repository, or the research repository)
    mirror: str                 # owner/name of the GitHub repository the files are read from
    commit: str
    folder: str                 # the folder of the mirror that holds the files ("" = its root)
    files: tuple[str, ...]      # the Python files the model needs, copied into the target
    release: str                # the transformers release its code was written for (the case's VERSION)
    tiny: dict = field(default_factory=dict)   # config fields that make it tiny
    convention: str = "generate"
    # "whole_sequence" models: the module, config class and model class (they have no config.json)
    classes: tuple[str, str, str] = ("", "", "")
    # Hub code vendored without its config.json: the Hub config.json's auto_map (the config is then `tiny` alone)
    auto_map: dict | None = None
    # Packages with no build for this machine that the code imports unguarded ({package: "file:line"}): the harness
    # installs graphmode's placeholders for them (for torch_npu, its CPU stand-in of `torch.npu` too), as the
    # harness graphmode writes for `--hf` does; the site's own stand-ins (SHIMS) are found first.
    placeholders: dict = field(default_factory=dict)
    # Config fields whose token ids end every prompt, in this order, where the model's own generation requires
    # them (ChatGLM-6B finds its positions and mask from `[gMASK]` and `<sop>` = bos at the prompt's end, as its
    # tokenizer puts them); the prompt then does not start with bos.
    prompt_end: tuple[str, ...] = ()
    # Whether the Hub folder has a generation_config.json to copy beside config.json (ChatGLM-6B's has none).
    generation_config: bool = True


MODELS: dict[str, RemoteModel] = {
    # MLA (a compressed latent plus a rope key in the cache) and MoE (host-side dispatch: .cpu().numpy()).
    # The Hub files as first committed in this mirror ("Init."); later commits of the mirror edit them.
    "deepseek_v2_lite": RemoteModel(
        hub="deepseek-ai/DeepSeek-V2-Lite",
        mirror="cakeng/CS262_moe", commit="c294b7f71d591b07046c1ed42e80f12d66e03968",
        folder="DeepSeek-V2-Lite", files=("configuration_deepseek.py", "modeling_deepseek.py"),
        release="4.39.3",  # generation_config.json's transformers_version
        tiny={"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": None,
              "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "max_position_embeddings": 64,
              "bos_token_id": 1, "eos_token_id": 2}),
    # ChatGLM lineage: its own tuple cache (sequence-first in older releases), multi-query groups, its own
    # generation hooks (is_first_forward), auto_map to ChatGLMForConditionalGeneration. glm-4-9b-chat's
    # files as this repository's "update package" (更新包) folder keeps them (deleted in its next commit).
    "glm4_9b": RemoteModel(
        hub="THUDM/glm-4-9b-chat",
        mirror="aifunny/Hate-Detection", commit="aea1921dc1840e9f954dd61707b6636f660c4b54",
        folder="chuli/glm4更新包", files=("configuration_chatglm.py", "modeling_chatglm.py"),
        release="4.44.2",  # config.json: transformers_version 4.44.0 (the README asks for >= 4.44.0)
        tiny={"num_layers": 2, "num_hidden_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "kv_channels": 16,
              "num_attention_heads": 4, "multi_query_group_num": 2, "padded_vocab_size": core.VOCAB_SIZE,
              "seq_length": 64, "eos_token_id": [2], "pad_token_id": 0}),
    # Llama-like, but a fused wqkv and its own Cache-API mask (_update_causal_mask, cache_position).
    # The Hub files of internlm2_5-20b-chat as a fine-tune of it carries them (its weights are not used).
    "internlm2_5": RemoteModel(
        hub="internlm/internlm2_5-20b-chat",
        mirror="2001wjh/SeaSageAI_InternLM2_5", commit="1b806b71ce2aa6f8168b041c9571d94d4c1ab2c1",
        folder="model/Seasage_InternLM2_5-20b", files=("configuration_internlm2.py", "modeling_internlm2.py"),
        release="4.41.2",  # config.json says 4.39.3, but the file calls _ignore_causal_mask_sdpa(is_training=) (4.41)
        tiny={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": 2}),
    # Tuple caches of its own (torch.cat), W_pack, NormHead, its own 4-D mask helper.
    # This mirror comments out the xformers import and the torch.backends.cuda.sdp_kernel context around
    # its SDPA call (neither runs in CPU inference); otherwise the Hub files of Baichuan2-7B.
    "baichuan2_7b": RemoteModel(
        hub="baichuan-inc/Baichuan2-7B-Chat",
        mirror="mlpod/Baichuan2-CPU-DEBUG", commit="e4a6ea74600b71c0bcd4f0e982b36dea541a5a3e",
        folder="model", files=("configuration_baichuan.py", "modeling_baichuan.py", "generation_utils.py",
                               "quantizer.py"),
        release="4.33.3",  # the Baichuan2 README pins transformers 4.33 (config.json: 4.29.2)
        tiny={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "max_position_embeddings": 64, "model_max_length": 64, "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": 0}),
    # The Llama-unlike pick of XVERSE / Orion / TeleChat / Yuan2: Bloom lineage with rotary positions, a
    # sequence-first tuple cache (torch.cat on dim 0), einsum/bmm attention, its own bool mask helper.
    # Yuan2's yuan_hf_model.py imports flash_attn unconditionally (no CPU build), so it was not taken.
    "telechat_7b": RemoteModel(
        hub="Tele-AI/telechat-7B",
        mirror="Tele-AI/Telechat", commit="be8af219a41e7db277f2cd354add5b82da616624",
        folder="models/7B", files=("configuration_telechat.py", "modeling_telechat.py", "generation_utils.py"),
        release="4.30.2",  # config.json: transformers_version 4.30.0
        tiny={"hidden_size": 64, "n_head": 4, "n_layer": 2, "ffn_hidden_size": 128, "seq_length": 64,
              "training_seqlen": 64, "flash_attn": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "unk_token_id": 0}),
    # Phi-2's remote code before transformers integrated Phi (MixFormer lineage): InferenceParams, a
    # preallocated kv_cache written at seqlen_offset, einops. Vendored by axolotl from the Hub in "Phi2
    # rewrite" (#1058, which adds gradient-checkpointing hooks only); no config.json, so auto_map from the Hub's.
    "phi2": RemoteModel(
        hub="microsoft/phi-2 (remote code, December 2023)",
        mirror="axolotl-ai-cloud/axolotl", commit="732851f105e40f352861efe65ed1e013e73b8195",
        folder="src/axolotl/models/phi", files=("configuration_phi.py", "modeling_phi.py"),
        release="4.36.2",  # phi-2's config.json of that time: transformers_version 4.35.2
        tiny={"vocab_size": core.VOCAB_SIZE, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4,
              "rotary_dim": 8, "activation_function": "gelu_new", "tie_word_embeddings": False,
              "pad_vocab_size_multiple": 64},
        auto_map={"AutoConfig": "configuration_phi.PhiConfig", "AutoModelForCausalLM": "modeling_phi.PhiForCausalLM"}),
    # Qwen's first remote code (Qwen-7B v1): a [batch, seq, heads, dim] tuple cache grown with torch.cat, and
    # the rotary position counted from that cache's length (`kv_seq_len += layer_past[0].shape[1]`), with a
    # dynamic-NTK alpha and log-n query scale keyed on the lengths. `seq_length` (the length it was trained at,
    # 2048) is cut to 4, so that the 8-token prompt sets an NTK alpha of 3 and the log-n scale differs from 1.
    # The Hub files as this mirror holds them ("update config and streaming generation", 4 August 2023).
    "qwen_7b": RemoteModel(
        hub="Qwen/Qwen-7B-Chat (first release)",
        mirror="undefdev/Qwen-7B-Chat", commit="04df5dd57b94b9ed20498ee42063ea9e164f98b3",
        folder="", files=("configuration_qwen.py", "modeling_qwen.py", "qwen_generation_utils.py"),
        release="4.31.0",  # the README's `pip install transformers==4.31.0`; config.json says 4.31.0
        tiny={"n_embd": 64, "n_head": 4, "kv_channels": 16, "n_layer": 2, "ffn_hidden_size": 256,
              "n_positions": 64, "seq_length": 4, "padded_vocab_size": core.VOCAB_SIZE, "use_flash_attn": False,
              "bf16": False, "fp16": False, "fp32": True, "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": 0}),
    # StableLM "epoch" lineage (stable-code-3b, January 2024): LayerNorm with biases, rotary on a quarter of each
    # head (rope_pct 0.25), transformers 4.36's Cache API (DynamicCache, get_usable_length) in remote code, a
    # flash-attention class beside the eager one. The Hub repository as this mirror holds it, at the Hub's
    # "use correct `base_model_prefix` name" fix (29 January 2024); config.json from the first upload.
    "stable_code_3b": RemoteModel(
        hub="stabilityai/stable-code-3b",
        mirror="Zumwaltboi68/stable-code-3b", commit="7c4583da0a36c56c7bf040864b737a70d45d1f4b",
        folder="", files=("configuration_stablelm_epoch.py", "modeling_stablelm_epoch.py"),
        release="4.36.2",  # config.json: transformers_version 4.36.2
        tiny={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "bos_token_id": 0,
              "eos_token_id": 2}),
    # Written for Ascend (openPangu-Embedded-7B, 2025): `import torch_npu`, `transfer_to_npu` and
    # `torch.npu.get_device_name()` at import, a branch to torch_npu's fused attention on a 910, otherwise
    # transformers 4.53's attention interface, create_causal_mask and LossKwargs. The mirror's first commit
    # ("upload ckpt", the Hub files); its later commits edit the file to run on NVIDIA GPUs.
    "openpangu_embedded_7b": RemoteModel(
        hub="openPangu-Embedded-7B-V1.1 (ascend-tribe, GitCode)",
        mirror="wujing215/OpenPangu7B-on-NVIDIA", commit="1d101f9f211b2f05d35127cec470bf2178f572d8",
        folder="", files=("configuration_openpangu_dense.py", "modeling_openpangu_dense.py"),
        release="4.53.2",  # README and config.json: transformers 4.53.2 (its LossKwargs: 4.47 to 4.53)
        tiny={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": 0},
        placeholders={"torch_npu": "modeling_openpangu_dense.py:34"}),
    # Cross-layer attention (CLA) and QK-norm, with MoE (Hunyuan-Large, November 2024): every second layer has no
    # k/v projections and reuses the previous layer's projected (not yet rotated) keys and values, handed on as the
    # decoder layers' extra output `kv_states`, yet still writes its own DynamicCache slot; RMSNorm on queries and keys
    # after the rotary; a capacity-based top-1 gate (one_hot/einsum dispatch) beside a shared MLP; a dynamic-NTK
    # "alpha" rotary. The official repository's models/ folder, which has no config.json: auto_map from the Hub's.
    "hunyuan_large": RemoteModel(
        hub="tencent/Tencent-Hunyuan-Large (Hunyuan-A52B-Instruct)",
        mirror="Tencent/Tencent-Hunyuan-Large", commit="c8c1ddd51303506f7813bdbddeae9e924980179d",
        folder="models", files=("configuration_hunyuan.py", "modeling_hunyuan.py"),
        release="4.41.2",  # train/requirements.txt and examples/requirements.txt: transformers==4.41.2
        tiny={"vocab_size": core.VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
              "rope_theta": 10000.0, "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
              "use_qk_norm": True, "use_cla": True, "cla_share_factor": 2, "num_experts": 4, "moe_topk": 1,
              "use_mixed_mlp_moe": True, "num_shared_expert": 1, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        auto_map={"AutoConfig": "configuration_hunyuan.HunYuanConfig",
                  "AutoModelForCausalLM": "modeling_hunyuan.HunYuanForCausalLM"}),
    # Hunyuan-A13B (June 2025): the Hunyuan layers above, with QK-norm and GQA but no CLA, behind a second entry file
    # (`hunyuan.py`, which auto_map names, imports the decoder layer from `modeling_hunyuan.py`), per-layer lists in
    # the config (moe_topk, num_shared_expert, moe_intermediate_size) and a capacity-based top-k gate (8 of 64
    # experts on the Hub, 2 of 4 here). The official release's models/ folder as this fork holds it, at the release's
    # own "Quick fix for doc & model" (27 June 2025).
    "hunyuan_a13b": RemoteModel(
        hub="tencent/Hunyuan-A13B-Instruct",
        mirror="tianyu1412/Hunyuan-A13B", commit="9bc56999a098e2ecdce97406abc9a398ff1140e3",
        folder="models", files=("configuration_hunyuan.py", "modeling_hunyuan.py", "hunyuan.py"),
        release="4.41.2",  # config.json: transformers_version 4.41.2
        tiny={"org_vocab_size": core.VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128,
              "moe_intermediate_size": [32, 32], "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "attention_head_dim": 16, "max_position_embeddings": 64,
              "num_experts": 4, "moe_topk": [2, 2], "num_shared_expert": [1, 1], "attention_dropout": 0.0,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "pad_id": 0, "eod_token_id": 3,
              "sep_token_id": 4}),
    # Phi-3's remote code (April 2024), LongRoPE ("su") scaling: the rotary recomputes its frequencies every call from
    # short or long factors, picked by `if torch.max(position_ids) + 1 > original_max_position_embeddings` (a branch on
    # a tensor value that flips mid-generation here: the original length is cut to 32, so Decode crosses it at its
    # 25th token), and scales cos/sin by a factor from the two lengths; fused qkv_proj and gate_up_proj. The copy
    # InternVL vendors for its Phi-3 chat models (imports reformatted, the flash-attn import in a try/except), at
    # the commit that added it; no config.json: auto_map from the Hub's, the 128k model's "su" scaling in small.
    "phi3_mini_128k": RemoteModel(
        hub="microsoft/Phi-3-mini-128k-instruct (remote code, as InternVL vendors it)",
        mirror="OpenGVLab/InternVL", commit="e81aac364c01dc33617a7d446a76fcda8f8a577f",
        folder="internvl_chat/internvl/model/phi3", files=("configuration_phi3.py", "modeling_phi3.py"),
        release="4.37.2",  # InternVL's internvl_chat/pyproject.toml pins transformers==4.37.2 for this copy
        tiny={"vocab_size": core.VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
              "original_max_position_embeddings": 32, "sliding_window": None,
              "rope_scaling": {"type": "su", "short_factor": [1.0, 1.0, 1.0, 1.01, 1.02, 1.05, 1.1, 1.2],
                               "long_factor": [1.0, 1.1, 1.3, 1.8, 2.6, 4.0, 6.5, 10.0]},
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        auto_map={"AutoConfig": "configuration_phi3.Phi3Config",
                  "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"}),
    # Ling-lite (Bailing MoE, 2025): a fused query_key_value, DeepSeek-style MoE with shared experts and a host-side
    # dispatch (`tokens_per_expert.cpu().numpy()`), and `norm_head`: on its first eval call the LM head normalises
    # its own weight in place (`self.lm_head.weight.data = ...`) and sets `self.norm_head = False`, state changed
    # by forward. The official repository's models/ folder (no config.json: auto_map from the Hub's), at the last
    # commit that touched it ("update modeling code", 7 April 2025).
    "ling_lite": RemoteModel(
        hub="inclusionAI/Ling-lite",
        mirror="inclusionAI/Ling", commit="ceb347601d43d1b102fdb10858e2fb384d27bf80",
        folder="models", files=("configuration_bailing_moe.py", "modeling_bailing_moe.py"),
        # the file falls back to DynamicCache.get_max_cache_shape (4.46 on) where get_max_length is gone, and still
        # reads seen_tokens and get_usable_length
        release="4.46.3",
        tiny={"vocab_size": core.VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128,
              "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_experts": 4, "num_shared_experts": 1, "num_experts_per_tok": 2,
              "first_k_dense_replace": 1, "norm_head": True, "norm_topk_prob": True, "use_bias": False,
              "use_qkv_bias": False, "embedding_dropout": 0.0, "attention_dropout": 0.0, "output_dropout": 0.0,
              "max_position_embeddings": 64, "rope_theta": 600000.0, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        auto_map={"AutoConfig": "configuration_bailing_moe.BailingMoeConfig",
                  "AutoModelForCausalLM": "modeling_bailing_moe.BailingMoeForCausalLM"}),
    # 2-D positions (ChatGLM-6B, GLM v1): each head's rotary is split in two, one half rotated by the position (the
    # `[gMASK]` position for generated tokens), the other by the block position (0 in the prompt, 1, 2, ... after it);
    # a sequence-first tuple cache grown with torch.cat in the module-level `attention_fn`; a rotary cos/sin cache
    # grown on demand; the mask and positions built from `input_ids.tolist()` and `seq.index(bos)`; half-precision
    # parameters (params_dtype = torch.half). Its prompts end `[gMASK] <sop>` (sop = bos), as its tokenizer ends them.
    # The Hub files as this mirror holds them at "Fix position ids in 1d position encoding" (27 April 2023).
    "chatglm_6b": RemoteModel(
        hub="THUDM/chatglm-6b",
        mirror="greensheng/chatglm-6b", commit="a8ede826cf1b62bd3c78bdfb3625c7c5d2048fbd",
        folder="", files=("configuration_chatglm.py", "modeling_chatglm.py"),
        release="4.27.1",  # the ChatGLM-6B README and requirements pin transformers==4.27.1 (config.json: 4.23.1)
        tiny={"hidden_size": 64, "num_attention_heads": 4, "num_layers": 2, "inner_hidden_size": 128,
              "max_sequence_length": 64, "position_encoding_2d": True, "mask_token_id": 250,
              "gmask_token_id": 251, "bos_token_id": 252, "eos_token_id": 253, "pad_token_id": 3},
        prompt_end=("gmask_token_id", "bos_token_id"), generation_config=False),
    # A research codebase with no KV cache: the whole sequence every step.
    "nanogpt": RemoteModel(
        hub="karpathy/nanoGPT",
        mirror="karpathy/nanoGPT", commit="3adf61e154c3fe3fca428ad6bc3818b27a3b8291",
        folder="", files=("model.py",), release="4.39.3",  # imports no transformers at module level
        tiny={"block_size": 64, "vocab_size": core.VOCAB_SIZE, "n_layer": 2, "n_head": 4, "n_embd": 64,
              "dropout": 0.0, "bias": True},
        convention="whole_sequence", classes=("model", "GPTConfig", "GPT")),
}

# Always: an output projection of its own (see hf.ALWAYS), and the tiny vocabulary.
ALWAYS = {"tie_word_embeddings": False, "vocab_size": core.VOCAB_SIZE}
# Hub config.json fields that describe the checkpoint, not the model.
_NOT_CONFIG = ("architectures", "auto_map", "transformers_version", "torch_dtype", "_name_or_path",
               "quantization_config")


# -- the cache of mirrored files -------------------------------------------------------------------
def cache_root() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    corpus = os.environ.get("GRAPHMODE_CORPUS_CACHE")
    base = Path(corpus).expanduser() if corpus else Path.home() / ".cache" / "graphmode-corpus"
    return (base / "remote-code").resolve()


def cached_folder(model: RemoteModel, root: Path | None = None) -> Path:
    """Where the model's mirrored files live in the cache: ROOT/OWNER+NAME/COMMIT/FOLDER."""
    return (root or cache_root()) / model.mirror.replace("/", "+") / model.commit / model.folder


def _wanted(model: RemoteModel) -> list[str]:
    hub_folder = model.convention == "generate" and model.auto_map is None
    hub_files = ["config.json", "generation_config.json"] if model.generation_config else ["config.json"]
    return list(model.files) + (hub_files if hub_folder else [])


def fill(root: Path, mirrors: Path | None = None, names: list[str] | None = None) -> list[str]:
    """Copies every model's files into the cache, from local bare copies (`mirrors`/OWNER+NAME/repo)
    or from a clone of the GitHub repository. Returns one line per model."""
    said = []
    for name, model in MODELS.items():
        if names and name not in names:
            continue
        dest = cached_folder(model, root)
        with tempfile.TemporaryDirectory() as scratch:
            git_dir = mirrors / model.mirror.replace("/", "+") / "repo" if mirrors else None
            if git_dir is None or not git_dir.is_dir():
                git_dir = Path(scratch) / "repo.git"
                _git("clone", "--bare", "--filter=blob:none", f"https://github.com/{model.mirror}.git", str(git_dir))
            for path in _wanted(model):
                in_mirror = "/".join(filter(None, [model.folder, path]))
                text = _git("--git-dir", str(git_dir), "show", f"{model.commit}:{in_mirror}")
                (dest / path).parent.mkdir(parents=True, exist_ok=True)
                (dest / path).write_text(text, encoding="utf-8")
        said.append(f"{name}: {model.mirror}@{model.commit[:12]} -> {dest}")
    return said


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != 0:
        raise CaseError(f"`git {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


# -- the family interface --------------------------------------------------------------------------
# Light pure-Python packages remote code imports at module level (InternLM2's and Phi-2's einops), and
# stand-ins for CUDA-only ones (tests/corpus/shims/): TeleChat builds a flash-attention module whatever
# its config says.
DEPENDENCIES = ("einops==0.8.0",)
SHIMS = ("flash_attn",)


def prepare_site(version: str, root: Path) -> Path:
    """root/remote-transformers-VERSION/site: a copy of the transformers family's site of the release the
    code needs, plus DEPENDENCIES the environment lacks and SHIMS. A copy, so that the stand-ins never
    reach the transformers cases (a findable flash_attn changes what transformers itself imports)."""
    base = root / f"remote-transformers-{version}"
    site = base / "site"
    manifest = site / "corpus-remote-site.json"
    if manifest.is_file():
        core._copy_shims(site, SHIMS)
        return site
    if base.exists():
        shutil.rmtree(base)  # a build that stopped half-way
    shutil.copytree(hf.prepare_site(version, root), site)
    pinned: dict[str, str] = {}
    for dependency in DEPENDENCIES:
        if core.satisfied_here(Requirement(dependency)):
            continue
        wheel = core.pip_download(dependency, base / "wheels")
        core.extract(wheel, site)
        pinned[Requirement(dependency).name] = wheel.name
    core._copy_shims(site, SHIMS)
    manifest.write_text(json.dumps({"transformers": version, "pinned": pinned, "shims": list(SHIMS)}, indent=2))
    return site


def model_of(case: Case) -> RemoteModel:
    model = MODELS.get(case.model)
    if model is None:
        raise CaseError(f"no remote-code model {case.model!r} (known: {', '.join(MODELS)})")
    return model


def tiny_config(model: RemoteModel, folder: Path) -> dict:
    """The Hub config.json with the checkpoint-only fields dropped and the tiny sizes put in."""
    if model.convention == "whole_sequence" or model.auto_map is not None:
        return dict(model.tiny)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config = {key: value for key, value in config.items() if key not in _NOT_CONFIG}
    return {**config, **model.tiny, **ALWAYS}


def entry_classes(model: RemoteModel, folder: Path) -> tuple[str, str]:
    """("module.ConfigClass", "module.ModelClass") from config.json's auto_map: the causal LM, else the
    AutoModel* entry (GLM-style repositories map their LM-head class there)."""
    auto_map = model.auto_map or json.loads((folder / "config.json").read_text(encoding="utf-8")).get("auto_map") or {}
    config = auto_map.get("AutoConfig")
    causal = next((auto_map[key] for key in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModel")
                   if key in auto_map), None)
    if not config or not causal:
        raise CaseError(f"{folder / 'config.json'} names no AutoConfig and model class in auto_map: {auto_map}")
    return config, causal


# The "generate" convention (Hub remote code); the family's BODY like the other families'.
BODY = '''
import inspect  # noqa: E402

from {config_module} import {config_class}  # noqa: E402
from {model_module} import {model_class}  # noqa: E402

CONFIG = {config_kwargs!r}


def build_model() -> torch.nn.Module:
    """Seeded, every parameter set explicitly (tiny random models need it), in eval mode."""
    torch.manual_seed(0)
    model = {model_class}({config_class}.from_dict(dict(CONFIG)))
    return corpus_support.init_parameters(model)


{make_prompt}

def _step(model, input_ids, model_kwargs):
    """One step of the model's own generation loop: its prepare_inputs_for_generation, the call, its
    _update_model_kwargs_for_generation (which grows the attention mask and keeps the cache)."""
    inputs = model.prepare_inputs_for_generation(input_ids, **model_kwargs)
    out = model(**inputs, return_dict=True)
    update = model._update_model_kwargs_for_generation
    extra = {{"model_inputs": inputs}} if "model_inputs" in inspect.signature(update).parameters else {{}}
    model_kwargs = update(out, model_kwargs, is_encoder_decoder=False, **extra)
    return out.logits[:, -1, :], (input_ids, model_kwargs)


def prefill(model, tokens):
    model_kwargs = {{"attention_mask": torch.ones_like(tokens), "use_cache": True}}
    # Releases whose generate() counts cache_position (4.41 on) start it here, as generate() does (4.41 to 4.46
    # from the tokens, 4.47 on from their length and device).
    initial = getattr(model, "_get_initial_cache_position", None)
    takes = list(inspect.signature(initial).parameters) if initial is not None else []
    if takes == ["input_ids", "model_kwargs"]:
        model_kwargs = initial(tokens, model_kwargs)
    elif takes == ["seq_length", "device", "model_kwargs"]:
        model_kwargs = initial(tokens.shape[1], tokens.device, model_kwargs)
    return _step(model, tokens, model_kwargs)


def decode(model, token, state):
    input_ids, model_kwargs = state
    return _step(model, torch.cat([input_ids, token], dim=-1), model_kwargs)
'''

BOS_FIRST = '''def make_prompt() -> torch.Tensor:
    """Random tokens, the first one the config's bos_token_id where it names one (as a tokenizer puts it)."""
    tokens = corpus_support.make_prompt(VOCAB_SIZE, PROMPT_LEN)
    if CONFIG.get("bos_token_id") is not None:
        tokens[:, 0] = CONFIG["bos_token_id"]
    return tokens
'''

PROMPT_END = '''PROMPT_END = {fields!r}


def make_prompt() -> torch.Tensor:
    """Random tokens ending with the ids of the config fields PROMPT_END (as the model's tokenizer ends a prompt)."""
    tokens = corpus_support.make_prompt(VOCAB_SIZE, PROMPT_LEN)
    tokens[:, -len(PROMPT_END):] = torch.tensor([CONFIG[name] for name in PROMPT_END])
    return tokens
'''

# Before the model's modules are imported: placeholders for packages this machine has no build of.
PLACEHOLDERS = '''
from graphmode.runners import optional_imports  # noqa: E402

optional_imports.install({placeholders!r})
'''

WHOLE_SEQUENCE_BODY = '''
from {module} import {config_class}, {model_class}  # noqa: E402

CONFIG = {config_kwargs!r}


def build_model() -> torch.nn.Module:
    """Seeded, every parameter set explicitly (tiny random models need it), in eval mode."""
    torch.manual_seed(0)
    model = {model_class}({config_class}(**CONFIG))
    # An output projection of its own (hf.ALWAYS's tie_word_embeddings=False; this config has no such
    # field): tied to the input embedding, a tiny random model repeats its last token forever.
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    return corpus_support.init_parameters(model)


def _logits(model, tokens):
    """Its own generate's step: the sequence cropped to the block size, the last position's logits."""
    block = model.config.block_size
    logits, _ = model(tokens if tokens.size(1) <= block else tokens[:, -block:])
    return logits[:, -1, :]


def prefill(model, tokens):
    return _logits(model, tokens), tokens


def decode(model, token, state):
    tokens = torch.cat([state, token], dim=1)
    return _logits(model, tokens), tokens
'''


def check_inputs(case: Case) -> None:
    """CaseSkipped when the model's mirrored files are not in the cache (CI has no GitHub access)."""
    model = model_of(case)
    folder = cached_folder(model)
    missing = [path for path in _wanted(model) if not (folder / path).is_file()]
    if missing:
        raise CaseSkipped(f"{case.id}: {', '.join(missing)} of {model.mirror}@{model.commit[:12]} not in {folder}; "
                          f"fill the cache once (needs GitHub): cd tests && python -m corpus.remote fill")


def build_target(case: Case, site: Path, dest: Path) -> Path:
    check_inputs(case)
    model = model_of(case)
    folder = cached_folder(model)
    target = core.new_target(case, dest)
    modules = {Path(path).stem for path in model.files}
    for path in model.files:
        text = (folder / path).read_text(encoding="utf-8")
        # As a package `hub`: relative imports made absolute, then pointed at the target's flat copies.
        local = {f"hub.{module}": module for module in modules}
        (target / path).write_text(core.localize(text, f"hub.{Path(path).stem}", local), encoding="utf-8")
    config = tiny_config(model, folder)
    if model.convention == "whole_sequence":
        module, config_class, model_class = model.classes
        body = WHOLE_SEQUENCE_BODY.format(module=module, config_class=config_class, model_class=model_class,
                                          config_kwargs=config)
        how = "the whole sequence every step, cropped to the block size (its own generate's way), greedy"
    else:
        (config_module, config_class), (model_module, model_class) = (
            entry.rsplit(".", 1) for entry in entry_classes(model, folder))
        make_prompt = PROMPT_END.format(fields=model.prompt_end) if model.prompt_end else BOS_FIRST
        body = BODY.format(config_module=config_module, config_class=config_class,
                           model_module=model_module, model_class=model_class, config_kwargs=config,
                           make_prompt=make_prompt)
        how = ("its own prepare_inputs_for_generation and _update_model_kwargs_for_generation, a growing\n"
               "attention_mask, use_cache=True (transformers' greedy loop of that release)")
    description = (f"{model.hub} ({model.mirror}@{model.commit}, {model.folder or 'the root'}), under "
                   f"transformers=={case.version}.\nThe model with a tiny random config, driven as {how}.")
    if model.placeholders:
        body = PLACEHOLDERS.format(placeholders=model.placeholders) + body
    text = core.harness_text(case, family_name="remote", site=site, sources=list(model.files),
                             description=description, body=body, top_modules=("transformers",))
    if model.convention != "whole_sequence":
        text = _own_prompt(text)
    (target / "harness.py").write_text(text, encoding="utf-8")
    return target


def _own_prompt(harness: str) -> str:
    """The harness without the epilogue's make_prompt: the generate convention defines its own (bos
    first), which the epilogue's, defined after it, would replace."""
    epilogue_prompt = core.EPILOGUE.split("def generate")[0]
    if epilogue_prompt.strip() not in harness:
        raise CaseError("the harness epilogue no longer starts with make_prompt; update remote._own_prompt")
    head, _, tail = harness.rpartition(epilogue_prompt)
    return head + "\n\n" + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fill the remote-code cache of the corpus tests from GitHub.")
    parser.add_argument("command", choices=["fill"])
    parser.add_argument("--mirrors", type=Path, help="local bare copies, MIRRORS/OWNER+NAME/repo (else git clone)")
    parser.add_argument("--cache", type=Path, help=f"the cache folder (default: ${CACHE_ENV} or its default)")
    parser.add_argument("models", nargs="*", help=f"only these (default all: {', '.join(MODELS)})")
    args = parser.parse_intermixed_args(argv)
    for line in fill(args.cache or cache_root(), args.mirrors, args.models):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
