"""The codemod that gives a model its Prefill and Decode entry points."""
