"""GM602: logging or warnings inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.astutil import dotted_name
from graphmode.transforms.rules.base import Rule

LOG_LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical",
                        "warning_once", "info_once"})
LOGGERS = frozenset({"logger", "logging", "log", "_logger", "LOGGER", "_LOGGER"})


def _logging_call(call: ast.Call) -> str | None:
    """`logger.info` / `self.logger.warning` / `logging.debug` / `warnings.warn` -> that text."""
    if call.func.__class__ is not ast.Attribute:  # a bare name has no dot: not a logging call
        return None
    name = dotted_name(call.func)
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
    FIXED_BY = ("hoist_item",)
    STEP_ONLY = True

    def visit_Call(self, node: ast.Call) -> None:
        name = _logging_call(node)
        if name is not None and self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=name))
