"""GM101: a value copied from the device to the host inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import method_call_name
from graphmode.transforms.analysis.host_reads import host_sync
from graphmode.transforms.rules.base import Rule

class HostSync(Rule):
    CODE = "GM101"
    MESSAGE = "`.{name}()` waits for the device and copies a value to the host; a captured graph cannot contain it"
    SKILL = "host-syncs"
    TRACED = True
    EXPLAINED_BY = frozenset({"GM101", "GM102", "GM103", "GM104", "GM402"})
    STEP_ONLY = True
    VALID = (
        # Read once per call in eager code only: the guard keeps it out of the compiled step.
        """
        import torch


        class Head(torch.nn.Module):
            def forward(self, logits):
                if not torch.compiler.is_compiling():
                    self.last_max = logits.max().item()
                return logits.argmax(-1)
        """,
        # A training loop is not reached from any model step.
        """
        import torch


        def train_epoch(model, batches, optimizer):
            for batch in batches:
                loss = model(batch).mean()
                loss.backward()
                optimizer.step()
                print(loss.item())


        class Model(torch.nn.Module):
            def forward(self, x):
                return x * 2
        """,
        # `.item(i)` with an argument is numpy's element access, not the tensor sync.
        """
        import torch


        class Table(torch.nn.Module):
            def forward(self, x):
                return x * self.scales.item(0)
        """,
    )
    INVALID = (
        """
        import torch


        class Sampler(torch.nn.Module):
            def forward(self, logits):
                next_token = logits.argmax(-1).item()
                return next_token
        """,
        # Reached through `self._lengths(...)` from forward.
        """
        import torch


        class Model(torch.nn.Module):
            def forward(self, x, mask):
                return x[:, : max(self._lengths(mask))]

            def _lengths(self, mask):
                return mask.sum(-1).tolist()
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        # Which calls are host syncs is transforms.analysis.host_reads' to say: hoist_item and host_scalars ask it too.
        name = host_sync(method_call_name(node), len(node.args), len(node.keywords))
        if name is not None and self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=name))
