"""Codemods that fuse a step's operations into fewer kernels (the same work)."""
