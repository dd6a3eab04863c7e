"""Multi-host training for real: 2 processes on this machine (jax.distributed on localhost, 4
simulated CPU devices each, gloo collectives), one data x expert mesh over all 8 devices.

The job trains a tiny MoE, both processes are SIGKILLed after a checkpoint, a new 2-process job
resumes from that Orbax checkpoint, and its losses match a single-process run's; the same
checkpoint also restores onto 1 process. Only process 0 writes the run directory's files;
every process writes its own shards of the checkpoint."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from delphi.train.checkpoint import bytes_per_process, list_checkpoints, read_manifest
from delphi.train.config import MeshConfig
from delphi.train.rundir import read_metrics, read_status
from delphi.train.trainer import train
from tests.test_sharded import sharded_config

PROCESSES = 2
DEVICES_PER_PROCESS = 4
MESH = (2, 4)  # data x expert over all 8 devices
STEPS = 24  # the SIGKILL test: long enough that the kill lands mid-run
CHECKPOINT_EVERY = 4
FAST_STEPS = 4  # the default-run variant: one 2-process job, no kill
TIMEOUT_S = 600  # a loaded 2-core machine compiles slowly
REL_TOL = 1e-5
REPO = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    assert "jax" not in sys.modules
    from tests.test_multihost import multihost_config
    from delphi.train.trainer import train

    store, run, port, process_id, resume, steps = (
        Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6])
    )
    summary = train(multihost_config(store, port, process_id, steps), run, resume=resume, progress=False)
    import jax
    print(json.dumps({
        "process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
        "local_devices": jax.local_device_count(), "status": summary["status"], "val_loss": summary["val_loss"],
    }))
    """
)


def single_config(store: Path, steps: int):
    """The run on one device that the 2-process job must reproduce."""
    every = CHECKPOINT_EVERY if steps > CHECKPOINT_EVERY else steps // 2
    return sharded_config(
        store, steps=steps, log_every=2 if steps % 2 == 0 else 1, eval_every=steps // 2, checkpoint_every=every
    )


def multihost_config(store: Path, port: int, process_id: int, steps: int):
    data, expert = MESH
    cfg = single_config(store, steps)
    mesh = MeshConfig(
        data=data,
        expert=expert,
        distributed=True,
        coordinator_address=f"localhost:{port}",
        num_processes=PROCESSES,
        process_id=process_id,
    )
    return dataclasses.replace(cfg, mesh=mesh).validate()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_job(store: Path, run: Path, resume: bool, steps: int = STEPS) -> list[subprocess.Popen]:
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(store), str(run), str(port), str(i), "1" if resume else "0", str(steps)],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]


def kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:  # only the processes this test started, by their PIDs
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def finish(procs: list[subprocess.Popen], timeout_s: float) -> list[dict]:
    try:
        outputs = [proc.communicate(timeout=timeout_s) for proc in procs]
    finally:
        kill(procs)
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def committed(run: Path) -> list[int]:
    return [s for s, p in list_checkpoints(run) if (p / "manifest.json").is_file()]


def losses(run: Path) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run)]


def check_bytes_per_process(manifest: dict) -> dict[int, int]:
    assert manifest["processes"] == PROCESSES
    written = bytes_per_process(manifest)
    assert set(written) <= set(range(PROCESSES)) and sum(written.values()) > 0
    return written


def test_two_processes_match_one_and_restore_onto_one(store, tmp_path):
    """The default-run variant: one 2-process job (no kill), its losses against one process, and
    its mid-run checkpoint restored onto 1 process."""
    reference = train(single_config(store, FAST_STEPS), tmp_path / "one", progress=False)
    run = tmp_path / "two"
    results = finish(start_job(store, run, resume=False, steps=FAST_STEPS), timeout_s=TIMEOUT_S)
    assert sorted(r["process"] for r in results) == list(range(PROCESSES))
    assert all(
        r["devices"] == PROCESSES * DEVICES_PER_PROCESS and r["local_devices"] == DEVICES_PER_PROCESS for r in results
    )
    one, two = losses(tmp_path / "one"), losses(run)
    assert len(two) == FAST_STEPS // 2 and two == pytest.approx(one, rel=REL_TOL)
    assert all(r["val_loss"] == pytest.approx(reference["val_loss"], rel=REL_TOL) for r in results)
    mid, last = list_checkpoints(run)
    written = check_bytes_per_process(read_manifest(mid[1]))
    print(
        f"\n2 processes x {DEVICES_PER_PROCESS} devices, mesh {MESH[0]}x{MESH[1]}: train losses {two} vs {one}; "
        f"checkpoint bytes per process {written}"
    )

    # the step-2 checkpoint of the 2-process job, resumed on this process's single device
    restored = tmp_path / "restored"
    shutil.copytree(run, restored)
    shutil.rmtree(restored / last[1].relative_to(run))
    (restored / "summary.json").unlink()
    (restored / "status.json").unlink()  # as if stopped before its end: a completed run without its summary is refused
    summary = train(single_config(store, FAST_STEPS), restored, resume=True, progress=False)
    assert summary["status"] == "completed" and summary["steps"] == FAST_STEPS
    assert losses(restored) == pytest.approx(one, rel=REL_TOL)
    assert summary["val_loss"] == pytest.approx(reference["val_loss"], rel=REL_TOL)


@pytest.fixture(scope="module")
def job(store, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("multihost")
    reference = train(single_config(store, STEPS), work / "one", progress=False)
    run = work / "two"
    procs = start_job(store, run, resume=False)
    try:  # kill both at once as soon as a checkpoint is committed (its manifest written)
        deadline = time.time() + TIMEOUT_S
        while time.time() < deadline and all(p.poll() is None for p in procs) and not committed(run):
            time.sleep(0.005)
    finally:
        kill(procs)
    errors = [p.stderr.read()[-3000:] for p in procs]
    assert committed(run), f"no checkpoint before the deadline: {errors}"
    status = read_status(run)
    assert status["status"] == "running", f"the job finished before it was killed ({status}); make it longer"
    killed_step = max(committed(run))
    manifest = read_manifest(list_checkpoints(run)[-1][1])
    one_process = work / "one_process"
    shutil.copytree(run, one_process)  # the killed job's checkpoint, for the restore onto 1 process

    resumed = finish(start_job(store, run, resume=True), timeout_s=TIMEOUT_S)
    return {
        "work": work,
        "run": run,
        "reference": reference,
        "killed_step": killed_step,
        "resumed": resumed,
        "manifest": manifest,
        "one_process": one_process,
    }


@pytest.mark.slow
def test_two_processes_resume_after_sigkill_and_match_one_process(job):
    resumed, manifest = job["resumed"], job["manifest"]
    assert sorted(r["process"] for r in resumed) == list(range(PROCESSES))
    assert all(
        r["devices"] == PROCESSES * DEVICES_PER_PROCESS and r["local_devices"] == DEVICES_PER_PROCESS for r in resumed
    )
    assert all(r["status"] == "completed" for r in resumed)
    assert 0 < job["killed_step"] < STEPS
    one, two = losses(job["work"] / "one"), losses(job["run"])
    assert [r["step"] for r in read_metrics(job["run"])] == list(range(2, STEPS + 1, 2))  # written once, by process 0
    assert two == pytest.approx(one, rel=REL_TOL)
    assert one[-1] < one[0]
    for r in resumed:  # val loss is a replicated value: every process sees the same
        assert r["val_loss"] == pytest.approx(job["reference"]["val_loss"], rel=REL_TOL)
    summary = json.loads((job["run"] / "summary.json").read_text())
    assert summary["mesh"] == {"data": MESH[0], "expert": MESH[1], "model": 1}
    written = check_bytes_per_process(manifest)
    print(
        f"\ncheckpoint bytes per process: {written}; killed after step {job['killed_step']}; "
        f"max |rel diff| {max(abs(a - b) / abs(b) for a, b in zip(two, one)):.2e}"
    )


@pytest.mark.slow
def test_checkpoint_of_two_processes_restores_onto_one(job, store):
    run = job["one_process"]
    summary = train(single_config(store, STEPS), run, resume=True, progress=False)
    assert summary["status"] == "completed"
    assert losses(run) == pytest.approx(losses(job["work"] / "one"), rel=REL_TOL)
    assert summary["val_loss"] == pytest.approx(job["reference"]["val_loss"], rel=REL_TOL)
