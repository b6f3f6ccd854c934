"""A stand-in for fairscale's model-parallel layers, written for graphmode's corpus tests (not
fairscale's code). Meta's reference models (llama-models) build their layers from
fairscale.nn.model_parallel; fairscale ships only an sdist whose package imports much more. With one
process (model-parallel world size 1) those layers are exactly nn.Linear / nn.Embedding."""
