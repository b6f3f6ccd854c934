"""The test report of a finished session: report.md and report.json (write) and the Decode chart (chart)."""
