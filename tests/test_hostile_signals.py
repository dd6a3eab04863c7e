"""Signals and resources are bounded (issue 41, class 4): a command stopped by Ctrl-C, SIGTERM or
SIGHUP ends with its documented exit code and one line on stderr, leaves no process behind and the
user's files as they were; a bootstrap is held to the machine's cores and memory, and to enough
replicates for an interval.

The signal tests run the CLI in a subprocess and signal it once it shows that it is working (a
file it writes, its worker processes). Processes are found through /proc (Linux).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from delphi.cli import main

REPO = Path(__file__).resolve().parents[1]
ISOFLOPS = REPO / "tests" / "data" / "isoflops.csv"
QUERY = "experiment == 'epochai_chinchilla__massivetext__chinchilla' and not outlier"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds processes through /proc")


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0]


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := _ppid_and_state(int(entry))) and info[0] == pid and info[1] != "Z":
            out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    """Running: a zombie (dead, waiting for a parent to reap it) counts as gone."""
    info = _ppid_and_state(pid)
    return info is not None and info[1] != "Z"


def started_workers(pid: int) -> list[int]:
    """Children of `pid` that have loaded numpy: bootstrap workers past the hand-over of their start-up
    data, which a parent killed by SIGKILL mid-hand-over would cut (the worker then prints an EOFError
    traceback that no code of the parent can prevent). Spawn's resource tracker, also a child, never
    loads numpy."""
    out = []
    for child in children(pid):
        try:
            if "_multiarray_umath" in Path(f"/proc/{child}/maps").read_text():
                out.append(child)
        except OSError:
            pass
    return out


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def one_line(err: str, *names: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


# How long a signalled command may take to exit. Generous: under `pytest -n 2` beside the JAX tests a
# 2-core machine is slow; a command that ignores its signal still fails (the slowed prepare sleeps 60 s
# and would then exit 0).
EXIT_AFTER_SIGNAL_S = 120
# Prepended to a subprocess's code: SIGUSR1 prints its Python stacks, so a hang is diagnosed, not guessed.
DUMP_STACKS_ON_SIGUSR1 = "import faulthandler, signal; faulthandler.register(signal.SIGUSR1)\n"


def default_stop_signals() -> None:
    """preexec_fn of every command these tests signal: SIGINT, SIGTERM and SIGHUP at their defaults,
    whatever the test process inherited (a shell runs a background job without job control with
    SIGINT ignored, and Python then never installs its Ctrl-C handler: the command would not stop)."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def finish(proc: subprocess.Popen) -> str:
    """The stderr of a signalled subprocess once it has exited; if it has not within
    EXIT_AFTER_SIGNAL_S, its Python stacks in the failure."""
    try:
        return proc.communicate(timeout=EXIT_AFTER_SIGNAL_S)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        raise AssertionError(
            f"still running {EXIT_AFTER_SIGNAL_S} s after the signal; its stacks:\n{proc.communicate()[1]}"
        ) from None


def stop(proc: subprocess.Popen) -> None:
    """Kill a subprocess this test started, if a failed assertion left it running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- data prepare


# Runs `delphi ARGS` with the store's last write before the swap slowed down: once train.bin and
# val.bin of the rebuild are written aside, READY appears and the process sleeps, so the signal
# lands in the middle of the rebuild.
SLOW_PREPARE = (
    DUMP_STACKS_ON_SIGUSR1
    + """
import sys, time, pathlib
import delphi.data.store as store
ready = pathlib.Path(sys.argv[1])
write = store.atomic_write_text
def slow(*args, **kwargs):
    write(*args, **kwargs)
    ready.touch()
    time.sleep(60)
store.atomic_write_text = slow
from delphi.cli import main
sys.exit(main(sys.argv[2:]))
"""
)


@pytest.fixture
def corpus(tmp_path) -> Path:
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(6):
        (src / f"doc{i}.txt").write_text(f"document {i}\n" + "some text to tokenize. " * (50 + i))
    return src


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_interrupted_rebuild_leaves_the_store_intact(corpus, tmp_path, signum, code):
    """Before: Ctrl-C during `data prepare --out EXISTING` deleted meta.json first, and every rerun
    (even with --force) was exit 2, 'a non-empty directory that is not a token store'."""
    out = tmp_path / "store"
    assert main(["data", "prepare", "--source", str(corpus), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("the user's own file\n")
    before = digest(out)
    (corpus / "doc9.txt").write_text("a new document\n" * 40)  # the rebuild differs from the store
    script = tmp_path / "slow_prepare.py"
    script.write_text(SLOW_PREPARE)
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(ready),
            "data",
            "prepare",
            "--source",
            str(corpus),
            "--out",
            str(out),
            "--force",
        ],
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_stop_signals,
    )
    try:
        wait_until(ready.exists, 60, "the rebuild to write its files aside")
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".building")], "not built aside"
        proc.send_signal(signum)
        err = finish(proc)
    finally:
        stop(proc)
    assert proc.returncode == code, err
    one_line(err, "interrupted" if signum == signal.SIGINT else "SIGTERM")
    assert digest(out) == before  # the old store, byte for byte, and the user's file
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".store.")]  # nothing left aside
    # usable: a rerun (same source) rebuilds in place, keeping the user's file
    assert main(["data", "prepare", "--source", str(corpus), "--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "the user's own file\n"
    assert digest(out)["meta.json"] != before["meta.json"]


def test_held_signals_arrive_after_the_block():
    from delphi.signals import held

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        done = []
        with pytest.raises(KeyboardInterrupt):
            with held():
                signal.raise_signal(signal.SIGINT)
                done.append("the renames finished")
        assert done == ["the renames finished"]
        assert signal.getsignal(signal.SIGINT) is interrupt  # restored
    finally:
        signal.signal(signal.SIGINT, previous)


# --------------------------------------------------------------------------- bootstrap workers


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for 2 workers")
@pytest.mark.parametrize(
    "signum, code",
    [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129), (signal.SIGKILL, -signal.SIGKILL)],
    ids=["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL"],
)
def test_bootstrap_workers_die_with_the_fit(tmp_path, signum, code):
    """Before: SIGTERM to `delphi fit --bootstrap N` ended the parent alone; its workers lived on."""
    out = tmp_path / "fit.json"
    cli = DUMP_STACKS_ON_SIGUSR1 + "import sys\nfrom delphi.cli import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            cli,
            "fit",
            "isoflop",
            str(ISOFLOPS),
            "--query",
            QUERY,
            "--bootstrap",
            "4000",
            "--workers",
            "2",
            "--out",
            str(out),
        ],
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_stop_signals,
    )
    try:
        wait_until(lambda: len(started_workers(proc.pid)) >= 2 or proc.poll() is not None, 60, "two bootstrap workers")
        workers = started_workers(proc.pid)
        assert len(workers) >= 2, proc.communicate()[1]
        proc.send_signal(signum)
        err = finish(proc)
    finally:
        stop(proc)
    assert proc.returncode == code, err
    if signum == signal.SIGKILL:  # nothing can print; the workers end by their parent-death signal
        assert "Traceback" not in err
    else:
        one_line(err, "interrupted" if signum == signal.SIGINT else signal.Signals(signum).name)
    wait_until(lambda: not any(alive(w) for w in workers), 10, f"workers {workers} to end")
    assert not out.exists()


def _mean_loss(table: pd.DataFrame) -> dict[str, float]:
    return {"mean": float(table["loss"].mean())}


def test_bootstrap_workers_are_capped_by_the_cores(monkeypatch):
    """Before: `--workers 10000 --bootstrap 100000` forked ~4,000 processes on 2 cores."""
    from delphi.fits import bootstrap as bs

    table = pd.DataFrame({"loss": np.linspace(2.0, 3.0, 40)})
    _, info = bs.bootstrap(_mean_loss, table, 200, 0, workers=10_000)
    assert 1 <= info["bootstrap_workers"] <= bs.usable_cpus()
    monkeypatch.setattr(bs, "usable_cpus", lambda: 1)
    samples, info = bs.bootstrap(_mean_loss, table, 200, 0, workers=10_000)
    assert info["bootstrap_workers"] == 1 and len(samples["mean"]) == 200


def test_a_bootstrap_larger_than_memory_is_refused(tmp_path, capsys):
    """Before: --bootstrap 1000000000 grew memory until MemoryError."""
    from delphi.errors import DelphiError
    from delphi.fits.bootstrap import bootstrap_memory_bytes, check_bootstrap_memory

    assert bootstrap_memory_bytes(1000, 85) == 1000 * (2 * 8 * 85 + 1024)
    check_bootstrap_memory(1000, 85)  # ~2 MB: fine anywhere
    with pytest.raises(DelphiError, match="GiB"):
        check_bootstrap_memory(10**12, 85)
    out = tmp_path / "fit.json"
    code = main(["fit", "isoflop", str(ISOFLOPS), "--query", QUERY, "--bootstrap", str(10**12), "--out", str(out)])
    assert code == 2
    one_line(capsys.readouterr().err, "--bootstrap 1000000000000", "GiB", "available")
    assert not out.exists()


@pytest.mark.parametrize("n", [1, 19])
def test_too_few_replicates_for_an_interval_are_refused(tmp_path, capsys, n):
    """Before: --bootstrap 1 printed a zero-width '90%' interval excluding its own estimate."""
    out = tmp_path / "fit.json"
    assert main(["fit", "isoflop", str(ISOFLOPS), "--query", QUERY, "--bootstrap", str(n), "--out", str(out)]) == 2
    one_line(capsys.readouterr().err, f"--bootstrap {n}", "at least 20")
    assert not out.exists()


def test_the_cli_and_the_bootstrap_agree_on_the_minimum():
    from delphi.fits import bootstrap, commands

    assert commands.MIN_BOOTSTRAP_FOR_INTERVAL == bootstrap.MIN_BOOTSTRAP_FOR_INTERVAL == 20


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("to", ["session", "parent"])
def test_sighup_stops_training_and_releases_the_lock(store, tmp_path, to):
    """Before: SIGHUP (a closed terminal, an SSH session that dropped) ended `delphi train` at once:
    status.json stayed pending/running and train.lock stayed. `session` is a hang-up (the whole
    process group: the supervising parent and the trainer); `parent` a `kill -HUP` of the parent."""
    from delphi.train.rundir import LOCK_FILE, RESUME_HINT, read_status
    from tests.test_train import tiny_config, write_config

    config = write_config(tmp_path / "cfg.yaml", tiny_config(store, steps=400, eval_every=200, checkpoint_every=200))
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "delphi.cli", "train", str(config), "--out", str(run), "--no-progress"],
        env={**ENV, "DELPHI_PEAK_FLOPS_F32": "1e11"},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_stop_signals,
    )
    try:
        wait_until(lambda: (run / LOCK_FILE).exists() or proc.poll() is not None, 60, "the trainer to lock its run")
        trainers = children(proc.pid)
        if to == "session":
            os.killpg(proc.pid, signal.SIGHUP)
        else:
            proc.send_signal(signal.SIGHUP)
        err = finish(proc)
    finally:
        stop(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if "SIGHUP" in line]) == 1, err
    status = read_status(run)
    assert status["status"] == "failed" and "SIGHUP" in status["reason"] and status["reason"].endswith(RESUME_HINT)
    assert not (run / LOCK_FILE).exists()
    assert not any(alive(t) for t in trainers)


def test_a_running_status_whose_trainer_is_gone_is_stale(tmp_path):
    from delphi.train.rundir import LOCK_FILE, stale_running, write_status

    run = tmp_path / "run"
    run.mkdir()
    assert stale_running(run) is None  # no status
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # exited and reaped: its pid is free
    write_status(run, "running", 10)
    assert stale_running(run) is None  # no lock: nothing says which process trains it
    (run / LOCK_FILE).write_text(f"{gone.pid}\n")
    reason = stale_running(run)
    assert reason is not None and str(gone.pid) in reason and "--resume" in reason
    (run / LOCK_FILE).write_text(f"{os.getpid()}\n")
    assert stale_running(run) is None  # alive
    (run / LOCK_FILE).write_text(f"{gone.pid}\n")
    write_status(run, "completed", 10)
    assert stale_running(run) is None  # only a running status can be stale


def test_a_stop_signal_that_reenters_the_handler_is_announced_once(monkeypatch):
    """CI saw "SIGHUP received" twice after a session hang-up: the terminal's SIGHUP and the one the
    supervising parent forwards reached the trainer together, and Python ran the second handler
    inside the first, while it was writing and before it had recorded the signal. Here the second
    arrives exactly there."""
    from delphi.train import interrupt

    writes = []

    def write(fd, data):
        writes.append(data)
        if len(writes) == 1:
            interrupt._note(signal.SIGHUP, None)  # the second signal, run at the write's bytecode boundary
        return len(data)

    monkeypatch.setattr(interrupt.os, "write", write)
    with interrupt.deferred_signals():
        interrupt._note(signal.SIGHUP, None)
        assert interrupt.requested() == "SIGHUP" and interrupt._received == ["SIGHUP", "SIGHUP"]
    assert len(writes) == 1 and b"SIGHUP received" in writes[0]
    assert interrupt.requested() is None  # forgotten once the block ends
