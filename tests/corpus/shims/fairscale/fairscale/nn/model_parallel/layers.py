"""Stand-in (graphmode corpus tests): the model-parallel layers at world size 1."""
from __future__ import annotations

from torch import nn


class ColumnParallelLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = True,
                 init_method=None, **_: object):
        super().__init__(in_features, out_features, bias=bias)


class RowParallelLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = False,
                 init_method=None, **_: object):
        super().__init__(in_features, out_features, bias=bias)


class VocabParallelEmbedding(nn.Embedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, init_method=None, **_: object):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)


class ParallelEmbedding(VocabParallelEmbedding):
    pass
