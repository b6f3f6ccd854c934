"""GM103: a tensor copied to the host (`.cpu()`, `.numpy()`, `.to("cpu")`) inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import arg_value, first_arg, is_positional, method_call_name
from graphmode.transforms.analysis.host_reads import host_copy
from graphmode.transforms.analysis.idioms import keyword, string_value
from graphmode.transforms.rules.base import Rule, SourceFile


def _to_cpu(node: ast.Call, file: SourceFile) -> bool:
    """`.to("cpu")` / `.to(device="cpu")`."""
    if method_call_name(node) != "to":
        return False
    device = keyword(node, "device")
    if device is None:
        first = first_arg(node)
        if first is not None and is_positional(first):
            device = first
    return device is not None and string_value(arg_value(device), file) == "cpu"


class CopyToHost(Rule):
    CODE = "GM103"
    MESSAGE = (
        "`{name}` copies the tensor to the host mid-step and waits for the device; "
        "return the device tensor and copy it in the eager caller after the compiled call"
    )
    SKILL = "host-syncs"
    TRACED = True
    EXPLAINED_BY = frozenset({"GM101", "GM102", "GM103", "GM104", "GM402"})
    STEP_ONLY = True
    VALID = (
        # Moves between devices or dtypes stay on the device.
        """
        import torch


        class Cast(torch.nn.Module):
            def forward(self, x):
                return x.to(self.device).to(torch.float16)
        """,
        # The eager caller copies the result after the compiled call.
        """
        import torch


        class Model(torch.nn.Module):
            def forward(self, ids):
                return self.lm_head(self.body(ids))

            def generate(self, ids):
                return self(ids).argmax(-1).cpu().numpy()
        """,
    )
    INVALID = (
        """
        import torch


        class Head(torch.nn.Module):
            def forward(self, logits):
                return logits.argmax(-1).cpu()
        """,
        """
        import torch


        class Head(torch.nn.Module):
            def forward(self, logits):
                return logits.float().to("cpu")
        """,
        """
        import torch


        class Head(torch.nn.Module):
            def forward(self, logits):
                probs = logits.softmax(-1)
                return probs.to(device="cpu")
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        name = host_copy(method_call_name(node))
        if name is not None:
            label = f".{name}()"
        elif _to_cpu(node, self.file):
            label = '.to("cpu")'
        else:
            return
        if self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=label))
