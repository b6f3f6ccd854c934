"""A rule and the codemods that fix its hazard ask one recogniser (transforms/analysis/host_reads.py,
transforms/analysis/growing_caches.py): on the same source, the rule's findings and the codemods' recognition name
the same lines."""
import textwrap

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from graphmode.transforms.cstutil import appending_cat, host_sync_call
from graphmode.transforms.rules import scan_source

HOST_READS = textwrap.dedent("""
    import torch


    class Head(torch.nn.Module):
        def forward(self, logits, table):
            best = logits.max().item()
            ids = logits.argmax(-1).tolist()
            scale = table.item(0)
            host = logits.cpu()
            total = logits.sum()
            return best, ids, scale, host, total
""")

GROWING = textwrap.dedent("""
    import torch


    class Attention(torch.nn.Module):
        def forward(self, k, v, q, past_key_value=None, past_value=None, cache_k=None):
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat((past_value, v), dim=-2)
            q = torch.cat([q, k], dim=2)
            both = torch.cat([k, v], dim=-1)
            half = torch.cat((-q[..., 1:], q[..., :1]), dim=-1)
            return k, v, q, both, half
""")


def _lines(source: str, recognised) -> list[int]:
    wrapper = MetadataWrapper(cst.parse_module(source))
    positions = wrapper.resolve(PositionProvider)
    return sorted(positions[node].start.line for node in positions if recognised(node))


def _finding_lines(source: str, code: str) -> list[int]:
    return sorted(f.line for f in scan_source(source, "model.py") if f.code == code)


def test_gm101_reports_exactly_the_calls_the_host_sync_codemods_read_as_host_syncs():
    lines = _lines(HOST_READS, host_sync_call)
    assert len(lines) == 2  # `.item()` and `.tolist()`; `.item(0)` is numpy's element access, `.cpu()` is GM103's
    assert _finding_lines(HOST_READS, "GM101") == lines


def test_gm301_reports_the_appending_cats_whose_old_part_is_a_past_cache():
    appended = _lines(GROWING, lambda node: appending_cat(node) is not None)
    # `k = cat([past_key_value[0], k])`, `v = cat((past_value, v))`; `q = cat([q, k])` reads q in the old part, the
    # other two assign a new name.
    assert len(appended) == 2
    assert _finding_lines(GROWING, "GM301") == appended
