"""Errors a user can act on.

A `DelphiError` is bad input or usage: the CLI prints its message on one line
and exits with status 2, before anything is written. Everything else is a bug.
"""

import errno
import reprlib
from typing import Any

# How many characters of an offending value an error message quotes. A value in a user's file can
# be anything (a 39 MB string from a 675-byte YAML alias bomb): the message names it, it does not
# reproduce it.
QUOTED_VALUE_MAX_CHARS = 200
# The most an error line printed by the CLI may run to: a message quotes a few values, each cut by
# `quoted`; this bounds a message that quoted something without it.
MESSAGE_MAX_CHARS = 2_000


class DelphiError(Exception):
    """Bad input: the message names the file, key or value and what was expected."""


class CheckFailed(Exception):
    """The checked thing failed (a prediction missed, a seal broke): exit status 1. `result`, when
    given, is what the command found (a gate report, a verdict): `--json` prints it."""

    def __init__(self, message: str, result: dict | None = None) -> None:
        super().__init__(message)
        self.result = result


def quoted(value: Any, limit: int = QUOTED_VALUE_MAX_CHARS) -> str:
    """`repr(value)` for an error message, at most about `limit` characters. The one way every
    error message quotes a value from a user's input.

    Containers are abbreviated while the text is built (reprlib: a few items per level, a few
    levels), so a value that is small as objects but huge as text (an aliased YAML document) is
    never written out in full."""
    short = reprlib.Repr()
    short.maxlevel, short.maxdict, short.maxlist, short.maxtuple, short.maxset = 3, 4, 6, 6, 6
    short.maxstring = short.maxother = short.maxlong = limit
    text = short.repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}..."


def message_line(error: BaseException, limit: int = MESSAGE_MAX_CHARS) -> str:
    """An error's message as the CLI prints it: at most `limit` characters (the middle cut, so the
    file named at the start and the advice at the end survive)."""
    text = str(error)
    if len(text) <= limit:
        return text
    half = (limit - 20) // 2
    return f"{text[:half]} ...[{len(text) - 2 * half:,} characters cut]... {text[-half:]}"


# An OSError with one of these errnos is the system refusing a read or write (a full disk, a quota, a
# file too large, a read-only mount, a name too long, no permission, a loop of links), not a bug: the
# CLI prints one line naming the file and exits 2, wherever it was raised.
SYSTEM_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.ELOOP}
)


def system_error_line(error: OSError) -> str:
    """The one line the CLI prints for a refused read or write: the file, then the system's words."""
    where = error.filename if error.filename is not None else "delphi"
    return message_line(f"{where}: {error.strerror or error}")
