"""The modules that run as child processes (`python -m`), one per kind of run, and what they share."""
