"""The passes over an adapted file after the codemods: the static path beside the original, tidying, line wrapping,
the helper module beside the file, and the wording for a file with no entries."""
