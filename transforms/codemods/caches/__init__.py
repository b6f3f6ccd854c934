"""Codemods that give a model's key/value cache static buffers written in place."""
