"""The rule catalogue and the scan that runs it. One rule per module; register it in RULES."""
from __future__ import annotations

import ast
import warnings

from graphmode.transforms.analysis.reach import reachable_functions
from graphmode.transforms.findings import Finding
from graphmode.transforms.rules.base import Rule, SourceFile
from graphmode.transforms.rules.gm101_host_sync import HostSync
from graphmode.transforms.rules.gm102_tensor_to_python import TensorToPython
from graphmode.transforms.rules.gm103_copy_to_host import CopyToHost
from graphmode.transforms.rules.gm104_print import PrintInStep
from graphmode.transforms.rules.gm201_tensor_creation import TensorCreatedInForward
from graphmode.transforms.rules.gm301_growing_kv_cache import GrowingKVCache
from graphmode.transforms.rules.gm302_position_slice import PositionSlice
from graphmode.transforms.rules.gm303_cache_object import CacheObject
from graphmode.transforms.rules.gm401_shape_branch import ShapeBranch
from graphmode.transforms.rules.gm402_tensor_branch import TensorBranch
from graphmode.transforms.rules.gm501_int_position import IntPosition
from graphmode.transforms.rules.gm502_library_mask import LibraryMask
from graphmode.transforms.rules.gm601_random_ops import RandomOps
from graphmode.transforms.rules.gm602_logging import LoggingInStep
from graphmode.transforms.rules.gm701_fused_attention_lengths import FusedAttentionLengths
from graphmode.transforms.rules.gm801_ge_dynamic import GEDynamic
from graphmode.transforms.rules.gm802_npugraph_ex_fullgraph import NpugraphExFullgraph
from graphmode.transforms.rules.gm803_whole_model import WholeModelCompiled
from graphmode.transforms.rules.gm804_low_limits import LowLimit

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
