"""Codemods that keep host reads and Python branches on tensors out of the compiled step."""
