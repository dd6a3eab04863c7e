"""Stop signals outside training: work that holds resources ends cleanly, renames finish whole.

Python's defaults: SIGINT raises KeyboardInterrupt (the CLI exits 130), while SIGTERM and SIGHUP
end the process at once, with no `finally` run: a parent would leave its worker processes running
(`delphi fit --bootstrap`) and a half-built token store's temporary directory behind. Two context managers (main thread only; elsewhere they do nothing):

    stop_signals_raise()   SIGTERM and SIGHUP raise `Stopped` where the main thread is, so cleanup
                           (terminating a process pool, removing a temporary directory) runs; on the
                           way out `Stopped` becomes exit 128 + the signal (143 for SIGTERM) with one
                           line on stderr. SIGINT keeps raising KeyboardInterrupt (exit 130).
    held()                 SIGINT, SIGTERM and SIGHUP are noted and delivered when the block ends: a
                           few renames that must happen together are never cut in the middle.

Training has its own deferred handling (delphi.train.interrupt): it stops at safe points.

A child process that must not outlive its parent (a bootstrap worker; a study's side-by-side seed
trainers, which `delphi train` arms from PARENT_PID_ENV) calls `die_with_parent`: on Linux the
kernel sends it SIGTERM when the parent dies, however it dies (SIGKILL included).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The pid of the process whose death must stop this one (`delphi train` as a study's seed trainer).
PARENT_PID_ENV = "DELPHI_PARENT_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> bool:
    """Have the kernel send this process SIGTERM when its parent dies, however it dies (SIGKILL
    included; Linux's PR_SET_PDEATHSIG, elsewhere nothing). False when the parent `parent` (its pid)
    died before this was armed: the caller should stop now."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    return os.getppid() == parent


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived (not an Exception: `except Exception` must not swallow it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_signals_raise(what: str = "") -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Stopped` for the duration; a `Stopped` leaving the block is turned
    into SystemExit(128 + signum) after one line on stderr (`what` says what was stopped)."""
    if not _in_main_thread():
        yield
        return
    raising = (signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.getsignal(s) for s in raising}
    if any(h is _raise_stopped for h in previous.values()):  # nested: the outer block converts
        yield
        return
    for s in raising:
        signal.signal(s, _raise_stopped)
    try:
        yield
    except Stopped as e:
        os.write(2, f"delphi: stopped by {e.name}{'; ' + what if what else ''}\n".encode())
        raise SystemExit(e.exit_code) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Stop signals wait until the block ends, then are delivered (in arrival order, each once)."""
    if not _in_main_thread():
        yield
        return
    received: list[int] = []

    def note(signum: int, _frame: object) -> None:
        if signum not in received:
            received.append(signum)

    previous = {s: signal.signal(s, note) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for signum in received:
            signal.raise_signal(signum)
