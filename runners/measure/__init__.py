"""What is measured and counted: timings, memory, Dynamo's compiles, the ops and bytes of a Decode step."""
