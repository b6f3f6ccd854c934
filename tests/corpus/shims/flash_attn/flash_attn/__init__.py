"""A stand-in for flash-attn, written for graphmode's corpus tests (not flash-attn's code).

Some Hub remote code imports flash-attn's kernels at module level or builds a flash-attention module
in `__init__` whatever its config says (TeleChat asserts the import succeeded), though it calls them
only when its config asks for flash attention. flash-attn is a CUDA build with no CPU kernels, so the
remote-code site gets these names instead; the corpus configs turn flash attention off, and a call
says so rather than computing something else.
"""
from __future__ import annotations


def _no_kernels(name: str):
    def kernel(*args, **kwargs):
        raise NotImplementedError(f"flash_attn.{name} is graphmode's corpus stand-in (flash-attn has no CPU "
                                  "kernels); the model's config should turn flash attention off")
    kernel.__name__ = name
    return kernel


flash_attn_func = _no_kernels("flash_attn_func")
flash_attn_varlen_func = _no_kernels("flash_attn_varlen_func")
