"""Errors a user can act on.

A `DelphiError` is bad input or usage: the CLI prints its message on one line
and exits with status 2, before anything is written. Everything else is a bug.
"""


class DelphiError(Exception):
    """Bad input: the message names the file, key or value and what was expected."""


class CheckFailed(Exception):
    """The checked thing failed (a prediction missed, a seal broke): exit status 1."""
