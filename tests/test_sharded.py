"""Sharded training on 8 simulated CPU devices (XLA_FLAGS, in a subprocess): data- and
expert-parallel meshes give the one-device losses, the compiled step moves tokens with
all-to-all of the expected size, and checkpoints move between device counts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from delphi.errors import DelphiError
from delphi.model.config import ModelConfig, MoEConfig
from delphi.train.config import DataConfig, MeshConfig, OptimConfig, TrainConfig
from delphi.train.rundir import read_metrics
from delphi.train.trainer import train

MESHES = [(8, 1), (2, 4), (4, 2)]
REL_TOL = 1e-5
STEPS = 4
LAYERS = 1


def sharded_config(store: Path, data: int = 1, expert: int = 1, **changes) -> TrainConfig:
    # capacity_factor = experts / top_k makes every device's capacity its own token count, so
    # nothing is dropped on any mesh and routing is the one-device routing (see moe_parallel.py).
    moe = MoEConfig(experts=8, top_k=2, d_expert=16, capacity_factor=4.0, balance="aux")
    cfg = TrainConfig(
        model=ModelConfig(d_model=32, n_layers=LAYERS, n_heads=2, moe=moe),
        data=DataConfig(store=str(store), seq_len=16, batch_size=8, seed=3),
        optim=OptimConfig(lr=1e-2, warmup_frac=0.25, decay_frac=0.25),
        steps=STEPS,
        log_every=1,
        eval_every=STEPS,
        eval_tokens=128,
        checkpoint_every=STEPS,
        mesh=MeshConfig(data=data, expert=expert),
    )
    return dataclasses.replace(cfg, **changes).validate()


WORKER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    assert "jax" not in sys.modules
    from tests.test_sharded import MESHES, STEPS, sharded_config
    from delphi.train import sharding, trainer
    from delphi.train.rundir import read_metrics

    store, work = Path(sys.argv[1]), Path(sys.argv[2])
    out = {"devices": len(__import__("jax").devices()), "runs": {}}
    for data, expert in MESHES:
        cfg = sharded_config(store, data, expert)
        summary = trainer.train(cfg, work / f"run_{data}x{expert}", progress=False)
        train_chunk = trainer.latest_train_program()
        count, nbytes = sharding.all_to_all_bytes(train_chunk.as_text())
        out["runs"][f"{data}x{expert}"] = {
            "train_loss": [r["train_loss"] for r in read_metrics(work / f"run_{data}x{expert}")],
            "val_loss": summary["val_loss"],
            "all_to_all_ops": count,
            "all_to_all_bytes": nbytes,
            "expected_bytes": sharding.expected_all_to_all_bytes(cfg),
        }
    # restore onto other device counts: a 1-device checkpoint on 2x4, a 2x4 one on 4x2
    trainer.train(sharded_config(store, 2, 4), work / "from_1", resume=True, progress=False)
    trainer.train(sharded_config(store, 2, 4), work / "from_2x4", progress=False, max_steps=STEPS // 2)
    trainer.train(sharded_config(store, 4, 2), work / "from_2x4", resume=True, progress=False)
    trainer.train(sharded_config(store, 8, 1), work / "from_8x1", progress=False, max_steps=STEPS // 2)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def runs(store, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("sharded")
    baseline = train(sharded_config(store), work / "one", progress=False)
    stopped = train(sharded_config(store), work / "from_1", progress=False, max_steps=STEPS // 2)
    assert stopped["status"] == "failed"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    repo = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(store), str(work)],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["one"] = {
        "train_loss": [r["train_loss"] for r in read_metrics(work / "one")],
        "val_loss": baseline["val_loss"],
    }
    result["work"] = work
    return result


def test_simulated_devices(runs):
    assert runs["devices"] == 8


@pytest.mark.parametrize("mesh", [f"{d}x{x}" for d, x in MESHES])
def test_mesh_matches_one_device(runs, mesh):
    one, run = runs["one"], runs["runs"][mesh]
    assert len(run["train_loss"]) == len(one["train_loss"]) == STEPS
    assert run["train_loss"] == pytest.approx(one["train_loss"], rel=REL_TOL)
    assert run["val_loss"] == pytest.approx(one["val_loss"], rel=REL_TOL)
    assert one["train_loss"][-1] < one["train_loss"][0]  # it trains, so later steps test the updates


@pytest.mark.parametrize("mesh", [f"{d}x{x}" for d, x in MESHES])
def test_all_to_all_in_compiled_step(runs, mesh):
    run = runs["runs"][mesh]
    data, expert = map(int, mesh.split("x"))
    if expert == 1:  # pure data parallelism: experts are local, nothing to exchange
        assert run["all_to_all_ops"] == 0 and run["expected_bytes"] == 0
        return
    assert run["all_to_all_ops"] == LAYERS * 4  # dispatch + combine, forward + backward
    assert run["all_to_all_bytes"] == run["expected_bytes"] > 0


def test_restore_onto_other_device_counts(runs, store):
    work, one = runs["work"], runs["one"]
    for name in ("from_1", "from_2x4"):  # 1 device -> 2x4, 2x4 -> 4x2 (in the subprocess)
        assert [r["train_loss"] for r in read_metrics(work / name)] == pytest.approx(one["train_loss"], rel=REL_TOL)
    # 8x1 -> 1 device, here
    resumed = train(sharded_config(store), work / "from_8x1", resume=True, progress=False)
    assert resumed["status"] == "completed"
    assert [r["train_loss"] for r in read_metrics(work / "from_8x1")] == pytest.approx(one["train_loss"], rel=REL_TOL)
    assert resumed["val_loss"] == pytest.approx(one["val_loss"], rel=REL_TOL)


def test_mesh_config_errors(store, tmp_path):
    with pytest.raises(DelphiError, match="mesh.model"):
        sharded_config(store, mesh=MeshConfig(model=2))
    with pytest.raises(DelphiError, match="mesh.expert"):
        sharded_config(store, 1, 3)
    with pytest.raises(DelphiError, match="data.batch_size"):
        sharded_config(store, 16, 1)
    with pytest.raises(DelphiError, match="mesh:.*JAX sees 1"):  # this process has one device
        train(sharded_config(store, 2, 4), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # nothing written


def test_all_to_all_bytes_parser():
    from delphi.train.sharding import all_to_all_bytes

    hlo = """
  %all-to-all = (f32[1,2,10,64]{3,2,1,0}, bf16[1,2,10,64]{3,2,1,0}, /*index=2*/f32[4]{0}) all-to-all(%a, %b, %c), dimensions={0}
  %get-tuple-element.9 = f32[1,2,10,64]{3,2,1,0} get-tuple-element(%all-to-all), index=0
  ROOT %all-to-all.1 = f32[8,16]{1,0} all-to-all(f32[8,16]{1,0} %d), dimensions={0}
  %all-reduce = f32[8,16]{1,0} all-reduce(%d), to_apply=%add
"""
    assert all_to_all_bytes(hlo) == (2, 1280 * 4 + 1280 * 2 + 4 * 4 + 128 * 4)
