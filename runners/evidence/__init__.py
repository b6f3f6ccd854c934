"""The traced eager run of the unmodified model: collected in a worker, kept as data, read as findings."""
