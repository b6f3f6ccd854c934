"""Jinja2 templates for the design document and the test report."""
