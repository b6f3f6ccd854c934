"""Source-level knowledge: rules that find graph-mode hazards and codemods that remove them.

Everything here is a pure function of source text (plus options). Nothing imports torch.
"""
