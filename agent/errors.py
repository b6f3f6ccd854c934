"""Errors the command line reports as one line (no traceback): problems with the user's input."""


class UserError(Exception):
    """Bad input or a failing target: the message says what and where."""
