"""Rules on the code a model step runs (GM1xx-GM7xx): host syncs, tensors made in the step, caches, branches,
positions, randomness and logging, fused attention."""
