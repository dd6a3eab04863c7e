"""`delphi ladder run --executor ray`: a micro ladder on a local 2-CPU Ray instance, with a killed worker."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from micro_ladder import micro_ladder

from delphi.cli import main as cli_main
from delphi.ladder.collect import collect_ladder
from delphi.ladder.manifest import read_manifest

ATTEMPT_HEADER = "--- ray attempt on "
# Generous waits: on a loaded 2-core machine (a study beside the tests) Ray took over 3 minutes to
# start its first workers; a quiet one takes seconds. Only how long a failure takes to show depends on them.
RAY_WAIT_S = 300


def _attempt_pids(log: Path) -> list[int]:
    """PIDs of the Ray workers that ran this rung, one per attempt, from the rung's log."""
    if not log.is_file():
        return []
    return [
        int(line.split(" pid ")[1].split()[0])
        for line in log.read_text().splitlines()
        if line.startswith(ATTEMPT_HEADER)
    ]


def _parent_pid(pid: int) -> int | None:
    """The parent of `pid` from /proc (None once it has gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])  # after "pid (comm) state": ppid


def _ancestors(pid: int) -> list[int]:
    chain = []
    while (parent := _parent_pid(pid)) and parent not in chain:
        chain.append(parent)
        pid = parent
    return chain


def _kill_our_ray_worker(pid: int, lock_file: Path) -> None:
    """SIGKILL the Ray worker `pid`, and nothing else.

    The PID comes from the rung's own log; it must also be the PID in the rung's lock file (the
    trainer's process), a descendant of this test process (the Ray instance this test started
    with ray.init: raylet, then its workers), never this process nor one of its ancestors (the
    pytest-xdist worker and its controller), and a Ray worker by its command line. A pidfd pins
    the process while it is checked, so a PID reused in between cannot be hit.
    """
    me = os.getpid()
    assert pid not in (me, *(_ancestors(me))), f"refusing to kill {pid}: this test process or its ancestor"
    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    try:
        assert lock_file.read_text().strip() == str(pid), "the lock file names another process"
        assert me in _ancestors(pid), f"refusing to kill {pid}: not started by this test's Ray instance"
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        assert "default_worker.py" in cmdline or cmdline.startswith("ray::"), (
            f"{pid} is not a Ray worker: {cmdline[:200]}"
        )
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _wait_for(predicate, timeout_s: float, what: str, driver: threading.Thread) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if not driver.is_alive():
            raise AssertionError(f"the ladder ended while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.02)


def test_ray_ladder_survives_a_killed_worker(tmp_path, monkeypatch, capsys):
    ray = pytest.importorskip("ray")
    from delphi.ladder.ray_executor import run_ray_ladder

    ladder = micro_ladder(tmp_path, [1e9, 2e9], name="micro-ray")
    rows = read_manifest(ladder)
    assert len(rows) == 2
    victim, held = sorted(rows, key=lambda r: -float(r["flops"]))  # the largest rung is submitted first
    victim_id, held_id = victim["run_id"], held["run_id"]
    victim_dir = ladder / "runs" / victim_id

    # Ray workers inherit this environment (local instance); DELPHI_* is also forwarded to the tasks.
    monkeypatch.setenv("DELPHI_PEAK_FLOPS_F32", "1e11")  # skip the per-run matmul peak measurement
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token written under $HOME for a throwaway instance
    # ray.init makes this (pytest-xdist worker) process exit on SIGTERM and leaves that handler behind;
    # put the runner's own handlers back afterwards so later tests in this worker see no difference.
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    process_group = os.getpgrp()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    try:
        # Another "executor" holds one rung's lock (as a second `delphi ladder run` would): Ray must not run it
        # while it is held, and must come back to it once it is released.
        (ladder / "locks").mkdir()
        lock = open(ladder / "locks" / f"{held_id}.lock", "a+")
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)

        outcome: dict = {}

        def drive() -> None:
            try:
                outcome["result"] = run_ray_ladder(
                    ladder, cpus_per_rung=1, retries=0, worker_retries=2, progress_every_s=2.0
                )
            except BaseException as e:  # surfaced in the main thread below
                outcome["error"] = e

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        try:
            # Kill the victim's worker process once its trainer has started writing the run dir. retries=0:
            # only Ray's own resubmission after a worker death (max_retries) can bring the rung back.
            _wait_for(
                lambda: _attempt_pids(ladder / "logs" / f"{victim_id}.log") and (victim_dir / "status.json").is_file(),
                RAY_WAIT_S,
                f"the first attempt of {victim_id}",
                driver,
            )
            killed = _attempt_pids(ladder / "logs" / f"{victim_id}.log")[0]
            _kill_our_ray_worker(killed, ladder / "locks" / f"{victim_id}.lock")
            # The held rung was tried and turned away, never started.
            _wait_for(
                lambda: (
                    "locked by another process" in (ladder / "logs" / f"{held_id}.log").read_text()
                    if (ladder / "logs" / f"{held_id}.log").is_file()
                    else False
                ),
                RAY_WAIT_S,
                f"{held_id} to be turned away",
                driver,
            )
            assert not (ladder / "runs" / held_id / "status.json").exists()
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            lock.close()
            driver.join(timeout=2 * RAY_WAIT_S)
        assert not driver.is_alive(), "the Ray ladder did not finish"
        if "error" in outcome:
            raise outcome["error"]
        result = outcome["result"]
        assert result["completed"] == 2 and result["failed"] == {} and result["executor"] == "ray", result

        # The victim ran twice (killed, then retried by Ray in a new worker); the held rung trained once.
        pids = _attempt_pids(ladder / "logs" / f"{victim_id}.log")
        assert len(pids) == 2 and pids[0] == killed and pids[1] != killed, pids
        assert (ladder / "locks" / f"{victim_id}.lock").read_text().strip() == str(pids[1])
        held_log = (ladder / "logs" / f"{held_id}.log").read_text()
        assert held_log.count('"status": "completed"') == 1
        for run_id in (victim_id, held_id):
            steps = [
                json.loads(line)["step"]
                for line in (ladder / "runs" / run_id / "metrics.jsonl").read_text().splitlines()
            ]
            cfg_steps = yaml.safe_load((ladder / "configs" / f"{run_id}.yaml").read_text())["steps"]
            assert steps == sorted(set(steps)) and steps[-1] == cfg_steps  # one consistent run, no repeated steps

        err = capsys.readouterr().err
        assert "rungs done" in err and "ETA" in err and f"{victim_id}: completed" in err

        # Every rung exactly once in the collected table, all completed with a sane loss.
        table = collect_ladder(ladder)
        assert sorted(table["run_id"]) == sorted(r["run_id"] for r in rows)
        assert (table["status"] == "completed").all() and table["loss"].between(0.1, 6.0).all()

        # Rerunning a finished ladder submits nothing (same skip rule as the local executor).
        again = run_ray_ladder(ladder, cpus_per_rung=1, progress=False)
        assert again["completed"] == 2 and again["wall_s"] < 5
        assert len(_attempt_pids(ladder / "logs" / f"{victim_id}.log")) == 2
    finally:
        ray.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        assert os.getpgrp() == process_group, "Ray moved the test process into another process group"


def test_ray_options_are_validated_before_anything_is_written(tmp_path, capsys):
    ladder = tmp_path / "ladder"
    ladder.mkdir()  # no manifest needed: the options are refused first
    for args in (
        ["--executor", "local", "--address", "auto"],
        ["--executor", "local", "--gpus-per-rung", "1"],
        ["--executor", "ray", "--workers", "2"],
        ["--executor", "ray", "--cpus-per-rung", "-1"],
        ["--executor", "ray", "--cpus-per-rung", "0"],
        ["--executor", "ray", "--gpus-per-rung", "1.5"],
        ["--executor", "ray", "--worker-retries", "-1"],
    ):
        try:
            code = cli_main(["ladder", "run", str(ladder), *args])
        except SystemExit as e:  # a number refused by its argparse type
            code = e.code
        assert code == 2, args
        assert args[-2] in capsys.readouterr().err
    assert list(ladder.iterdir()) == []


def test_ray_missing_is_a_clear_error(tmp_path):
    # Simulate an install without the extra: `import ray` raises ImportError in this subprocess.
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from delphi.cli import main\n"
        f"sys.exit(main(['ladder', 'run', {str(tmp_path)!r}, '--executor', 'ray']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Ray is not installed" in proc.stderr and "pip install 'delphi[ray]'" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_unreachable_cluster_is_a_clear_error(tmp_path, capsys):
    pytest.importorskip("ray")
    ladder = micro_ladder(tmp_path, [1e9, 2e9], name="micro-ray")
    before = sorted(p.relative_to(ladder) for p in ladder.rglob("*"))
    # Port 1 on this host: nothing listens there, so the connection is refused at once.
    assert cli_main(["ladder", "run", str(ladder), "--executor", "ray", "--address", "127.0.0.1:1"]) == 2
    assert "--address: cannot reach the Ray cluster at 127.0.0.1:1" in capsys.readouterr().err
    assert sorted(p.relative_to(ladder) for p in ladder.rglob("*")) == before
