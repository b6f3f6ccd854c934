"""flash_attn.flash_attn_interface of the corpus stand-in (see the package docstring)."""
from . import _no_kernels

flash_attn_unpadded_func = _no_kernels("flash_attn_unpadded_func")
flash_attn_varlen_func = _no_kernels("flash_attn_varlen_func")
