"""The trainer end to end on a tiny MoE: metrics, resume equivalence, corrupt
checkpoints, divergence, and bad inputs that must fail before writing anything."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from delphi.cli import main as cli_main
from delphi.errors import DelphiError
from delphi.io import atomic_write_yaml
from delphi.model.config import ModelConfig, MoEConfig
from delphi.train.checkpoint import list_checkpoints
from delphi.train.config import DataConfig, OptimConfig, TrainConfig, load_train_config, train_config_to_dict
from delphi.train.rundir import read_metrics, read_status
from delphi.train.trainer import train

TIMING_KEYS = {"tokens_per_s", "mfu", "wall_s", "eval_s"}
CONTRACT_KEYS = {"step", "tokens", "flops", "lr", "train_loss", "grad_norm", "tokens_per_s", "mfu", "wall_s"}
MOE_KEYS = {"drop_frac", "load_max_over_mean", "router_entropy"}


def tiny_config(store: Path, **changes) -> TrainConfig:
    cfg = TrainConfig(
        model=ModelConfig(d_model=32, n_layers=1, n_heads=2, moe=MoEConfig(experts=4, top_k=2, d_expert=32)),
        data=DataConfig(store=str(store), seq_len=32, batch_size=8, seed=3),
        optim=OptimConfig(lr=1e-2, warmup_frac=0.1, decay_frac=0.3),
        steps=12,
        log_every=2,
        eval_every=4,
        eval_tokens=512,
        checkpoint_every=4,
        keep_checkpoints=2,
    )
    return dataclasses.replace(cfg, **changes).validate()


def deterministic(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    a, b = deterministic(a), deterministic(b)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for key in ra:
            assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-6), (ra["step"], key)


@pytest.fixture(scope="module")
def uninterrupted(store, tmp_path_factory) -> tuple[Path, dict]:
    run = tmp_path_factory.mktemp("runs") / "a"
    summary = train(tiny_config(store), run, progress=False)
    return run, summary


def test_run_dir_contract(store, uninterrupted):
    run, summary = uninterrupted
    assert summary["status"] == "completed" and read_status(run)["status"] == "completed"
    on_disk = json.loads((run / "summary.json").read_text())
    for key in (
        "status",
        "steps",
        "tokens",
        "flops",
        "val_loss",
        "val_bpb",
        "params_total",
        "params_active",
        "params_nonembedding",
        "flops_per_token",
        "wall_time_s",
        "data_sha256",
        "config_sha256",
    ):
        assert key in on_disk, key
    assert on_disk["steps"] == 12 and on_disk["tokens"] == 12 * 8 * 32
    assert load_train_config(run / "config.yaml") == tiny_config(store)
    records = read_metrics(run)
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10, 12]
    for r in records:
        assert CONTRACT_KEYS | MOE_KEYS <= r.keys()
        assert r["mfu"] > 0 and r["tokens_per_s"] > 0
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert evals[-1]["val_loss"] == pytest.approx(on_disk["val_loss"])
    assert evals[-1]["val_bpb"] == pytest.approx(on_disk["val_loss"] / 0.6931471805599453)
    assert records[-1]["train_loss"] < records[0]["train_loss"]  # it learns
    assert [s for s, _ in list_checkpoints(run)] == [8, 12]  # keep_checkpoints=2


def test_resume_reproduces_uninterrupted_metrics(store, uninterrupted, tmp_path, monkeypatch):
    run_a, _ = uninterrupted
    cfg = tiny_config(store)
    monkeypatch.chdir(tmp_path)
    run_b = Path("b")  # relative, as in the README's `delphi study --out runs/study` (Orbax wants absolute paths)
    stopped = train(cfg, run_b, progress=False, max_steps=6)  # stops between checkpoints
    assert stopped["status"] == "failed" and "resume" in read_status(run_b)["reason"]
    assert [s for s, _ in list_checkpoints(run_b)] == [4, 6]
    with pytest.raises(DelphiError, match="--resume"):
        train(cfg, run_b, progress=False)  # not without --resume
    resumed = train(cfg, run_b, resume=True, progress=False)
    assert resumed["status"] == "completed"
    assert_same_metrics(read_metrics(run_a), read_metrics(run_b))
    # resuming a completed run is a no-op that returns its summary
    assert train(cfg, run_b, resume=True, progress=False)["val_loss"] == resumed["val_loss"]


def test_a_resume_under_another_thread_count_is_refused(store, uninterrupted, tmp_path, monkeypatch):
    """Issue 41: XLA's CPU sums round differently over another thread count (the same config reached
    2.9636 on one core and 2.8614 on two), so a run records its count and resumes only under it."""
    from delphi.train import trainer
    from delphi.train.checkpoint import read_manifest
    from delphi.train.environment import xla_cpu_threads

    run_a, _ = uninterrupted
    cfg, run = tiny_config(store), tmp_path / "run"
    train(cfg, run, progress=False, max_steps=6)
    threads = xla_cpu_threads()
    step, path = list_checkpoints(run)[-1]
    assert read_manifest(path)["extra"]["cpu_threads"] == threads
    monkeypatch.setattr(trainer, "cpu_threads", lambda: threads + 1)
    with pytest.raises(DelphiError, match=f"trained with {threads} XLA CPU thread.*this process has {threads + 1}"):
        train(cfg, run, resume=True, progress=False)
    assert [s for s, _ in list_checkpoints(run)][-1] == step  # the checkpoint is untouched
    monkeypatch.undo()
    assert train(cfg, run, resume=True, progress=False)["status"] == "completed"
    assert json.loads((run / "summary.json").read_text())["cpu_threads"] == threads
    assert_same_metrics(read_metrics(run_a), read_metrics(run))


def test_a_resumable_snapshot_continues_an_unfinished_run_elsewhere(store, uninterrupted, tmp_path, monkeypatch):
    """`delphi paper snapshot --resumable` (a hero longer than one working session): a run stopped
    mid-way is kept with its newest checkpoint only; copied to a fresh directory it resumes there
    and ends as if it had never stopped. A plain snapshot keeps only finished runs."""
    from delphi.study.snapshot import compact_files

    run_a, _ = uninterrupted
    cfg, study, fresh = tiny_config(store), tmp_path / "study", tmp_path / "fresh"
    train(cfg, study / "hero", progress=False, max_steps=6)
    assert [s for s, _ in list_checkpoints(study / "hero")] == [4, 6]
    assert compact_files(study) == []
    kept = compact_files(study, resumable=True)
    assert {p.parts[2] for p in kept if "checkpoints" in p.parts} == {"step_00000006"}
    for rel in kept:
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        (fresh / rel).write_bytes((study / rel).read_bytes())
    from delphi.train import checkpoint as ckpt

    restored_steps, restore = [], ckpt.restore_latest

    def spy(*args, **kwargs):
        found = restore(*args, **kwargs)
        restored_steps.append(None if found.restored is None else found.restored.step)
        return found

    monkeypatch.setattr(ckpt, "restore_latest", spy)
    resumed = train(cfg, fresh / "hero", resume=True, progress=False)
    assert restored_steps == [6] and resumed["status"] == "completed"
    assert_same_metrics(read_metrics(run_a), read_metrics(fresh / "hero"))


def largest_file(checkpoint: Path) -> Path:
    return max((p for p in (checkpoint / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def stderr_lines(capfd) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if line.strip()]


def test_corrupt_checkpoint_falls_back_to_previous(store, uninterrupted, tmp_path, capfd):
    run_a, _ = uninterrupted
    cfg = tiny_config(store)
    run = tmp_path / "c"
    train(cfg, run, progress=False, max_steps=8)
    assert [s for s, _ in list_checkpoints(run)] == [4, 8]
    victim = largest_file(run / "checkpoints" / "step_00000008")
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # truncated
    capfd.readouterr()
    train(cfg, run, resume=True, progress=False)
    lines = stderr_lines(capfd)  # fd-level: Orbax, absl or a Python warning would show here
    assert len(lines) == 1, lines
    assert "step_00000008" in lines[0] and "resuming from step 4" in lines[0] and "Warning" not in lines[0]
    assert_same_metrics(read_metrics(run_a), read_metrics(run))
    assert [s for s, _ in list_checkpoints(run)] == [8, 12]


def test_every_checkpoint_corrupt_restarts_from_zero(store, uninterrupted, tmp_path, capfd):
    run_a, _ = uninterrupted
    cfg = tiny_config(store)
    run = tmp_path / "c"
    train(cfg, run, progress=False, max_steps=8)
    (run / "checkpoints" / "step_00000008" / "manifest.json").write_text("{not json")
    victim = largest_file(run / "checkpoints" / "step_00000004")
    victim.write_bytes(bytes(victim.stat().st_size))  # same size, zeroed: only the sha256 can tell
    capfd.readouterr()
    summary = train(cfg, run, resume=True, progress=False)
    lines = stderr_lines(capfd)
    assert len(lines) == 1, lines
    assert "every checkpoint is corrupt" in lines[0] and "restarting from step 0" in lines[0]
    assert "step_00000004" in lines[0] and "step_00000008" in lines[0]
    assert summary["status"] == "completed"
    assert_same_metrics(read_metrics(run_a), read_metrics(run))


def test_checkpoint_round_trips_the_whole_state(store, tmp_path):
    """Params, Adam moments and step count, router biases and the extra state come back exactly."""
    import jax
    import numpy as np

    from delphi.train import sharding
    from delphi.train.checkpoint import restore_latest, save_checkpoint
    from delphi.train.optim import make_optimizer
    from delphi.train.step import TrainState, split_model
    from delphi.train.trainer import init_model

    cfg = tiny_config(store)
    _, params, router_bias, other = split_model(init_model(cfg))
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    fresh = TrainState(params, tx.init(params), router_bias, other)
    noisy = jax.tree.map(lambda x: x + np.float32(0.25) if x.dtype == np.float32 else x + 3, fresh)
    assert jax.tree.leaves(router_bias), "the tiny MoE has router biases"
    save_checkpoint(tmp_path, 7, noisy, extra={"wall_s": 12.5})
    mesh = sharding.make_mesh(cfg.mesh)
    found = restore_latest(tmp_path, fresh, sharding.state_shardings(fresh, mesh))
    assert found.corrupt == [] and found.restored.step == 7 and found.restored.extra == {"wall_s": 12.5}
    assert jax.tree.structure(found.restored.state) == jax.tree.structure(noisy)
    for a, b in zip(jax.tree.leaves(found.restored.state), jax.tree.leaves(noisy)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))


def test_divergence_stops_with_status_diverged(store, tmp_path):
    cfg = tiny_config(store, optim=OptimConfig(lr=1e30, warmup_frac=0.0, grad_clip=0.0))
    run = tmp_path / "d"
    summary = train(cfg, run, progress=False)
    status = read_status(run)
    assert summary["status"] == status["status"] == "diverged"
    assert "non-finite" in status["reason"]
    records = read_metrics(run)
    assert records and records[-1]["train_loss"] is None  # logged as null, not NaN
    assert json.loads((run / "summary.json").read_text())["status"] == "diverged"


def write_config(path: Path, cfg: TrainConfig, **override) -> Path:
    data = train_config_to_dict(cfg)
    for dotted, value in override.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    atomic_write_yaml(path, data)
    return path


@pytest.mark.parametrize(
    "override, message",
    [
        ({"optim.lrate": 0.1}, "optim.lrate: unknown key"),
        ({"optim.lr": -1.0}, "optim.lr: must be positive"),
        ({"model.n_heads": 3}, "model.n_heads"),
        ({"data.store": "/nonexistent/corpus"}, "/nonexistent/corpus"),
        ({"data.batch_size": 100_000}, "data.batch_size"),
        ({"eval_tokens": 10**9}, "eval_tokens"),
    ],
)
def test_bad_inputs_exit_2_and_write_nothing(store, tmp_path, capsys, override, message):
    config = write_config(tmp_path / "bad.yaml", tiny_config(store), **override)
    out = tmp_path / "run"
    assert cli_main(["train", str(config), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_run_dir_with_another_config_is_refused(store, uninterrupted, tmp_path, capsys):
    run_a, _ = uninterrupted
    before = sorted(p.name for p in run_a.iterdir())
    config = write_config(tmp_path / "other.yaml", tiny_config(store), steps=14)
    assert cli_main(["train", str(config), "--out", str(run_a), "--resume"]) == 2
    assert "different config" in capsys.readouterr().err
    assert sorted(p.name for p in run_a.iterdir()) == before


def test_default_tiny_config_is_valid():
    from delphi.train.commands import default_config_path

    cfg = load_train_config(default_config_path())
    assert cfg.model.moe is not None and cfg.data.store == "stdlib"
    from delphi.model.flops import count_params

    assert 100_000 < count_params(cfg.model).total < 1_000_000


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_matches(store, uninterrupted, tmp_path):
    """A real kill: the subprocess gets SIGKILL after its first checkpoint, --resume finishes it."""
    run_a, _ = uninterrupted
    cfg = tiny_config(store, steps=200, log_every=2, eval_every=20, checkpoint_every=20)
    config = write_config(tmp_path / "cfg.yaml", cfg)
    reference = tmp_path / "ref"
    train(cfg, reference, progress=False)
    run = tmp_path / "killed"
    env = {**os.environ, "DELPHI_PEAK_FLOPS_F32": "1e11"}
    cmd = [sys.executable, "-m", "delphi.cli", "train", str(config), "--out", str(run), "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not any(s >= 40 for s, _ in list_checkpoints(run)):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    steps_done = max(s for s, _ in list_checkpoints(run))
    assert steps_done < 200, "the run finished before it could be killed"
    assert read_status(run)["status"] == "running"  # a SIGKILL leaves no chance to say otherwise
    assert subprocess.run(cmd + ["--resume"], env=env, stderr=subprocess.DEVNULL).returncode == 0
    assert_same_metrics(read_metrics(reference), read_metrics(run))


@pytest.mark.slow
def test_sigterm_leaves_a_resumable_run(store, tmp_path):
    cfg = tiny_config(store, steps=400, log_every=2, eval_every=40, checkpoint_every=40)
    config = write_config(tmp_path / "cfg.yaml", cfg)
    run = tmp_path / "term"
    cmd = [sys.executable, "-m", "delphi.cli", "train", str(config), "--out", str(run), "--no-progress"]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_metrics(run)) < 5:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    status = read_status(run)
    assert status["status"] == "failed" and "SIGTERM" in status["reason"]
    assert max(s for s, _ in list_checkpoints(run)) == status["step"]
    assert subprocess.run(cmd + ["--resume"], stderr=subprocess.DEVNULL).returncode == 0
    assert read_status(run)["status"] == "completed"
