"""Codemods for the tensors a module holds between steps."""
