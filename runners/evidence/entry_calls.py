"""How the harness really calls the model: the arguments `forward` gets at Prefill and at each Decode step.

The entry points graphmode adds must take what the harness passes, not what `forward`'s signature
suggests: a parameter with a default (`input_pos: Optional[Tensor] = None`) may be the position the
harness passes every step, and a required one may be a cache that only Prefill leaves empty. So the
harness's own Prefill and Decode steps run once with a pre-hook on the model that binds each call to
`forward`'s signature, and every parameter gets a role from the values it took:

- ``tokens``: an integer tensor whose last dim is the prompt length at Prefill and the new tokens at
  Decode, or that grows by one token every step (then the model recomputes the whole sequence: it has
  no KV cache, ``EntryCalls.recomputes_sequence``);
- ``positions``: an integer tensor holding the positions being written (``arange(T)`` at Prefill,
  ``[T + step]`` at Decode; any leading dims, as ``position_ids`` has) or a Python int that counts the
  same way (``start_pos``);
- ``mask_rows``: a boolean tensor holding the rows of a causal mask for the positions being written (the
  prompt's rows at Prefill, row ``T + step`` at each Decode step), ``[..., tokens, S]`` over a fixed ``S``
  (torchtune's generate passes ``causal_mask[None, input_pos]``); the entries build them from positions;
- ``constant``: the same plain value (bool, int, float, str, None) in every Decode call;
- ``state``: anything else that Decode is given (caches in and out, masks that grow).

Only the top-level call is recorded (the model's own sub-modules are not entries).
"""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

ROLES = ("tokens", "positions", "mask_rows", "constant", "state")


@dataclass
class ParameterUse:
    name: str
    role: str                 # one of ROLES
    in_prefill: bool          # passed (not left at its default) in the Prefill call
    in_decode: bool           # passed in every Decode call
    positional: bool          # passed by position (else by keyword) in Decode
    summary: str = ""         # what was seen, for the design document: "int tensor [1] = 8, 9, 10"
    value: Any = None         # the constant's value, for role "constant"
    layout: str = ""          # positions: "1d" ([S]), "2d" ([B, S]) or "int"; mask_rows: "<dims>d:<S>"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class EntryCalls:
    """What the harness passed to the model's `forward`, parameter by parameter (in signature order)."""

    entry_class: str
    prompt_len: int
    parameters: list[ParameterUse] = field(default_factory=list)
    decode_calls: int = 0
    prefill_resets: list[str] = field(default_factory=list)  # model methods called with no arguments before Prefill

    def role(self, role: str) -> list[ParameterUse]:
        return [p for p in self.parameters if p.role == role and p.in_decode]

    @property
    def recomputes_sequence(self) -> bool:
        """Decode is given the whole sequence every step: the model keeps no KV cache."""
        return any("grows" in p.summary for p in self.role("tokens"))

    def to_dict(self) -> dict:
        return {"entry_class": self.entry_class, "prompt_len": self.prompt_len, "decode_calls": self.decode_calls,
                "parameters": [p.to_dict() for p in self.parameters], "prefill_resets": list(self.prefill_resets)}

    @classmethod
    def from_dict(cls, data: dict) -> "EntryCalls":
        return cls(entry_class=data["entry_class"], prompt_len=data["prompt_len"],
                   decode_calls=data.get("decode_calls", 0),
                   parameters=[ParameterUse(**p) for p in data.get("parameters", [])],
                   prefill_resets=list(data.get("prefill_resets", [])))


@dataclass
class _Call:
    arguments: dict[str, Any]  # bound, defaults not applied: what the caller passed
    positional: set[str]


def record_entry_calls(model: torch.nn.Module, prefill: Callable[[], Any], decode_steps: list[Callable[[], Any]],
                       prompt_len: int) -> EntryCalls:
    """Runs `prefill()` then each of `decode_steps` (the harness's own calls) with a pre-hook on `model` that
    records the top-level `forward` calls, and gives every parameter its role."""
    signature = inspect.signature(type(model).forward)
    calls: list[list[_Call]] = []
    depth = 0

    def pre_hook(module, args, kwargs):
        nonlocal depth
        depth += 1
        if depth == 1:  # a model that calls itself (generate-style wrappers) counts once
            bound = signature.bind_partial(module, *args, **kwargs).arguments
            bound.pop(next(iter(signature.parameters)), None)  # self
            names = list(signature.parameters)[1:1 + len(args)]
            calls[-1].append(_Call(arguments=dict(bound), positional=set(names)))

    def post_hook(module, args, kwargs, output):
        nonlocal depth
        depth -= 1

    # A harness may call `model.forward(...)` itself (mistral-inference's generate does), which runs no hooks:
    # the instance's `forward` records those calls; `model(...)` reaches it inside the hooks and is not recounted.
    bound_forward = model.forward

    def direct_forward(*args: Any, **kwargs: Any) -> Any:
        pre_hook(model, args, kwargs)
        try:
            return bound_forward(*args, **kwargs)
        finally:
            post_hook(model, args, kwargs, None)

    handles = [model.register_forward_pre_hook(pre_hook, with_kwargs=True),
               model.register_forward_hook(post_hook, with_kwargs=True, always_call=True)]
    # The model's own methods the harness calls with no arguments before Prefill's forward (torchtune's
    # `reset_caches()`): the Prefill entry must do the same, or a second generation starts from stale state.
    resets: list[str] = []
    inside: list[str] = []  # the watched methods running now: only the harness's own calls count, not theirs

    def watched(name: str, method: Callable[[], Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if depth == 0 and not inside and len(calls) == 1 and not calls[0] and not args and not kwargs \
                    and name not in resets:
                resets.append(name)
            inside.append(name)
            try:
                return method(*args, **kwargs)
            finally:
                inside.pop()
        return call

    own = _own_methods(type(model))
    for name in own:
        setattr(model, name, watched(name, getattr(model, name)))
    model.forward = direct_forward
    try:
        for run in [prefill, *decode_steps]:
            calls.append([])
            run()
    finally:
        for handle in handles:
            handle.remove()
        for name in [*own, "forward"]:
            model.__dict__.pop(name, None)
    result = _roles(type(model).__name__, signature, calls, prompt_len)
    result.prefill_resets = resets
    return result


def _plain_method(name: str, value: Any) -> bool:
    """A public function other than the step entries."""
    return inspect.isfunction(value) and not name.startswith("_") and name not in ("forward", "prefill", "decode")


def _own_methods(cls: type) -> list[str]:
    """Plain methods the model's own classes define (not torch.nn.Module's), except the step entries."""
    names = []
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass.__module__.startswith("torch."):
            break
        names += [n for n, v in vars(klass).items() if _plain_method(n, v) and n not in names]
    # What the class finally resolves each name to must be a plain method (a subclass may make it a property).
    return [n for n in names if inspect.isfunction(inspect.getattr_static(cls, n))]


def _roles(entry_class: str, signature: inspect.Signature, calls: list[list[_Call]], prompt_len: int) -> EntryCalls:
    prefill = calls[0][0] if calls and calls[0] else None
    decodes = [step[0] for step in calls[1:] if step]
    result = EntryCalls(entry_class=entry_class, prompt_len=prompt_len, decode_calls=len(decodes))
    names, var_keyword = _parameter_names(signature)
    for name in names:
        use = _named_use(name, prefill, decodes, prompt_len)
        if use is not None:
            result.parameters.append(use)
    # Keywords that only `**kwargs` takes are recorded under their own names: the entries cannot pass them.
    if var_keyword:
        result.parameters += _keyword_uses(var_keyword, prefill, decodes, prompt_len)
    _one_tokens_input(result)
    return result


def _parameter_names(signature: inspect.Signature) -> tuple[list[str], str | None]:
    """The named parameters after `self`, and the `**` parameter's name (None where there is none)."""
    kinds = list(signature.parameters.items())
    names = [n for n, p in kinds[1:] if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    return names, next((n for n, p in kinds if p.kind is inspect.Parameter.VAR_KEYWORD), None)


def _named_use(name: str, prefill: _Call | None, decodes: list[_Call], prompt_len: int) -> ParameterUse | None:
    """How the calls use one parameter of the signature, or None where neither Prefill nor every Decode passes it."""
    in_prefill = prefill is not None and name in prefill.arguments
    in_decode = bool(decodes) and all(name in c.arguments for c in decodes)
    if not (in_prefill or in_decode):
        return None
    use = ParameterUse(name=name, role="state", in_prefill=in_prefill, in_decode=in_decode,
                       positional=bool(decodes) and all(name in c.positional for c in decodes))
    _classify(use, prefill.arguments.get(name) if in_prefill else None, [c.arguments.get(name) for c in decodes],
              prompt_len)
    return use


def _keyword_uses(var_keyword: str, prefill: _Call | None, decodes: list[_Call], prompt_len: int
                  ) -> list[ParameterUse]:
    """How the calls use each keyword that only `**var_keyword` takes."""
    before = prefill.arguments.get(var_keyword, {}) if prefill is not None else {}
    steps = [c.arguments.get(var_keyword, {}) for c in decodes]
    uses = []
    for key in sorted({key for keywords in [before, *steps] for key in keywords}):
        use = ParameterUse(name=key, role="state", in_prefill=key in before,
                           in_decode=bool(steps) and all(key in keywords for keywords in steps), positional=False)
        _classify(use, before.get(key), [keywords.get(key) for keywords in steps], prompt_len)
        uses.append(use)
    return uses


def _classify(use: ParameterUse, prefill: Any, steps: list[Any], prompt_len: int) -> None:
    if _causal_rows(prefill, steps, prompt_len):
        size = steps[0].shape[-1]
        use.role, use.layout = "mask_rows", f"{steps[0].dim()}d:{size}"
        use.summary = f"bool tensor {list(steps[0].shape)}: rows {prompt_len}, {prompt_len + 1}, ... of a causal mask"
        return
    if steps and all(_is_int_tensor(v) for v in steps):
        _classify_int_tensors(use, prefill, steps, prompt_len)
        return
    if _python_int_positions(steps, prompt_len):
        use.role, use.layout = "positions", "int"
        use.summary = f"Python int {', '.join(map(str, steps))} (Prefill: {prefill!r})"
        return
    if _constant(steps):
        use.role, use.value, use.summary = "constant", steps[0], f"always {steps[0]!r} in Decode"
        return
    use.summary = ", ".join(sorted({type(v).__name__ for v in steps})) or "only at Prefill"


def _classify_int_tensors(use: ParameterUse, prefill: Any, steps: list[torch.Tensor], prompt_len: int) -> None:
    """Integer tensors at every Decode step: positions, new tokens, or a token sequence that grows (else state)."""
    lengths = [v.shape[-1] for v in steps]
    if _counts_positions(prefill, steps, prompt_len):
        use.role, use.layout = "positions", "1d" if steps[0].dim() == 1 else f"{steps[0].dim()}d"
        use.summary = f"int tensor {list(steps[0].shape)} holding {', '.join(str(int(v.flatten()[-1])) for v in steps)}"
    elif _same_length_tokens(prefill, lengths, prompt_len):
        use.role, use.summary = "tokens", f"int tensor {list(steps[0].shape)} (new tokens)"
    elif lengths == [prompt_len + i + 1 for i in range(len(steps))]:
        use.role = "tokens"
        use.summary = f"int tensor whose last dim grows {prompt_len} -> {', '.join(map(str, lengths))}"


def _same_length_tokens(prefill: Any, lengths: list[int], prompt_len: int) -> bool:
    """As many ids at every Decode step, and the prompt's length at Prefill (where it was passed): new tokens."""
    prompt_like = prefill is None or _is_int_tensor(prefill) and prefill.shape[-1] == prompt_len
    return prompt_like and all(n == lengths[0] for n in lengths)


def _constant(steps: list[Any]) -> bool:
    """The same plain value (of one type) at every Decode step."""
    return bool(steps) and all(_plain(v) and v == steps[0] and type(v) is type(steps[0]) for v in steps)


def _python_int_positions(steps: list[Any], prompt_len: int) -> bool:
    """Python ints that count up by one from the prompt's length, one per Decode step."""
    if len(steps) < 2 or not all(type(v) is int for v in steps):
        return False
    return steps[0] == prompt_len and {b - a for a, b in zip(steps, steps[1:])} == {1}


def _one_tokens_input(result: EntryCalls) -> None:
    """Two integer inputs can both look like tokens (ids and a 2-D padding mask that grows, say): new tokens
    win over a growing input, then signature order; the rest are state."""
    candidates = sorted(result.role("tokens"), key=lambda p: "grows" in p.summary)
    for extra in candidates[1:]:
        extra.role = "state"


def _is_int_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not value.dtype.is_floating_point and value.dim() >= 1 \
        and value.dtype is not torch.bool


def _counts_positions(prefill: Any, steps: list[torch.Tensor], prompt_len: int) -> bool:
    """arange(T) (in any leading dims) at Prefill, then the next position at each Decode step."""
    for step, value in enumerate(steps):
        if value.shape[-1] != 1 or not bool((value == prompt_len + step).all()):
            return False
    if prefill is None:
        return True
    if not _is_int_tensor(prefill) or prefill.shape[-1] != prompt_len:
        return False
    return bool((prefill == torch.arange(prompt_len, device=prefill.device)).all())


def _causal_rows(prefill: Any, steps: list[Any], prompt_len: int) -> bool:
    """Boolean `[..., tokens, S]` tensors equal to rows of `tril(ones(S, S))`: the prompt's rows at Prefill, the
    next position's row at each Decode step."""
    if not steps or not isinstance(steps[0], torch.Tensor) \
            or not all(_one_bool_row(v, steps[0].shape[-1]) for v in steps):
        return False
    size = steps[0].shape[-1]
    if size < prompt_len + len(steps):
        return False
    columns = torch.arange(size, device=steps[0].device)
    if not all(bool((v == (columns <= prompt_len + step)).all()) for step, v in enumerate(steps)):
        return False
    return prefill is None or _prompt_rows(prefill, prompt_len, columns)


def _one_bool_row(value: Any, size: int) -> bool:
    """A boolean `[..., 1, size]` tensor."""
    return isinstance(value, torch.Tensor) and value.dtype is torch.bool and value.dim() >= 2 \
        and value.shape[-2] == 1 and value.shape[-1] == size


def _prompt_rows(prefill: Any, prompt_len: int, columns: torch.Tensor) -> bool:
    """Prefill's mask: the causal rows of the prompt's positions over `columns`."""
    if not (isinstance(prefill, torch.Tensor) and prefill.dtype is torch.bool
            and prefill.shape[-2:] == (prompt_len, len(columns))):
        return False
    rows = torch.arange(prompt_len, device=prefill.device)[:, None]
    return bool((prefill == (columns[None, :] <= rows)).all())


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
