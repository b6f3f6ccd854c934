"""The special tokens an `--hf` target's prompts carry, read from the model folder's own files (no tokenizer runs).

A random prompt is not what the model was trained on, and some models refuse one: ChatGLM finds its `[gMASK]` id in
every prompt, Llama-style models expect `<s>` first. The evidence, in this order, and only these fields:

- `config.json` and `generation_config.json`: every `*_token_id` / `*_token_ids` field names a special id (kept out
  of the random ids); `gmask_token_id` and `sop_token_id` (ChatGLM's config) make the GLM prefix `[gMASK] sop`;
  `bos_token_id` makes a `<s>` prefix;
- the folder's own `tokenization_*.py`, where its `build_inputs_with_special_tokens` can be followed
  (agent.targets.tokenizer_layout): the tokens it puts before and after the text, each found by the name the code
  gives it (`self.gmask_token` -> the config's `gmask_token_id`) or the text it looks up (`sop` -> the tokenizer's
  added token, else `sop_token_id`). Where it is read, it wins over the prefix rules around it: ChatGLM-6B ends
  its prompts with `[gMASK] <sop>`, where ChatGLM2/3 begin with them;
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

from graphmode.agent.targets.tokenizer_layout import TokenRef, special_layout

GLM_PREFIX_TOKENS = (("gmask_token_id", ("[gMASK]",)), ("sop_token_id", ("sop", "<sop>")))


@dataclass
class PromptTokens:
    prefix: list[int] = field(default_factory=list)    # the ids every prompt starts with
    special: list[int] = field(default_factory=list)   # ids the random part never draws
    evidence: list[str] = field(default_factory=list)  # where each prefix (then suffix) id was read, for the documents
    suffix: list[int] = field(default_factory=list)    # the ids every prompt ends with (GLM v1: [gMASK] <sop>)


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
    added = _added_tokens(tokenizer)
    by_content = {entry.get("content"): int(key) for key, entry in added.items()}
    result = PromptTokens(special=_special_ids(fields, added))
    if folder and _laid_out_by_tokenizer(result, folder, tokenizer, fields, by_content, config):
        return result
    _glm_prefix(result, fields, by_content, config)
    if not result.prefix:
        _bos_prefix(result, fields, tokenizer.get("add_bos_token"))
    return result


def _added_tokens(tokenizer: dict) -> dict[str, dict]:
    """tokenizer_config.json's added tokens, id (as written, a string of digits) -> its entry; malformed ones left
    out."""
    added = tokenizer.get("added_tokens_decoder")
    if not isinstance(added, dict):
        return {}
    return {key: entry for key, entry in added.items() if key.isdigit() and isinstance(entry, dict)}


def _special_ids(fields: dict[str, list[int]], added: dict[str, dict]) -> list[int]:
    """The ids a prompt's random part never draws: every special field's, and the added tokens marked special."""
    special = {i for ids in fields.values() for i in ids}
    special |= {int(key) for key, entry in added.items() if entry.get("special")}
    return sorted(special)


def _glm_prefix(result: PromptTokens, fields: dict[str, list[int]], by_content: dict[str, int], config: dict) -> None:
    """GLM's prompt prefix: [gMASK], then sop after it, each from its config field or its added token; it stops at
    the first one the model has neither of."""
    for name, contents in GLM_PREFIX_TOKENS:
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


def _bos_prefix(result: PromptTokens, fields: dict[str, list[int]], add_bos: object) -> None:
    """The bos token as the prefix: when the tokenizer says it adds one, or, unless it says it does not, when bos
    is not also the eos token."""
    bos, eos = fields.get("bos_token_id", []), fields.get("eos_token_id", [])
    if bos and add_bos is not False and (add_bos is True or bos[0] not in eos):
        result.prefix.append(bos[0])
        why = "tokenizer_config.json add_bos_token" if add_bos is True else "bos_token_id"
        result.evidence.append(f"bos {bos[0]} ({why})")


def _laid_out_by_tokenizer(result: PromptTokens, folder: Path, tokenizer: dict, fields: dict[str, list[int]],
                           by_content: dict[str, int], config: dict) -> bool:
    """The prefix and suffix the folder's own tokenizer code puts around a prompt (tokenizer_layout), where it has
    one and every token it names has an id in the config or the tokenizer's added tokens."""
    layout = special_layout(folder, tokenizer)
    if layout is None or not (layout.prefix or layout.suffix):
        return False
    found: list[tuple[int, str]] = []
    for ref in [*layout.prefix, *layout.suffix]:
        token = _token_id(ref, fields, by_content)
        if token is None:
            return False
        where = f"config.json {token[1]}" if token[1] in special_fields(config) else token[1]
        found.append((token[0], f"{getattr(ref, 'name', ref)} {token[0]} ({where}; placed by {layout.where})"))
    result.prefix = [i for i, _ in found[:len(layout.prefix)]]
    result.suffix = [i for i, _ in found[len(layout.prefix):]]
    result.evidence = [text for _, text in found]
    result.special = sorted({*result.special, *result.prefix, *result.suffix})
    return True


def _token_id(ref: TokenRef | int, fields: dict[str, list[int]], by_content: dict[str, int]) -> tuple[int, str] | None:
    """(id, where it was read) for a token the tokenizer's code names: an id written in it, an attribute
    (`gmask_token`, `bos_token_id`: the config's `*_token_id` field of that name), or a literal it looks up (the
    tokenizer's added token of that text, else GLM's `[gMASK]` / `sop` fields)."""
    if isinstance(ref, int):
        return ref, "the tokenizer's code"
    if not ref.literal:
        key = ref.name if ref.name.endswith("_id") else f"{ref.name}_id"
        return (fields[key][0], key) if fields.get(key) else None
    if ref.name in by_content:
        return by_content[ref.name], "tokenizer_config.json"
    key = next((name for name, contents in GLM_PREFIX_TOKENS if ref.name in contents), None)
    return (fields[key][0], key) if key and fields.get(key) else None


def tiny_special_ids(config: dict, vocab: int, tokens: PromptTokens) -> dict:
    """For a --tiny vocabulary of `vocab`: overrides moving the config's special ids at or beyond it to distinct ids
    from its top down (one new id per old id, lists kept as lists), so none collapse onto another; `tokens` (read
    from the full-size folder) take the same moves, and its prefix ids that no config field names move too."""
    fields = special_fields(config)
    moved = _moved_ids([*(i for ids in fields.values() for i in ids), *tokens.prefix, *tokens.suffix], vocab)
    overrides = {}
    for key, ids in fields.items():
        if any(i in moved for i in ids):
            new = [moved.get(i, i) for i in ids]
            overrides[key] = new if isinstance(config[key], list) else new[0]
    _move_tokens(tokens, moved, vocab)
    return overrides


def _moved_ids(ids: list[int], vocab: int) -> dict[int, int]:
    """Each id at or beyond `vocab` -> a distinct free id, from the vocabulary's top down (skipping the ids kept)."""
    kept = {i for i in ids if i < vocab}
    free = (i for i in range(vocab - 1, -1, -1) if i not in kept)
    moved: dict[int, int] = {}
    for i in ids:
        if i >= vocab and i not in moved:
            moved[i] = next(free)
    return moved


def _move_tokens(tokens: PromptTokens, moved: dict[int, int], vocab: int) -> None:
    """The prompt's prefix, suffix and special ids, and the evidence for them, after the moves."""
    tokens.evidence = [f"{text}, moved to {moved[i]} by --tiny" if i in moved else text
                       for text, i in zip(tokens.evidence, [*tokens.prefix, *tokens.suffix])]
    tokens.prefix = [moved.get(i, i) for i in tokens.prefix]
    tokens.suffix = [moved.get(i, i) for i in tokens.suffix]
    tokens.special = sorted({moved.get(i, i) for i in tokens.special if i < vocab or i in moved})
