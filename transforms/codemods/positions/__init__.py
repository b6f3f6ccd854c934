"""Codemods that make positions a tensor and build position tables once."""
