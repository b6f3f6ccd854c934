"""The rule catalogue and the scan that runs it. One rule per module; register it in RULES."""
from __future__ import annotations

import libcst as cst

from transforms.findings import Finding
from transforms.rules.base import Rule
from transforms.rules.reach import reachable_functions
from transforms.rules.gm101_host_sync import HostSync
from transforms.rules.gm201_tensor_creation import TensorCreatedInForward
from transforms.rules.gm301_growing_kv_cache import GrowingKVCache
from transforms.rules.gm401_shape_branch import ShapeBranch
from transforms.rules.gm501_int_position import IntPosition

RULES: tuple[type[Rule], ...] = (HostSync, TensorCreatedInForward, GrowingKVCache, ShapeBranch, IntPosition)


def scan_source(source: str, path: str) -> list[Finding]:
    """Every finding of every rule in one source file, in line order. Raises libcst.ParserSyntaxError."""
    wrapper = cst.MetadataWrapper(cst.parse_module(source))
    step_functions = reachable_functions(wrapper.module)
    rules = [rule(path, step_functions) for rule in RULES]
    wrapper.visit_batched(rules)
    findings = [f for rule in rules for f in rule.findings]
    return sorted(findings, key=lambda f: (f.line, f.column, f.code))
