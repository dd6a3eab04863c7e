"""Choosing the device (delphi.train.device): `device: auto|cpu|gpu` in a train config, `--device` on
the command line (train, ladder run, study), refused in one line where it cannot be had.

This machine has no GPU, so what a GPU run does is checked here up to the point where JAX is asked
for one: `--device gpu` and `JAX_PLATFORMS=cuda` are exit 2 with one line and nothing written; the
rules that need a GPU's answers (bf16 on a GPU without bf16 tensor cores, a GPU's free memory, one
ladder worker per GPU) are checked on a description of such a device: the attributes JAX's device
objects have (platform, device_kind, compute_capability, memory_stats).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from delphi.cli import main
from delphi.errors import DelphiError
from delphi.train import device as dev
from delphi.train.config import TrainConfig, load_train_config, train_config_to_dict
from delphi.train.environment import DEVICE_ENV
from tests.test_hostile_inputs import _refused as _one_error_line
from tests.test_hostile_inputs import _run
from tests.test_train import tiny_config, write_config

REPO = Path(__file__).resolve().parents[1]


def gpu(kind: str = "NVIDIA H100 80GB HBM3", capability: str = "9.0", limit: int = 80 * 10**9, in_use: int = 0):
    """A description of a JAX GPU device: the attributes the device rules read."""
    return SimpleNamespace(
        platform="gpu",
        device_kind=kind,
        compute_capability=capability,
        id=0,
        process_index=0,
        memory_stats=lambda: {"bytes_limit": limit, "bytes_in_use": in_use},
    )


# ---- the command line: a GPU where none is visible, a JAX_PLATFORMS that JAX cannot start


def test_device_gpu_without_a_gpu_is_one_line_and_writes_nothing(store, tmp_path, capsys) -> None:
    config = write_config(tmp_path / "cfg.yaml", tiny_config(store))
    code, err = _run(["train", config, "--out", tmp_path / "run", "--device", "gpu"], capsys)
    line = _one_error_line(code, err, "device: gpu", "sees no GPU", "delphi[cuda]", "--device cpu")
    assert str(config) in line
    assert not (tmp_path / "run").exists()
    assert DEVICE_ENV not in os.environ  # --device holds for the command only


def test_a_config_asking_for_a_gpu_is_refused_the_same_way(store, tmp_path, capsys) -> None:
    config = write_config(tmp_path / "cfg.yaml", dataclasses.replace(tiny_config(store), device="gpu"))
    code, err = _run(["train", config, "--out", tmp_path / "run"], capsys)
    _one_error_line(code, err, "device: gpu", "sees no GPU")
    assert not (tmp_path / "run").exists()
    # --device cpu overrides the config's gpu: the run is not refused for its device (max_steps: 0
    # would still train; the check that matters is select_devices, called with the flag's choice)
    os.environ[DEVICE_ENV] = "cpu"
    try:
        assert dev.effective_device("gpu") == "cpu"
        assert [d.platform for d in dev.select_devices(dev.effective_device("gpu"))] == ["cpu"]
    finally:
        del os.environ[DEVICE_ENV]


@pytest.mark.parametrize("platforms", ["cuda", "rocm"])
def test_jax_platforms_naming_an_absent_backend_is_one_line(store, tmp_path, platforms) -> None:
    """`JAX_PLATFORMS=cuda delphi train` ended in JAX's AssertionError (exit 1, a traceback)."""
    config = write_config(tmp_path / "cfg.yaml", tiny_config(store))
    env = {
        **os.environ,
        "JAX_PLATFORMS": platforms,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop(DEVICE_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-m", "delphi.cli", "train", str(config), "--out", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = _one_error_line(proc.returncode, proc.stderr, f"JAX_PLATFORMS='{platforms}'", "delphi[cuda]")
    assert "AssertionError" not in proc.stderr and "could not start" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ({"device": "tpu"}, "device"),
        ({"attention": "flash"}, "attention"),
        ({"precision": "fp16"}, "precision"),
    ],
)
def test_an_unknown_device_attention_or_precision_is_one_line(store, tmp_path, capsys, override, message) -> None:
    config = write_config(tmp_path / "cfg.yaml", tiny_config(store), **override)
    code, err = _run(["train", config, "--out", tmp_path / "run"], capsys)
    _one_error_line(code, err, message, str(config))
    assert not (tmp_path / "run").exists()


def test_a_bad_delphi_device_is_named(store, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "quantum")
    config = write_config(tmp_path / "cfg.yaml", tiny_config(store))
    code, err = _run(["train", config, "--out", tmp_path / "run"], capsys)
    _one_error_line(code, err, f"{DEVICE_ENV}='quantum'", "auto, cpu, gpu")


def test_a_ladder_asked_for_a_gpu_on_a_machine_without_one_stops_before_its_rungs(tmp_path, capsys) -> None:
    from micro_ladder import micro_ladder

    ladder = micro_ladder(tmp_path, [1e9])
    code, err = _run(["ladder", "run", ladder, "--device", "gpu"], capsys)
    _one_error_line(code, err, "--device gpu", "no GPU", "delphi[cuda]")
    assert not (ladder / "runs").exists() or not any((ladder / "runs").iterdir())


def test_every_training_command_takes_device(capsys) -> None:
    for command in (["train"], ["ladder", "run"], ["ladder", "lr-calibrate"], ["ladder", "recipe-check"], ["study"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert "--device {auto,cpu,gpu}" in capsys.readouterr().out, command


# ---- the config: defaults leave every config's bytes and identity as they were


def test_the_default_device_and_attention_leave_a_config_as_it_was(store, tmp_path) -> None:
    from delphi.train.trainer import config_yaml, identity_yaml

    cfg = tiny_config(store)
    assert "device" not in train_config_to_dict(cfg) and "attention" not in train_config_to_dict(cfg)
    on_gpu = dataclasses.replace(cfg, device="gpu", attention="fused")
    assert train_config_to_dict(on_gpu)["device"] == "gpu" and train_config_to_dict(on_gpu)["attention"] == "fused"
    assert identity_yaml(config_yaml(on_gpu)) == identity_yaml(config_yaml(cfg))  # the same run, on another device
    path = write_config(tmp_path / "gpu.yaml", on_gpu)
    assert load_train_config(path) == on_gpu
    assert TrainConfig().device == "auto" and TrainConfig().attention == "auto"


# ---- the rules, on descriptions of GPUs


def test_bf16_is_refused_on_a_gpu_without_bf16_tensor_cores() -> None:
    t4 = gpu("Tesla T4", "7.5")
    with pytest.raises(DelphiError, match=r"precision: bf16 .* Tesla T4 has 7.5, .* use precision: f32"):
        dev.check_precision("bf16", [t4])
    dev.check_precision("f32", [t4])
    dev.check_precision("bf16", [gpu()])  # an H100
    dev.check_precision(
        "bf16", [SimpleNamespace(platform="cpu", device_kind="cpu")]
    )  # the CPU runs bf16 (emulated or native)


def test_attention_auto_is_fused_on_a_gpu_and_blocked_on_the_cpu() -> None:
    assert dev.resolve_attention("auto", "cpu", "f32") == dev.resolve_attention("auto", "cpu", "bf16") == "blocked"
    assert dev.resolve_attention("auto", "gpu", "bf16") == "cudnn"
    assert dev.resolve_attention("auto", "gpu", "f32") == "xla"  # cuDNN's flash attention takes 16-bit inputs only
    assert dev.resolve_attention("fused", "cpu", "f32") == "xla"
    assert dev.resolve_attention("blocked", "gpu", "bf16") == "blocked"


def test_a_gpu_s_free_memory_is_its_limit_less_what_jax_holds() -> None:
    from delphi.train.memory import CompiledMemory, available_memory, check_program_fits

    h100 = gpu(limit=60 * 10**9, in_use=5 * 10**9)
    available = available_memory([h100])
    assert available.per_device and available.bytes == 55 * 10**9 and "NVIDIA H100" in available.what
    cfg = TrainConfig()
    check_program_fits(cfg, CompiledMemory(argument=10**9, output=10**9, alias=10**9, temp=50 * 10**9), [h100])
    with pytest.raises(DelphiError, match=r"compiled train step needs 56 GB .* more than one gpu device's free"):
        check_program_fits(cfg, CompiledMemory(argument=10**9, output=10**9, alias=10**9, temp=55 * 10**9), [h100])
    assert dev.device_memory_bytes(SimpleNamespace(memory_stats=lambda: None)) is None


def test_ladder_workers_get_one_gpu_each(tmp_path, monkeypatch) -> None:
    from delphi.ladder.runner import LocalPlacer, worker_env

    gpus_dir = tmp_path / "gpus"
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (gpus_dir / bus).mkdir(parents=True)
    monkeypatch.delenv(dev.CUDA_VISIBLE_ENV, raising=False)
    assert dev.worker_gpus("gpu", gpus_dir=str(gpus_dir)) == ["0", "1"]
    assert dev.worker_gpus("cpu", gpus_dir=str(gpus_dir)) == []
    assert dev.worker_gpus("gpu", gpus_dir=str(tmp_path / "none")) == []
    monkeypatch.setenv(dev.CUDA_VISIBLE_ENV, "3,5")
    assert dev.worker_gpus("gpu", gpus_dir=str(gpus_dir)) == ["3", "5"]
    if not dev.jax_has_cuda():  # this machine: auto finds no CUDA build of JAX, so no GPU workers
        assert dev.worker_gpus("auto", gpus_dir=str(gpus_dir)) == []
    placer = LocalPlacer([[0], [1], [0]], tmp_path, gpus=["3", "5"])
    assert [s.gpu for s in placer.slots] == ["3", "5", "3"]
    assert worker_env(True, "5")[dev.CUDA_VISIBLE_ENV] == "5"
    placer.close()
