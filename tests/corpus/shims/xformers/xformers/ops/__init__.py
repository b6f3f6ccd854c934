"""Stand-in (graphmode corpus tests): see xformers/__init__.py."""
from xformers.ops.fmha import memory_efficient_attention  # noqa: F401
