"""Hostile inputs to `delphi train` (issue 12, rows 8-11, 16): each class of bad input exits 2 with
one line naming the file, key and value, and writes nothing; a second trainer on a busy run
directory is refused; a metrics file deleted mid-run is recreated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from delphi.cli import main as cli_main
from delphi.train.rundir import LOCK_FILE, RunLock, read_metrics, read_status
from tests.test_train import tiny_config, write_config

REPO = Path(__file__).resolve().parents[1]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "override, wanted",
    [
        # row 8: a typo no machine can hold; refused by train and by flops
        ({"model.d_model": 1_000_000_000, "model.n_heads": 1, "model.moe": None}, "more than 1e+15"),
        # plausible, but its training state does not fit this machine: refused by train only
        ({"model.d_model": 65536, "model.n_layers": 64, "model.n_heads": 512, "model.moe": None}, "this machine's"),
    ],
)
def test_model_too_big_is_refused_before_anything_is_written(store, tmp_path, capsys, override, wanted):
    config = write_config(tmp_path / "big.yaml", tiny_config(store), **override)
    out = tmp_path / "run"
    assert cli_main(["train", str(config), "--out", str(out), "--no-progress"]) == 2
    err = one_error_line(capsys)
    assert wanted in err and f"d_model={override['model.d_model']}" in err
    assert not out.exists()
    flops_rc = cli_main(["flops", str(config)])
    capsys.readouterr()
    assert flops_rc == (2 if "1e+15" in wanted else 0)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "just a string\n", "- a\n- list\n"])
def test_train_config_that_is_not_a_mapping(tmp_path, capsys, text):
    config = tmp_path / "cfg.yaml"
    config.write_text(text)
    out = tmp_path / "run"
    assert cli_main(["train", str(config), "--out", str(out), "--no-progress"]) == 2
    err = one_error_line(capsys)
    assert str(config) in err and "expected a mapping" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "damage",
    [b"model: {d_model: [\n", b"\x00\xff\xfe garbage \x89PNG", b"- a\n- list\n"],
    ids=["syntax", "bytes", "list"],
)
def test_corrupt_run_config_on_resume(store, tmp_path, capsys, damage):
    cfg = tiny_config(store)
    config = write_config(tmp_path / "cfg.yaml", cfg)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_bytes(damage)
    (run / "metrics.jsonl").write_text("")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.iterdir())
    assert cli_main(["train", str(config), "--out", str(run), "--resume", "--no-progress"]) == 2
    err = one_error_line(capsys)
    assert str(run / "config.yaml") in err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.iterdir()) == before


def test_lock_is_released_after_training(store, tmp_path):
    from delphi.train.trainer import train

    run = tmp_path / "run"
    train(tiny_config(store, steps=4, eval_every=4, checkpoint_every=4), run, progress=False)
    assert not (run / LOCK_FILE).exists()
    RunLock(run).acquire().release()


def test_second_trainer_is_refused_and_deleted_metrics_are_recreated(store, tmp_path, capsys):
    """A real trainer in a subprocess. While it runs: its metrics.jsonl is deleted (it must recreate
    it with every record and warn once), and a second `delphi train` on the same directory, with and
    without --resume, is refused. When it exits its lock is gone."""
    cfg = tiny_config(store, steps=320, log_every=2, eval_every=160, checkpoint_every=160)
    config = write_config(tmp_path / "cfg.yaml", cfg)
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "delphi.cli", "train", str(config), "--out", str(run), "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and len(read_metrics(run)) < 2:
            time.sleep(0.02)
        (run / "metrics.jsonl").unlink()
        assert cli_main(["train", str(config), "--out", str(run), "--no-progress", "--resume"]) == 2
        assert "being trained by another process" in one_error_line(capsys)
        # without --resume: refused by the lock, or (once metrics.jsonl is back) as an existing run
        assert cli_main(["train", str(config), "--out", str(run), "--no-progress"]) == 2
        err = one_error_line(capsys)
        assert "another process" in err or "already holds a run" in err
        assert proc.poll() is None, "the first trainer finished before the checks: make it longer"
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()  # only the process this test started
    assert proc.returncode == 0, err[-2000:]
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "metrics.jsonl" in warnings[0] and "recreated" in warnings[0]
    assert [r["step"] for r in read_metrics(run)] == list(range(2, cfg.steps + 1, 2))
    assert read_status(run)["status"] == "completed"
    assert not (run / LOCK_FILE).exists()
    assert json.loads((run / "summary.json").read_text())["steps"] == cfg.steps
