"""The rule catalogue and the scan that runs it. One rule per module; register it in RULES."""
from __future__ import annotations

import ast
import warnings

from transforms.findings import Finding
from transforms.rules.base import Rule, SourceFile
from transforms.rules.reach import reachable_functions
from transforms.rules.gm101_host_sync import HostSync
from transforms.rules.gm102_tensor_to_python import TensorToPython
from transforms.rules.gm103_copy_to_host import CopyToHost
from transforms.rules.gm104_print import PrintInStep
from transforms.rules.gm201_tensor_creation import TensorCreatedInForward
from transforms.rules.gm301_growing_kv_cache import GrowingKVCache
from transforms.rules.gm302_position_slice import PositionSlice
from transforms.rules.gm303_cache_object import CacheObject
from transforms.rules.gm401_shape_branch import ShapeBranch
from transforms.rules.gm402_tensor_branch import TensorBranch
from transforms.rules.gm501_int_position import IntPosition
from transforms.rules.gm502_library_mask import LibraryMask
from transforms.rules.gm601_random_ops import RandomOps
from transforms.rules.gm602_logging import LoggingInStep
from transforms.rules.gm701_fused_attention_lengths import FusedAttentionLengths
from transforms.rules.gm801_ge_dynamic import GEDynamic
from transforms.rules.gm802_npugraph_ex_fullgraph import NpugraphExFullgraph
from transforms.rules.gm803_whole_model import WholeModelCompiled
from transforms.rules.gm804_low_limits import LowLimit

RULES: tuple[type[Rule], ...] = (
    HostSync, TensorToPython, CopyToHost, PrintInStep,
    TensorCreatedInForward,
    GrowingKVCache, PositionSlice, CacheObject,
    ShapeBranch, TensorBranch,
    IntPosition, LibraryMask,
    RandomOps, LoggingInStep,
    FusedAttentionLengths,
    GEDynamic, NpugraphExFullgraph, WholeModelCompiled, LowLimit,
)
# GM901 (graph break) and GM902 (recompile) are runtime codes: the Dynamo probe reports them, no rule does.


def scan_source(source: str, path: str) -> list[Finding]:
    """Every finding of every rule in one source file, in line order. Raises SyntaxError (and
    ValueError for a NUL byte)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences and the like are not findings
        tree = ast.parse(source, filename=path)
    file = SourceFile(source, path, tree, reachable_functions(tree))
    rules = [rule(file) for rule in RULES]
    file.run(rules)
    findings = [f for rule in rules for f in rule.findings]
    return sorted(findings, key=lambda f: (f.line, f.column, f.code))
