"""Codemods that replace a mask built on every call by its rows at the positions."""
