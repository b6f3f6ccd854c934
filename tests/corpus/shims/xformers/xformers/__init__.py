"""A stand-in for xformers, written for graphmode's corpus tests (not xformers' code).

mistral-inference imports `xformers.ops.fmha.memory_efficient_attention` and four attention-bias
classes. xformers itself is a CUDA build (and its memory-efficient kernels have no CPU operator), so
the corpus site gets this shim instead: the biases are materialized as dense additive masks and the
attention is plain softmax(q k^T / sqrt(d) + bias) v, with the semantics of xformers' attn_bias.
"""
