"""The unmodified Decode under Dynamo, in a worker: breaks, recompiles and what stopped it."""
