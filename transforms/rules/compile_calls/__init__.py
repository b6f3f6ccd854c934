"""Rules on how the code calls torch.compile (GM8xx), and what they share."""
