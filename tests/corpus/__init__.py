"""Helpers for the opt-in corpus tests (`pytest -m corpus`): real third-party modeling files."""
