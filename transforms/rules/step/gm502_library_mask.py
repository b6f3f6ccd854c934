"""GM502: the causal mask built per call by transformers' mask helpers, for the grown length."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_dotted_name
from graphmode.transforms.rules.base import Rule
from graphmode.transforms.vocabulary import LIBRARY_MASK_HELPERS


class LibraryMask(Rule):
    CODE = "GM502"
    MESSAGE = (
        "the 4-D causal mask is built on every call for `past + new` columns: its width changes every Decode step "
        "and the past length is a Python int; build it once at the maximum length and pick rows by position"
    )
    SKILL = "static-buffers"
    STEP_ONLY = True
    VALID = (
        # Since transformers 4.38 the model's own `_update_causal_mask` builds it from the cache slots.
        """
        import torch


        class Model(torch.nn.Module):
            def forward(self, inputs_embeds, attention_mask, cache_position, past_key_values):
                mask = self._update_causal_mask(attention_mask, inputs_embeds, cache_position, past_key_values, False)
                return self.layers(inputs_embeds, mask)
        """,
        # Built once outside any step.
        """
        import torch
        from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask


        def prompt_mask(attention_mask, inputs_embeds):
            shape = inputs_embeds.shape[:2]
            return _prepare_4d_causal_attention_mask(attention_mask, shape, inputs_embeds, 0)


        class Model(torch.nn.Module):
            def forward(self, inputs_embeds, mask):
                return self.layers(inputs_embeds, mask)
        """,
    )
    INVALID = (
        """
        import torch
        from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask


        class Model(torch.nn.Module):
            def forward(self, inputs_embeds, attention_mask, past_key_values_length):
                batch_size, seq_length = inputs_embeds.shape[:2]
                attention_mask = _prepare_4d_causal_attention_mask(
                    attention_mask, (batch_size, seq_length), inputs_embeds, past_key_values_length
                )
                return self.layers(inputs_embeds, attention_mask)
        """,
        """
        import torch
        from transformers import modeling_attn_mask_utils


        class Model(torch.nn.Module):
            def forward(self, inputs_embeds, attention_mask, past_len):
                mask = modeling_attn_mask_utils._prepare_4d_causal_attention_mask_for_sdpa(
                    attention_mask, inputs_embeds.shape[:2], inputs_embeds, past_len
                )
                return self.layers(inputs_embeds, mask)
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        name = ast_dotted_name(node.func)
        if name and name.rsplit(".", 1)[-1] in LIBRARY_MASK_HELPERS and self.in_step_code(node):
            self.report(node)
