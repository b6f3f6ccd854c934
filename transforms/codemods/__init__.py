"""The codemods, in the order they run. Each one is a module; register it in CHAIN."""
from __future__ import annotations

from graphmode.transforms.codemods.base import Edit, GraphCodemod, PartialMatch, Options
from graphmode.transforms.codemods.buffers.buffers_in_place import BuffersInPlace
from graphmode.transforms.codemods.caches.absorbed_mla import AbsorbedMLA
from graphmode.transforms.codemods.caches.added_cache import AddedCache
from graphmode.transforms.codemods.caches.cache_object import CacheObject
from graphmode.transforms.codemods.caches.carried_cache import CarriedCache
from graphmode.transforms.codemods.caches.sliced_kv_cache import SlicedKVCache
from graphmode.transforms.codemods.caches.static_kv_cache import StaticKVCacheCodemod
from graphmode.transforms.codemods.entries.split_decode import SplitDecode
from graphmode.transforms.codemods.experts.static_moe import StaticMoE
from graphmode.transforms.codemods.fusions.fused_add_rms_norm import FusedAddRMSNorm
from graphmode.transforms.codemods.fusions.fused_attention import FusedAttention
from graphmode.transforms.codemods.fusions.fused_rms_norm import FusedRMSNorm
from graphmode.transforms.codemods.fusions.fused_rotary import FusedRotary
from graphmode.transforms.codemods.fusions.merged_projections import MergedProjections
from graphmode.transforms.codemods.host_syncs.hoist_item import HoistItem
from graphmode.transforms.codemods.host_syncs.host_scalars import HostScalars
from graphmode.transforms.codemods.host_syncs.scalar_arguments import ScalarArguments
from graphmode.transforms.codemods.host_syncs.tensor_branches import TensorBranches
from graphmode.transforms.codemods.masks.static_mask import StaticMask
from graphmode.transforms.codemods.positions.sliced_tables import SlicedTables
from graphmode.transforms.codemods.positions.static_positions import StaticPositions
from graphmode.transforms.codemods.positions.static_rotary import StaticRotary

# Order matters: the table, mask and cache rewrites read the position parameter (and remove the slices
# by it) before it is renamed, and the Decode entry is copied from `forward` once everything else has
# been rewritten. The fusions come after every rewrite that makes Decode compile: they act on the
# static path's code as it will run. An MoE dispatch is given its static form first, so no other
# rewrite acts on host reads it replaces.
CHAIN: tuple[type[GraphCodemod], ...] = (
    StaticMoE, HoistItem, ScalarArguments, TensorBranches, BuffersInPlace, StaticRotary, SlicedTables, StaticMask,
    StaticKVCacheCodemod, CacheObject, AbsorbedMLA, CarriedCache, SlicedKVCache, StaticPositions, HostScalars,
    AddedCache, FusedAddRMSNorm, FusedRMSNorm, FusedAttention, MergedProjections, FusedRotary, SplitDecode,
)
CODEMODS: dict[str, type[GraphCodemod]] = {c.NAME: c for c in CHAIN}

__all__ = ["CHAIN", "CODEMODS", "Edit", "GraphCodemod", "PartialMatch", "Options"]
