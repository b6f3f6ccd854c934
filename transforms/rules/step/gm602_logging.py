"""GM602: logging or warnings inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_dotted_name
from graphmode.transforms.rules.base import Rule

LOG_LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical",
                        "warning_once", "info_once"})
LOGGERS = frozenset({"logger", "logging", "log", "_logger", "LOGGER", "_LOGGER"})


def _logging_call(call: ast.Call) -> str | None:
    """`logger.info` / `self.logger.warning` / `logging.debug` / `warnings.warn` -> that text."""
    if call.func.__class__ is not ast.Attribute:  # a bare name has no dot: not a logging call
        return None
    name = ast_dotted_name(call.func)
    if name is None:
        return None
    parts = name.split(".")
    if name == "warnings.warn" or (parts[-1] in LOG_LEVELS and parts[-2] in LOGGERS):
        return name
    return None


class LoggingInStep(Rule):
    CODE = "GM602"
    MESSAGE = (
        "`{name}(...)` in the step is a graph break (an error under fullgraph), or is dropped from the "
        "compiled step where Dynamo ignores it; log in the eager caller, or guard it with "
        "`if not torch.compiler.is_compiling():`"
    )
    SKILL = "inference-hygiene"
    STEP_ONLY = True
    VALID = (
        # A logger made at import time, used in __init__, which no step reaches.
        """
        import logging

        import torch

        logger = logging.getLogger(__name__)


        class Model(torch.nn.Module):
            def __init__(self, config):
                super().__init__()
                logger.info("building %d layers", config.num_layers)

            def forward(self, x):
                return x
        """,
        # Eager-only code under the guard.
        """
        import logging

        import torch

        logger = logging.getLogger(__name__)


        class Model(torch.nn.Module):
            def forward(self, x):
                if not torch.compiler.is_compiling():
                    logger.debug("input %s", tuple(x.shape))
                return x
        """,
    )
    INVALID = (
        """
        import logging

        import torch

        logger = logging.getLogger(__name__)


        class Attention(torch.nn.Module):
            def forward(self, x, output_attentions=False):
                if output_attentions:
                    logger.warning_once("sdpa cannot return attention weights")
                return x
        """,
        """
        import warnings

        import torch


        class Attention(torch.nn.Module):
            def forward(self, x, padding_mask=None):
                if padding_mask is not None:
                    warnings.warn("padding_mask is deprecated")
                return x
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        name = _logging_call(node)
        if name is not None and self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=name))
