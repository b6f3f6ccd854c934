"""GM601: random numbers drawn, or dropout left on, inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_dotted_name, ast_torch_call_name, name_of
from graphmode.transforms.analysis.idioms import keyword, positional_args
from graphmode.transforms.rules.base import Rule

RANDOM_OPS = frozenset(
    {"rand", "randn", "randint", "randperm", "bernoulli", "multinomial", "normal", "poisson", "rand_like",
     "randn_like", "randint_like"}
)
_DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"})


def _dropout_name(call: ast.Call) -> str | None:
    """`F.dropout`, `nn.functional.dropout`, `torch.nn.functional.dropout`, `torch.dropout` -> that text."""
    name = ast_dotted_name(call.func)
    if name is None or "." not in name:
        return None
    owner, _, op = name.rpartition(".")
    if op in _DROPOUTS and (owner in {"F", "torch", "functional"} or owner.endswith(".functional")):
        return name
    return None


def _training_off(call: ast.Call, name: str) -> bool:
    """`training=self.training` / `training=False` (`train=` for `torch.dropout`, or the third argument)."""
    arg = keyword(call, "train" if name == "torch.dropout" else "training")
    if arg is not None:
        value = arg.value
    else:
        positional = positional_args(call)
        if len(positional) <= 2:
            return False
        value = positional[2]
    bare = name_of(value)
    if bare is not None:
        return bare == "False"
    return ast_dotted_name(value) == "self.training"


class RandomOps(Rule):
    CODE = "GM601"
    MESSAGE = (
        "`torch.{name}` draws random numbers in the step: capture backends reject random ops and eager and "
        "compiled runs draw differently; sample in the eager caller after the compiled call"
    )
    DROPOUT_MESSAGE = (
        "`{name}` without `training=self.training` keeps dropping activations after `model.eval()`, a random "
        "op in the step; pass `training=self.training` or use an `nn.Dropout` module"
    )
    SKILL = "inference-hygiene"
    STEP_ONLY = True
    VALID = (
        # Dropout that follows `model.eval()`: a module, or the functional form with `training=self.training`.
        """
        import torch
        import torch.nn.functional as F


        class MLP(torch.nn.Module):
            def forward(self, x):
                x = self.dropout(self.fc1(x))
                return F.dropout(self.fc2(x), p=0.1, training=self.training)
        """,
        # Sampling in the eager caller, after the compiled step.
        """
        import torch


        class LM(torch.nn.Module):
            def forward(self, ids):
                return self.lm_head(self.body(ids))

            def sample(self, ids, temperature):
                probs = (self(ids)[:, -1] / temperature).softmax(-1)
                return torch.multinomial(probs, num_samples=1)
        """,
    )
    INVALID = (
        """
        import torch


        class Noisy(torch.nn.Module):
            def forward(self, x):
                return x + 0.01 * torch.randn_like(x)
        """,
        """
        import torch
        import torch.nn.functional as F


        class MLP(torch.nn.Module):
            def forward(self, x):
                return F.dropout(self.fc(x), p=0.1)
        """,
        """
        import torch


        def decode_one_token(model, token):
            probs = model(token)[:, -1].softmax(-1)
            return torch.multinomial(probs, num_samples=1)
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        op = ast_torch_call_name(node)
        if op in RANDOM_OPS:
            if self.in_step_code(node):
                self.report(node, self.MESSAGE.format(name=op))
            return
        dropout = _dropout_name(node)
        if dropout is not None and not _training_off(node, dropout) and self.in_step_code(node):
            self.report(node, self.DROPOUT_MESSAGE.format(name=dropout))
