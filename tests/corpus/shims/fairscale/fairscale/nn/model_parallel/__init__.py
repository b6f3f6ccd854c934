"""Stand-in (graphmode corpus tests): see fairscale/__init__.py."""
