"""The special tokens an `--hf` target's prompts carry, read from the model folder's own files (no tokenizer runs).

A random prompt is not what the model was trained on, and some models refuse one: ChatGLM finds its `[gMASK]` id in
every prompt, Llama-style models expect `<s>` first. The evidence, in this order, and only these fields:

- `config.json` and `generation_config.json`: every `*_token_id` / `*_token_ids` field names a special id (kept out
  of the random ids); `gmask_token_id` and `sop_token_id` (ChatGLM's config) make the GLM prefix `[gMASK] sop`;
  `bos_token_id` makes a `<s>` prefix;
- `tokenizer_config.json`: `add_bos_token` says whether the tokenizer prepends `<s>` (false wins over the config's
  bos id; without it, bos is prepended unless it equals the eos id, GPT-2's one `<|endoftext|>`), and its
  `added_tokens_decoder` marks ids special; where the config has no gmask field, the tokens named `[gMASK]` and
  `sop` / `<sop>` there give the GLM prefix (GLM-4 keeps them only in the tokenizer).

With --tiny the vocabulary shrinks: special ids the config gives beyond it are moved to distinct ids at its top, and
the config fields take the moved ids, so the model's own checks (`input_ids == config.gmask_token_id`) still hold.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

GLM_PREFIX_TOKENS = (("gmask_token_id", ("[gMASK]",)), ("sop_token_id", ("sop", "<sop>")))


@dataclass
class PromptTokens:
    prefix: list[int] = field(default_factory=list)    # the ids every prompt starts with
    special: list[int] = field(default_factory=list)   # ids the random part never draws
    evidence: list[str] = field(default_factory=list)  # where each prefix id was read, for the documents


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ids(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def special_fields(config: dict) -> dict[str, list[int]]:
    """Every `*_token_id(s)` field of a config with the ids it holds."""
    return {key: _ids(value) for key, value in config.items()
            if (key.endswith("_token_id") or key.endswith("_token_ids")) and _ids(value)}


def prompt_tokens(config: dict, folder: Path | None) -> PromptTokens:
    """The prefix and special ids for prompts of the model `config` describes (config.json's values, after any
    --tiny overrides), with the folder's generation_config.json and tokenizer_config.json where it has them."""
    generation = _read_json(folder / "generation_config.json") if folder else {}
    tokenizer = _read_json(folder / "tokenizer_config.json") if folder else {}
    fields = {**special_fields(generation), **special_fields(config)}  # the config's own value wins
    added = tokenizer.get("added_tokens_decoder") if isinstance(tokenizer.get("added_tokens_decoder"), dict) else {}
    by_content = {entry.get("content"): int(key) for key, entry in added.items()
                  if isinstance(entry, dict) and key.isdigit()}
    special = {i for ids in fields.values() for i in ids}
    special |= {int(key) for key, entry in added.items() if key.isdigit() and isinstance(entry, dict)
                and entry.get("special")}
    result = PromptTokens(special=sorted(special))
    for name, contents in GLM_PREFIX_TOKENS:  # [gMASK], then sop after it
        if fields.get(name):
            where = "config.json" if name in special_fields(config) else "generation_config.json"
            token, evidence = fields[name][0], f"{name} {fields[name][0]} ({where})"
        else:
            content = next((c for c in contents if c in by_content), None)
            if content is None:
                break
            token, evidence = by_content[content], f"{content} {by_content[content]} (tokenizer_config.json)"
        result.prefix.append(token)
        result.evidence.append(evidence)
    if result.prefix:
        return result
    bos, eos = fields.get("bos_token_id", []), fields.get("eos_token_id", [])
    add_bos = tokenizer.get("add_bos_token")
    if bos and add_bos is not False and (add_bos is True or bos[0] not in eos):
        result.prefix.append(bos[0])
        why = "tokenizer_config.json add_bos_token" if add_bos is True else "bos_token_id"
        result.evidence.append(f"bos {bos[0]} ({why})")
    return result


def tiny_special_ids(config: dict, vocab: int, tokens: PromptTokens) -> dict:
    """For a --tiny vocabulary of `vocab`: overrides moving the config's special ids at or beyond it to distinct ids
    from its top down (one new id per old id, lists kept as lists), so none collapse onto another; `tokens` (read
    from the full-size folder) take the same moves, and its prefix ids that no config field names move too."""
    fields = special_fields(config)
    kept = {i for ids in fields.values() for i in ids if i < vocab} | {i for i in tokens.prefix if i < vocab}
    free = (i for i in range(vocab - 1, -1, -1) if i not in kept)
    moved: dict[int, int] = {}
    for i in [*(i for ids in fields.values() for i in ids), *tokens.prefix]:
        if i >= vocab and i not in moved:
            moved[i] = next(free)
    overrides = {}
    for key, ids in fields.items():
        if any(i in moved for i in ids):
            new = [moved.get(i, i) for i in ids]
            overrides[key] = new if isinstance(config[key], list) else new[0]
    tokens.evidence = [f"{text}, moved to {moved[i]} by --tiny" if i in moved else text
                       for text, i in zip(tokens.evidence, tokens.prefix)]
    tokens.prefix = [moved.get(i, i) for i in tokens.prefix]
    tokens.special = sorted({moved.get(i, i) for i in tokens.special if i < vocab or i in moved})
    return overrides
