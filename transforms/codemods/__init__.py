"""The codemods, in the order they run. Each one is a module; register it in CHAIN."""
from __future__ import annotations

from transforms.codemods.base import Edit, GraphCodemod, ManualItem, Options
from transforms.codemods.cache_object import CacheObject
from transforms.codemods.carried_cache import CarriedCache
from transforms.codemods.hoist_item import HoistItem
from transforms.codemods.host_scalars import HostScalars
from transforms.codemods.scalar_arguments import ScalarArguments
from transforms.codemods.sliced_kv_cache import SlicedKVCache
from transforms.codemods.sliced_tables import SlicedTables
from transforms.codemods.split_decode import SplitDecode
from transforms.codemods.static_kv_cache import StaticKVCacheCodemod
from transforms.codemods.static_mask import StaticMask
from transforms.codemods.static_positions import StaticPositions
from transforms.codemods.static_rotary import StaticRotary
from transforms.codemods.tensor_branches import TensorBranches

# Order matters: the table, mask and cache rewrites read the position parameter (and remove the slices
# by it) before it is renamed, and the Decode entry is copied from `forward` once everything else has
# been rewritten.
CHAIN: tuple[type[GraphCodemod], ...] = (
    HoistItem, ScalarArguments, TensorBranches, StaticRotary, SlicedTables, StaticMask, StaticKVCacheCodemod, CacheObject,
    CarriedCache, SlicedKVCache, StaticPositions, HostScalars, SplitDecode,
)
CODEMODS: dict[str, type[GraphCodemod]] = {c.NAME: c for c in CHAIN}

__all__ = ["CHAIN", "CODEMODS", "Edit", "GraphCodemod", "ManualItem", "Options"]
