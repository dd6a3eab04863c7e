"""kill -9 of a study leaves no seed trainer behind (issue 53, cause 15): a study trains a run's seeds
side by side, one `delphi train` process each; they stop (at a checkpoint) when the study dies,
however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from test_prereg_seeds import seal

import delphi
from delphi.model.config import ModelConfig
from delphi.train.config import DataConfig, OptimConfig, TrainConfig, train_config_to_dict

PACKAGE_ROOT = Path(delphi.__file__).resolve().parents[1]  # the checkout whose delphi this test imports
STUDY = """
import sys
from pathlib import Path
from delphi.study.seeds import seed_runs, train_seeds
root = Path(sys.argv[1])
train_seeds(seed_runs(root / "hero.yaml", root / "hero", (0, 1)), root / "hero.prereg.yaml", "the hero")
"""


def _processes_under(root: Path) -> list[int]:
    """Pids of the processes whose command line names a path under `root` (the trainers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmdline and "delphi" in cmdline:
            pids.append(int(entry.name))
    return pids


def test_kill_9_of_a_study_stops_its_seed_trainers(store, tmp_path):
    cfg = TrainConfig(
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2),
        data=DataConfig(store=str(store), seq_len=16, batch_size=2, seed=0),
        optim=OptimConfig(lr=1e-2, warmup_frac=0.1, decay_frac=0.2),
        steps=1_000_000,
        log_every=50,
        eval_every=100_000,
        checkpoint_every=100_000,
        eval_tokens=64,
        name="hero",
    ).validate()
    (tmp_path / "hero.yaml").write_text(yaml.safe_dump(train_config_to_dict(cfg), sort_keys=False))
    seal(tmp_path / "hero.prereg.yaml", cfg, [0, 1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]),
        "DELPHI_PEAK_FLOPS_F32": "1e11",
        "DELPHI_JAX_CACHE": "off",
    }
    study = subprocess.Popen(
        [sys.executable, "-c", STUDY, str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    trainers: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not all(
            (tmp_path / r / "metrics.jsonl").is_file() for r in ("hero", "hero_s1")
        ):
            assert study.poll() is None, "the study ended before its seeds trained"
            time.sleep(0.5)
        trainers = [p for p in _processes_under(tmp_path) if p != study.pid]
        assert trainers, "no seed trainer found"
        study.send_signal(signal.SIGKILL)
        study.wait()
        deadline = time.monotonic() + 120  # a stopping trainer saves a checkpoint first
        while time.monotonic() < deadline and _processes_under(tmp_path):
            time.sleep(0.5)
        assert _processes_under(tmp_path) == [], "seed trainers outlived the study"
        for run in ("hero", "hero_s1"):  # stopped as on SIGTERM: resumable, not failed
            status = yaml.safe_load((tmp_path / run / "status.json").read_text())
            assert status["status"] != "running", status
    finally:
        for pid in [study.pid, *trainers, *_processes_under(tmp_path)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
