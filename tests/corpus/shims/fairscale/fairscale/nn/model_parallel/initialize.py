"""Stand-in (graphmode corpus tests): one process, so model-parallel size 1 and rank 0."""


def get_model_parallel_world_size() -> int:
    return 1


def get_model_parallel_rank() -> int:
    return 0


def model_parallel_is_initialized() -> bool:
    return True
