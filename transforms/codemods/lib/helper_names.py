"""The names of graphmode_static.py's helpers (helper-code/helpers.py) that more than one codemod writes, or that the
entries and the output passes refer to: each name in one place."""
from __future__ import annotations

MASK_BUILDER = "graphmode_causal_rows"  # a mask's rows computed from the positions
MASK_CLASS = "GraphmodeCausalMask"  # the additive rows of the causal mask, computed by MASK_BUILDER
PADDED_ROWS = "graphmode_padded_rows"  # mask rows of the slots with the entries' 2-D padding mask applied
SLOTS = "graphmode_slots"  # the slots of the entries' call, where the model names no positions shared by its rows
BUFFERS_CLASS = "StaticKVBuffers"  # keys and values carried in buffers (carried_cache, added_cache)
CACHE_CLASS = "StaticKVCache"  # a module's own static key/value cache (static_kv_cache, cache_object, absorbed_mla)
CACHE_BUFFERS = "graphmode_cache_buffers"  # caches the model's own __init__ built, made buffers (sliced_kv_cache)
TABLE_BUFFERS = "graphmode_table_buffers"  # position tables the model's own __init__ built (sliced_tables)
STATIC_PATH = "GraphmodeStaticPath"  # the switch the entries enter, and its sizing (`setup`)
BUILT_TABLES = f"{STATIC_PATH}.position_tables"  # tables setup_caches has the model's own code build (static_rotary)
RESIZE = "graphmode_resize"  # the method GraphmodeStaticPath.setup calls on every module that has one
SETUP = "setup_caches"  # the entry's sizing call, as gpt-fast names it
POSITION_LIMIT = "graphmode_position_limit"  # the static path's number of slots (tensor_branches, carried_cache)
GUARD = "not torch.compiler.is_compiling()"  # the test that keeps a statement eager only (hoist_item)
WRITE_BUFFER = "graphmode_write_buffer"  # a buffer the step recomputes, written into its memory (buffers_in_place)
