"""Analyses of model source that both the rules (stdlib `ast`) and the codemods (libcst) rely on: the `ast` helpers,
the static guesses at which expressions are tensors, and which functions a model step reaches. They live outside
transforms.rules so that a codemod asks them without loading the rule catalogue, and nothing here imports a rule.
"""
