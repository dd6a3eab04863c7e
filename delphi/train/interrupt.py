"""Ctrl-C (SIGINT), SIGTERM and SIGHUP while training: noted, acted on at the next safe point.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be.
During `delphi train`'s start-up that is often inside JAX: tracing, XLA compilation, a callback from
C++ or an import; the exception then unwinds through native frames, or ends the interpreter while
XLA's threads still run, and the process dies with a segmentation fault (exit 139). So from the moment `delphi train` starts until training returns, these signals only set
a flag (`deferred_signals`). The trainer looks at it between its stages (`check`: after validation,
after writing the run directory, after building the state, after compiling) and at every call
boundary of the training loop, and stops there: a checkpoint in the loop, `status: failed` with
"continue with --resume" before it, the run lock released, and exit 130 from the CLI.

SIGHUP (the terminal or SSH session closed) is a stop signal like SIGTERM: its default action would
end the trainer with no Python code run, leaving `status: running` and a train.lock.

A stage in native code (a compilation of several seconds) finishes before the signal is acted on:
Python runs signal handlers only between bytecodes, so that part is not a choice.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
from collections.abc import Iterator

from delphi.train.rundir import RESUME_HINT

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_received: list[str] = []  # signal names received while deferred, in order
_arrivals = [itertools.count()]  # numbers the signals received while deferred (next() is one C call)
_depth = [0]  # nested deferred_signals (train_group inside `delphi train`)


class Interrupted(KeyboardInterrupt):
    """A stop signal acted on at a safe point before the training loop (the CLI exits 130)."""


def _note(signum: int, _frame: object) -> None:
    # Python runs a pending handler at any bytecode boundary, also inside this one: a hang-up of the
    # session (SIGHUP from the terminal and the same signal forwarded by the supervising parent)
    # re-entered it between a test of `_received` and the append, and said so twice. Which call is
    # the first is decided in one step, before anything else.
    first = next(_arrivals[0]) == 0
    name = signal.Signals(signum).name
    _received.append(name)
    if first:
        # os.write, not print: a handler may run while the main thread is inside a print.
        os.write(
            2,
            f"\ndelphi: {name} received; stopping at the next safe point (after the current "
            "compilation or training step)\n".encode(),
        )


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP set a flag instead of raising, for the duration (main thread only; a
    nested use shares the outer one's flag). The previous handlers are restored on exit; a signal
    that arrived too late to stop anything (during the final save) is then forgotten."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth[0] > 0:
        _depth[0] += 1
        try:
            yield
        finally:
            _depth[0] -= 1
        return
    _received.clear()  # before the handlers: a signal from here on is kept
    _arrivals[0] = itertools.count()
    previous = {s: signal.signal(s, _note) for s in STOP_SIGNALS}
    _depth[0] = 1
    try:
        yield
    finally:
        _depth[0] = 0
        for s, handler in previous.items():
            signal.signal(s, handler)
        _received.clear()
        _arrivals[0] = itertools.count()


def requested() -> str | None:
    """The first stop signal received while deferred (its name), or None."""
    return _received[0] if _received else None


def check(stage: str) -> None:
    """Raise Interrupted if a stop signal arrived; `stage` says where the run stood, for the
    status reason ("... during compilation; continue with --resume")."""
    name = requested()
    if name is not None:
        raise Interrupted(f"stopped by signal {name} during {stage}; {RESUME_HINT}")
