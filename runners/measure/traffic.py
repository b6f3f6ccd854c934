"""An analytic estimate of the bytes one Decode step moves per layer of a Llama-like model, from its config.

No torch here: the report side calls it again with the sizes a worker recorded (`Sizes.to_dict`) and the fusions
the adaptation applied. The method is the one runners/measure/decode_graph.py measures on a captured graph, "one op =
one kernel": every step of a layer reads its inputs whole and writes its output whole, and the next step reads that
output back. `layer_steps` spells the chain out, one Step per op, each saying what it writes, what it reads, and
which fusion (a codemod NAME) folds it away. Fusing ops leaves the weights and the KV cache as they were; what it
saves is the round trips of the intermediates between the ops it joins, and their launches. At batch 1 those are
small beside the weights (a vector per token against a matrix per projection), which is why Decode is bound by
reading the weights.

Left out: caches of any level, Inductor's own fusion within a kernel, the rotary tables and the mask (read once per
step, and small), the embedding lookup and the output head (not per layer).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

FUSIONS = ("merged_projections", "fused_rms_norm", "fused_attention")

# The usual spellings of each size, Hugging Face first, then Meta's, GPT-2's, others'.
SPELLINGS = {
    "hidden": ("hidden_size", "dim", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_kv_head"),
    "head_dim": ("head_dim",),
    "intermediate": ("intermediate_size", "hidden_dim", "ffn_hidden_size", "n_inner", "ffn_dim"),
    "layers": ("num_hidden_layers", "n_layers", "n_layer", "num_layers"),
    "max_seq_len": ("max_position_embeddings", "max_seq_len", "n_positions", "max_sequence_length"),
    "dtype": ("torch_dtype", "dtype"),
}
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "float64": 8, "double": 8, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}


def dtype_bytes(dtype: Any, default: int = 4) -> int:
    """Bytes per element of a dtype given as `torch.float16`, "float16", "fp16" or "bf16"; `default` if unknown."""
    if dtype is None:
        return default
    return DTYPE_BYTES.get(str(dtype).removeprefix("torch.").lower(), default)


@dataclass(frozen=True)
class Sizes:
    """The sizes of a Llama-like layer the estimate needs, read from a config."""
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    max_seq_len: int | None = None
    dtype_bytes: int = 4

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Sizes":
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


def _read(config: Any, names: Iterable[str]) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return None


def read_config(config: Any) -> Sizes | None:
    """The sizes from a config dict, a Hugging Face config, or a ModelArgs-like object or dataclass; None when it
    lacks the hidden size, the heads, the feed-forward size or the layers (not Llama-like, or not a config)."""
    if config is None:
        return None
    hidden, heads = _read(config, SPELLINGS["hidden"]), _read(config, SPELLINGS["heads"])
    intermediate, layers = _read(config, SPELLINGS["intermediate"]), _read(config, SPELLINGS["layers"])
    if not all(isinstance(value, int) and value > 0 for value in (hidden, heads, intermediate, layers)):
        return None
    kv_heads = _read(config, SPELLINGS["kv_heads"]) or heads
    head_dim = _read(config, SPELLINGS["head_dim"]) or hidden // heads
    return Sizes(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
                 layers=layers, max_seq_len=_read(config, SPELLINGS["max_seq_len"]),
                 dtype_bytes=dtype_bytes(_read(config, SPELLINGS["dtype"])))


@dataclass
class Step:
    """One op of a layer's Decode step, in elements (not bytes)."""
    op: str
    writes: str                     # the tensor it writes
    written: int                    # its elements
    reads: dict[str, int]           # intermediates it reads back: tensor -> elements
    weights: int = 0                # weight elements it reads
    kv_read: int = 0                # KV-cache elements it reads
    kv_written: int = 0             # KV-cache elements it writes (this step's K and V)
    fused_by: str | None = None     # the fusion that folds this op into its neighbour (its output is never written)
    notes: list[str] = field(default_factory=list)


def _rms_norm(name: str, source: str, hidden: int, rows: int, fusions: set[str]) -> list[Step]:
    if "fused_rms_norm" in fusions:
        return [Step(f"{name}: rms_norm", f"{name}_out", rows * hidden, {source: rows * hidden}, weights=hidden)]
    # The hand-written chain: x*x, mean, rsqrt, x*r, *weight. (float()/type_as() are no-ops in fp32 and extra
    # round trips in fp16; the chain leaves them out, so the saving it shows is the least a fusion gives.)
    fused = "fused_rms_norm"
    return [
        Step(f"{name}: pow", f"{name}_sq", rows * hidden, {source: rows * hidden}, fused_by=fused),
        Step(f"{name}: mean", f"{name}_ms", rows, {f"{name}_sq": rows * hidden}, fused_by=fused),
        Step(f"{name}: rsqrt", f"{name}_r", rows, {f"{name}_ms": rows}, fused_by=fused),
        Step(f"{name}: mul", f"{name}_x", rows * hidden, {source: rows * hidden, f"{name}_r": rows}, fused_by=fused),
        Step(f"{name}: mul weight", f"{name}_out", rows * hidden, {f"{name}_x": rows * hidden}, weights=hidden),
    ]


def _projections(source: str, outputs: list[tuple[str, int]], hidden: int, rows: int, merged: bool) -> list[Step]:
    if merged:
        names = "+".join(name for name, _ in outputs)
        total = sum(width for _, width in outputs)
        return [Step(f"linear {names} (merged)", names, rows * total, {source: rows * hidden},
                     weights=hidden * total, notes=["split into views"])]
    return [Step(f"linear {name}", name, rows * width, {source: rows * hidden}, weights=hidden * width,
                 fused_by="merged_projections" if index else None)
            for index, (name, width) in enumerate(outputs)]


def layer_steps(sizes: Sizes, batch: int = 1, kv_len: int | None = None,
                fusions: Iterable[str] = ()) -> list[Step]:
    """The ops of one layer's Decode step (one new token per sequence) in order. A step marked `fused_by` a fusion
    that is not applied is one of the ops that fusion would fold; with the fusion applied the chain is the fused
    one. `kv_len`: the cached positions attention reads (a static cache reads all of max_seq_len)."""
    fusions = set(fusions)
    unknown = fusions - set(FUSIONS)
    if unknown:
        raise ValueError(f"unknown fusions {sorted(unknown)}; known: {', '.join(FUSIONS)}")
    kv_len = kv_len or sizes.max_seq_len or 1
    rows, hidden, inter = batch, sizes.hidden, sizes.intermediate
    q_width, kv_width = sizes.heads * sizes.head_dim, sizes.kv_heads * sizes.head_dim
    kv_elems = batch * kv_len * kv_width
    scores = batch * sizes.heads * kv_len
    merged = "merged_projections" in fusions
    qkv = "q+k+v" if merged else None

    steps = _rms_norm("attn_norm", "x", hidden, rows, fusions)
    steps += _projections("attn_norm_out", [("q", q_width), ("k", kv_width), ("v", kv_width)], hidden, rows, merged)
    q, k, v = (qkv, qkv, qkv) if merged else ("q", "k", "v")
    steps += [
        Step("rotary q", "q_rot", rows * q_width, {q: rows * q_width}),
        Step("rotary k", "k_rot", rows * kv_width, {k: rows * kv_width}),
        Step("cache write k, v", "kv_cache", 0, {"k_rot": rows * kv_width, v: rows * kv_width},
             kv_written=2 * rows * kv_width),
    ]
    if "fused_attention" in fusions:
        steps.append(Step("scaled_dot_product_attention", "attn", rows * q_width, {"q_rot": rows * q_width},
                          kv_read=2 * kv_elems))
    else:
        fused = "fused_attention"
        if sizes.kv_heads != sizes.heads:
            # repeat_kv: expand + reshape copies K and V out to every query head.
            repeated = batch * kv_len * q_width
            steps += [Step("repeat_kv k", "k_rep", repeated, {}, kv_read=kv_elems, fused_by=fused),
                      Step("repeat_kv v", "v_rep", repeated, {}, kv_read=kv_elems, fused_by=fused)]
            k_read, v_read = {"k_rep": repeated}, {"v_rep": repeated}
            kv_direct = 0
        else:
            k_read, v_read, kv_direct = {}, {}, kv_elems
        steps += [
            Step("matmul q k^T", "scores", scores, {"q_rot": rows * q_width, **k_read}, kv_read=kv_direct,
                 fused_by=fused),
            Step("scale", "scores_scaled", scores, {"scores": scores}, fused_by=fused),
            Step("softmax", "probs", scores, {"scores_scaled": scores}, fused_by=fused),
            Step("matmul probs v", "attn", rows * q_width, {"probs": scores, **v_read}, kv_read=kv_direct),
        ]
    steps += [
        Step("linear o", "o", rows * hidden, {"attn": rows * q_width}, weights=q_width * hidden),
        Step("residual add", "h", rows * hidden, {"x": rows * hidden, "o": rows * hidden}),
    ]
    steps += _rms_norm("ffn_norm", "h", hidden, rows, fusions)
    steps += _projections("ffn_norm_out", [("gate", inter), ("up", inter)], hidden, rows, merged)
    gate, up = ("gate+up", "gate+up") if merged else ("gate", "up")
    steps += [
        Step("silu", "act", rows * inter, {gate: rows * inter}),
        Step("mul", "gated", rows * inter, {"act": rows * inter, up: rows * inter}),
        Step("linear down", "down", rows * hidden, {"gated": rows * inter}, weights=inter * hidden),
        Step("residual add", "out", rows * hidden, {"h": rows * hidden, "down": rows * hidden}),
    ]
    return steps


def layer_traffic(sizes: Sizes, batch: int = 1, kv_len: int | None = None, dtype_bytes: int | None = None,
                  fusions: Iterable[str] = ()) -> dict[str, Any]:
    """Bytes one layer moves in one Decode step: {"weights", "kv_cache", "intermediates", "total", "ops",
    "times_layers": the same over every layer}. Intermediates count each written once and each read back."""
    width = dtype_bytes or sizes.dtype_bytes
    steps = layer_steps(sizes, batch, kv_len, fusions)
    weights = sum(step.weights for step in steps)
    kv_cache = sum(step.kv_read + step.kv_written for step in steps)
    intermediates = sum(step.written for step in steps if step.writes != "kv_cache")
    intermediates += sum(sum(step.reads.values()) for step in steps)
    per_layer = {"weights": weights * width, "kv_cache": kv_cache * width, "intermediates": intermediates * width}
    per_layer["total"] = sum(per_layer.values())
    return {**per_layer, "ops": len(steps), "times_layers": {key: value * sizes.layers
                                                             for key, value in per_layer.items()}}


def config_traffic(config: Any, batch: int = 1, kv_len: int | None = None, dtype_bytes: int | None = None,
                   fusions: Iterable[str] = ()) -> dict[str, Any] | None:
    """`layer_traffic` for a config (None when it is not one `read_config` reads), with the sizes it read and the
    arguments, so the estimate can be made again with other fusions: `layer_traffic(Sizes.from_dict(d["sizes"]),
    d["batch"], d["kv_len"], d["dtype_bytes"], fusions)`."""
    sizes = read_config(config)
    if sizes is None:
        return None
    kv_len = kv_len or sizes.max_seq_len or 1
    width = dtype_bytes or sizes.dtype_bytes
    return {"sizes": sizes.to_dict(), "batch": batch, "kv_len": kv_len, "dtype_bytes": width,
            "fusions": sorted(set(fusions)), **layer_traffic(sizes, batch, kv_len, width, fusions)}


def estimate_pair(sizes: Sizes, batch: int, kv_len: int | None, dtype_bytes: int | None,
                  fusions: Iterable[str]) -> dict[str, Any]:
    """The estimate for one set of sizes without the fusions ("before") and with those of `fusions` it models
    ("after"), for the report: {"sizes", "batch", "kv_len", "dtype_bytes", "fusions", "before", "after"}."""
    modelled = sorted(set(fusions) & set(FUSIONS))
    kv_len = kv_len or sizes.max_seq_len or 1
    width = dtype_bytes or sizes.dtype_bytes
    return {"sizes": sizes.to_dict(), "batch": batch, "kv_len": kv_len, "dtype_bytes": width, "fusions": modelled,
            "before": layer_traffic(sizes, batch, kv_len, width, ()),
            "after": layer_traffic(sizes, batch, kv_len, width, modelled)}


def estimates(as_run: Mapping[str, Any] | None, full_config: Any, fusions: Iterable[str]) -> dict[str, Any]:
    """{"as_run": the pair for the sizes the worker read off the model it ran (its `config_traffic`), "full": the
    pair for a full-size config (its own length limit as the cached length, the same batch), each None when not
    known}."""
    fusions = list(fusions)
    run_pair = full_pair = None
    if as_run and as_run.get("sizes"):
        run_pair = estimate_pair(Sizes.from_dict(as_run["sizes"]), as_run["batch"], as_run["kv_len"],
                                 as_run["dtype_bytes"], fusions)
    full = read_config(full_config) if full_config is not None else None
    if full is not None:
        full_pair = estimate_pair(full, as_run["batch"] if as_run else 1, full.max_seq_len, full.dtype_bytes, fusions)
    return {"as_run": run_pair, "full": full_pair}


def fusion_effect(fusion: str, sizes: Sizes | None, batch: int = 1) -> dict[str, Any] | None:
    """What one fusion takes away from one layer's Decode step by the model above: {"ops": fewer ops, and with
    `sizes` "intermediates": fewer bytes, "total": the bytes the layer moves without it, "sizes", "batch",
    "kv_len"}. None for a fusion the model does not hold. Without sizes the op count is that of a layer whose KV
    heads are its query heads (grouped-query attention adds the repeat_kv copies to what the attention fuses)."""
    if fusion not in FUSIONS:
        return None
    shape = sizes or Sizes(hidden=1, heads=1, kv_heads=1, head_dim=1, intermediate=1, layers=1, max_seq_len=1)
    before, after = layer_steps(shape, batch), layer_steps(shape, batch, fusions=[fusion])
    effect: dict[str, Any] = {"ops": len(before) - len(after)}
    if sizes is not None:
        kv_len = sizes.max_seq_len or 1
        without = layer_traffic(sizes, batch, kv_len)
        with_it = layer_traffic(sizes, batch, kv_len, fusions=[fusion])
        effect.update(intermediates=without["intermediates"] - with_it["intermediates"], total=without["total"],
                      sizes=sizes.to_dict(), batch=batch, kv_len=kv_len)
    return effect
