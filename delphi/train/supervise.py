"""`delphi train` in a child process, so that a death no handler can catch is still recorded.

An abort inside XLA (SIGABRT from C++, e.g. an allocation that fails), a segmentation fault or the
kernel's out-of-memory killer (SIGKILL) ends the training process with no Python code run: the run
directory would keep `status: pending` (or running) and a `train.lock`. So the CLI forks before
JAX is imported: the child trains (and prints everything, its --json result included) and the
parent, which holds no JAX state, waits for it. If the child dies of a signal, the parent writes
`status: failed` with the reason and "continue with --resume" into each run directory whose status
still says pending or running, removes the stale lock, and exits 128 + the signal's number. A stop
signal sent to the parent alone (SIGTERM from a scheduler, SIGHUP) is passed on to the child; Ctrl-C
reaches both (one process group) and the child handles it (delphi.train.interrupt).

The ladder runner does the same for its worker processes (delphi.ladder.runner). In-process callers
(tests, the ladder worker itself) train directly: forking a process that already runs JAX's threads
is not safe, so `can_supervise` says no once JAX is imported. DELPHI_TRAIN_SUPERVISE=0 switches it off.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from delphi.errors import SYSTEM_ERRNOS, CheckFailed, DelphiError, message_line, system_error_line
from delphi.train.rundir import record_death, signal_death_reason

SUPERVISE_ENV = "DELPHI_TRAIN_SUPERVISE"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # delphi.train.interrupt's


def can_supervise() -> bool:
    """Fork only a process with one thread and no JAX loaded (a fork of JAX's threads can hang)."""
    return (
        hasattr(os, "fork")
        and os.environ.get(SUPERVISE_ENV, "1") != "0"
        and "jax" not in sys.modules
        and threading.active_count() == 1
    )


def _child(work: Callable[[], int]) -> None:
    """In the child: run `work` as the CLI would (its exit-code contract) and end the process."""
    code = 1
    try:
        code = work()
    except DelphiError as e:
        print(f"delphi: error: {message_line(e)}", file=sys.stderr)
        code = 2
    except CheckFailed as e:
        print(f"delphi: failed: {message_line(e)}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("delphi: interrupted", file=sys.stderr)
        code = 130
    except OSError as e:  # the system refused a write (a full disk...): one line, as the CLI prints it
        if isinstance(e, BrokenPipeError) or e.errno not in SYSTEM_ERRNOS:
            traceback.print_exc()
            code = 1
        else:
            print(f"delphi: error: {system_error_line(e)}", file=sys.stderr)
            code = 2
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def supervised(work: Callable[[], int], run_dirs: list[Path]) -> int:
    """Run `work` (returns an exit code; prints its own output) in a child process and return its
    exit code; a child killed by a signal is recorded in `run_dirs` (delphi.train.rundir.record_death)."""
    child = [0]
    early: list[int] = []  # stop signals received before the child's pid was known

    def forward(signum: int, _frame: object) -> None:
        if not child[0]:
            early.append(signum)
            return
        try:
            os.kill(child[0], signum)
        except ProcessLookupError:
            pass

    sys.stdout.flush()
    sys.stderr.flush()
    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}  # before the fork: no window
    try:
        pid = os.fork()
        if pid == 0:
            for s, handler in previous.items():  # the child defers stop signals itself
                signal.signal(s, handler)
            for signum in early:
                if callable(previous[signum]):
                    previous[signum](signum, None)
            _child(work)
        child[0] = pid
        for signum in early:
            forward(signum, None)
        _, status = os.waitpid(pid, 0)  # retried by Python after a forwarded signal (PEP 475)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    signum = os.WTERMSIG(status)
    reason = signal_death_reason(signum)
    recorded = [str(d) for d in run_dirs if d.is_dir() and record_death(d, reason)]
    where = f"; recorded in {', '.join(recorded)}/status.json" if recorded else ""
    print(f"delphi: error: {reason}{where}", file=sys.stderr)
    return 128 + signum
