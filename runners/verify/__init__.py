"""Verification: both sides run in workers, compared, and kept as one record for the report."""
