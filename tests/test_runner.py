"""The local ladder executor: slots of cores, persistent workers, the shared driver's rules."""

from __future__ import annotations

import ast
import importlib.metadata
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

from delphi.errors import DelphiError
from delphi.ladder.driver import Rung, placement_order
from delphi.ladder.manifest import read_manifest
from delphi.ladder.plan import cell_id_of
from delphi.ladder.runner import WORKER_LOG_PREFIX, core_slots, default_workers, run_ladder

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def worker_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DELPHI_PEAK_FLOPS_F32", "1e11")  # skip the per-worker matmul peak measurement
    monkeypatch.setenv("DELPHI_JAX_CACHE", str(tmp_path / "jax-cache"))  # a private compilation cache
    return tmp_path / "jax-cache"


def test_core_slots_split_the_cores_without_oversubscription():
    assert core_slots(2, [0, 1]) == [[0], [1]]
    assert core_slots(1, [0, 1]) == [[0, 1]]
    assert core_slots(2, [0, 1, 2]) == [[0], [1, 2]]  # disjoint, as even as possible
    assert core_slots(4, [3, 5]) == [[3], [5], [3], [5]]  # more workers than cores: one core each, shared
    assert sorted(c for s in core_slots(3, list(range(8))) for c in s) == list(range(8))
    assert default_workers(15, 2) == 2
    assert default_workers(1, 2) == 1  # a lone rung gets every core, not half of them
    assert default_workers(0, 4) == 1
    assert default_workers(64, 64, memory_bytes=8 * 1024**3) == 8  # no more workers than the memory holds


def test_placement_order_is_largest_first_and_first_seeds_first():
    rungs = [Rung(f"r{f:g}_s{s}", Path("c"), Path("d"), f, s) for f in (1.0, 3.0, 2.0) for s in (1, 0)]
    assert [r.run_id for r in placement_order(rungs)] == ["r3_s0", "r2_s0", "r1_s0", "r3_s1", "r2_s1", "r1_s1"]


def test_a_second_seed_reuses_the_first_seeds_compiled_program(tmp_path, worker_env):
    ladder = micro_ladder(tmp_path, [1e9], seeds=(0, 1))
    # A fresh process per rung, so the second seed cannot reuse the first one's in-process executables.
    summary = run_ladder(ladder, workers=1, progress=False, persistent_workers=False)
    assert summary["completed"] == 2
    # One cache entry per program for the two seeds: the same cache key, so the second process loaded
    # the first one's compiled train chunk and eval step instead of compiling them.
    assert len(list(worker_env.glob("jit_chunk-*-cache"))) == 1
    evals = [p.name.rsplit("-", 2)[0] for p in worker_env.glob("jit_eval*-cache")]
    assert evals and len(evals) == len(set(evals))


def test_ray_executor_uses_only_public_runner_names():
    tree = ast.parse((ROOT / "delphi" / "ladder" / "ray_executor.py").read_text())
    imported = [
        a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ("delphi.ladder.runner", "delphi.ladder.driver")
        for a in node.names
    ]
    assert imported and not [name for name in imported if name.startswith("_")]


def test_bad_workers_and_retries_write_nothing(tmp_path):
    ladder = micro_ladder(tmp_path, [1e9])
    before = sorted(p.relative_to(ladder) for p in ladder.rglob("*"))
    with pytest.raises(DelphiError, match="--workers"):
        run_ladder(ladder, workers=0)
    with pytest.raises(DelphiError, match="--retries"):
        run_ladder(ladder, retries=-1)
    assert sorted(p.relative_to(ladder) for p in ladder.rglob("*")) == before


def test_one_persistent_worker_trains_rung_after_rung_and_a_broken_rung_fails_alone(tmp_path, worker_env, capsys):
    ladder = micro_ladder(tmp_path, [1e9, 2e9])
    rows = read_manifest(ladder)
    # A third rung whose config does not read (3 heads do not divide d_model): it fails in its worker.
    # (A store that cannot feed a rung is refused before any rung trains: test_ladder.py.)
    broken = dict(rows[0], run_id="broken", config="configs/broken.yaml")
    cfg = yaml.safe_load((ladder / rows[0]["config"]).read_text())
    cfg["model"]["n_heads"] = 3
    (ladder / "configs" / "broken.yaml").write_text(yaml.safe_dump(cfg))
    manifest = (ladder / "manifest.csv").read_text().splitlines()
    header = manifest[0].split(",")
    manifest.append(",".join(str(broken.get(col, "")) for col in header))
    (ladder / "manifest.csv").write_text("\n".join(manifest) + "\n")

    summary = run_ladder(ladder, workers=1, retries=1, progress_every_s=1.0)
    assert summary["completed"] == 2 and summary["executor"] == "local" and summary["workers"] == 1
    assert list(summary["failed"]) == ["broken"] and "after 2 attempt(s)" in summary["failed"]["broken"]
    assert set(summary["rung_times"]) == {r["run_id"] for r in rows} | {"broken"}
    assert summary["rung_times"]["broken"]["attempts"] == 2
    # Largest first: the first worker process trained both good rungs, then the broken rung raised
    # and its retry ran in a fresh worker (a JAX error may leave a process unusable).
    assert (ladder / "logs" / f"{WORKER_LOG_PREFIX}0.log").read_text().count("--- worker on cores") == 2
    broken_log = (ladder / "logs" / "broken.log").read_text()
    assert broken_log.count("--- attempt") == 2 and broken_log.count("Traceback") == 2
    for row in rows:
        log = (ladder / "logs" / f"{row['run_id']}.log").read_text()
        assert log.count('"status": "completed"') == 1  # the rung's own output went to its own log
    assert any(worker_env.rglob("*")), "ladder workers did not use the persistent compilation cache"
    err = capsys.readouterr().err
    assert "broken: failed (exit 1), retrying" in err and "rungs done" in err

    # Rerun: the two finished rungs are skipped, only the broken one is tried again.
    again = run_ladder(ladder, workers=1, retries=0, progress=False)
    assert again["completed"] == 2 and list(again["failed"]) == ["broken"]
    assert set(again["rung_times"]) == {"broken"}


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_its_rung_resumes(tmp_path, worker_env, capsys):
    ladder = micro_ladder(tmp_path, [2e9])
    (row,) = read_manifest(ladder)
    run_dir = ladder / "runs" / row["run_id"]
    outcome: dict = {}

    def drive() -> None:
        try:
            outcome["result"] = run_ladder(ladder, workers=1, retries=1, progress=False)
        except BaseException as e:  # surfaced in the main thread below
            outcome["error"] = e

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    deadline = time.monotonic() + 120
    while not list((run_dir / "checkpoints").glob("step_*/manifest.json")) and driver.is_alive():  # a checkpoint
        assert time.monotonic() < deadline, "the rung never wrote a checkpoint"
        time.sleep(0.05)
    pid = int((ladder / "locks" / f"{row['run_id']}.lock").read_text())
    if driver.is_alive():
        os.kill(pid, signal.SIGKILL)
    driver.join(timeout=180)
    assert not driver.is_alive()
    if "error" in outcome:
        raise outcome["error"]
    assert outcome["result"]["completed"] == 1 and not outcome["result"]["failed"]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # one consistent run, resumed from its checkpoint
    log = (ladder / "logs" / f"{row['run_id']}.log").read_text()
    if log.count("--- attempt") == 2:  # killed in time (a fast machine may finish first)
        assert "worker killed by SIGKILL" in capsys.readouterr().err


def test_seeds_of_a_cell_train_as_one_group_with_the_same_results_as_alone(tmp_path, worker_env, capsys):
    """Grouped and alone differ only by f32 rounding (vmapped matmuls and reductions are blocked
    differently). Training amplifies that: at this corpus's planned LR (~0.1; it memorises the
    repetitive corpus) a 1e-7 difference at step 4 is 1e-3 at step 45. At 1/100 of the base LR the
    dynamics are tame and the rungs (25 and 72 steps) agree within 1e-5."""
    import shutil

    from delphi.cli import main

    grouped = micro_ladder(tmp_path, [2e8, 1.6e9], seeds=(0, 1), tokens_per_param=6.0, min_steps=4, base_lr=5e-4)
    alone = shutil.copytree(grouped, tmp_path / "ladder-alone")
    rows = read_manifest(grouped)
    cells = {cell_id_of(r["run_id"]) for r in rows}
    assert len(rows) == 4 and len(cells) == 2  # 2 sizes x 2 seeds
    assert len({json.loads(json.dumps(r))["run_id"].split("_")[1] for r in rows}) == 2
    summary_g = run_ladder(grouped, workers=2, progress=False, group_seeds=True)
    summary_a = run_ladder(alone, workers=2, progress=False, group_seeds=False)
    assert summary_g["completed"] == summary_a["completed"] == 4 and not summary_g["failed"]
    assert summary_g["group_seeds"] and not summary_a["group_seeds"]
    for row in rows:
        log = (grouped / "logs" / f"{row['run_id']}.log").read_text()
        assert "in a seed group of 2" in log  # each cell trained as one job
        run_g, run_a = grouped / "runs" / row["run_id"], alone / "runs" / row["run_id"]
        loss_g = json.loads((run_g / "summary.json").read_text())["val_loss"]
        loss_a = json.loads((run_a / "summary.json").read_text())["val_loss"]
        print(f"{row['run_id']}: grouped {loss_g!r} alone {loss_a!r} relative {(loss_g - loss_a) / loss_a:.1e}")
        assert loss_g == pytest.approx(loss_a, rel=1e-5), row["run_id"]
        assert json.loads((run_g / "status.json").read_text())["status"] == "completed"
        steps = [json.loads(line)["step"] for line in (run_g / "metrics.jsonl").read_text().splitlines()]
        assert steps == sorted(set(steps))  # one run's metrics per run dir
    # the seeds of a cell differ (own init and data order), and collect sees every seed's row
    by_cell = {}
    for row in rows:
        by_cell.setdefault(cell_id_of(row["run_id"]), []).append(
            json.loads((grouped / "runs" / row["run_id"] / "summary.json").read_text())["val_loss"]
        )
    assert all(len(set(losses)) == 2 for losses in by_cell.values())
    capsys.readouterr()
    assert main(["ladder", "collect", str(grouped), "--out", str(tmp_path / "results.csv")]) in (0, None)
    import csv

    with open(tmp_path / "results.csv") as f:
        collected = list(csv.DictReader(f))
    assert sorted(r["run_id"] for r in collected) == sorted(r["run_id"] for r in rows)
    # Rerun: nothing left to train, nothing placed.
    assert set(run_ladder(grouped, workers=1, progress=False)["rung_times"]) == set()


@pytest.mark.slow  # three in-process trainings, each compiling its programs
def test_a_killed_group_resumes_and_a_locked_member_is_left_out_of_its_group(tmp_path, worker_env):
    import fcntl

    from delphi.ladder.runner import EXIT_COMPLETED, EXIT_LOCKED, run_group
    from delphi.train.config import load_train_config
    from delphi.train.trainer import train_group

    ladder = micro_ladder(tmp_path, [2e8], seeds=(0, 1), tokens_per_param=6.0, min_steps=4)
    rows = read_manifest(ladder)
    configs = [ladder / r["config"] for r in rows]
    run_dirs = [ladder / "runs" / r["run_id"] for r in rows]
    steps = load_train_config(configs[0]).steps
    # A group stopped part-way (as a kill would: a checkpoint of the step it reached, status failed).
    train_group([load_train_config(c) for c in configs], run_dirs, max_steps=steps // 2, progress=False)
    assert [json.loads((d / "status.json").read_text())["status"] for d in run_dirs] == ["failed", "failed"]
    (ladder / "locks").mkdir()
    locks = [ladder / "locks" / f"{r['run_id']}.lock" for r in rows]
    with open(locks[1], "a+") as held:  # another process holds the second seed
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert run_group(configs, run_dirs, locks) == [EXIT_COMPLETED, EXIT_LOCKED]
    assert json.loads((run_dirs[1] / "status.json").read_text())["status"] == "failed"  # left alone
    # Now the first member is finished: the group resumes only the second one.
    assert run_group(configs, run_dirs, locks) == [EXIT_COMPLETED, EXIT_COMPLETED]
    for run_dir in run_dirs:
        logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert logged == sorted(set(logged)) and logged[-1] == steps  # resumed, not restarted
        assert json.loads((run_dir / "summary.json").read_text())["steps"] == steps


def test_compilation_cache_writes_programs_in_a_plain_install(tmp_path):
    """The persistent compilation cache works with what `pip install -e .` brings: with a size limit
    set, JAX needs `filelock`, and without it every rung of a fresh install recompiled its programs."""
    requires = importlib.metadata.requires("delphi") or []
    assert any(r.split(";")[0].strip().startswith("filelock") for r in requires), requires
    script = (
        "import jax, jax.numpy as jnp\n"
        "from delphi.ladder.runner import enable_compilation_cache\n"
        "enable_compilation_cache()\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)\n"
        "jax.jit(lambda x: jnp.tanh(x @ x.T))(jnp.ones((8, 8))).block_until_ready()\n"
    )
    env = {**os.environ, "DELPHI_JAX_CACHE": str(tmp_path / "jax")}
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", script], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert any(p.name.endswith("-cache") for p in (tmp_path / "jax").iterdir())
