"""benchmarks/gpu_check.py (issue 42) in its reduced mode on the CPU: the real trainer on the smallest
benchmark shape, a few steps, into a temporary directory; the results file names the device and has
every field, and each MFU is a fraction in (0, 1] or the "unknown" string. One shape only (--only):
each costs ~8-14 s of CPU, mostly compilation, and the test must stay near 30 s on a loaded 2-core
machine; every other shape's config (the ladder's MoE and recipe, the full mode) is built and
validated without training. (The GPU run itself is by hand: see the script's docstring.)"""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def gpu_check():
    yield from load_benchmark("gpu_check")


def test_reduced_mode_writes_every_field(gpu_check, store, tmp_path, capsys) -> None:
    out = tmp_path / "results"
    argv = ["--reduced", "--only", "bench-d32", "--precision", "f32", "--store", str(store), "--out", str(out)]
    assert gpu_check.main(argv) == 0
    printed = capsys.readouterr().out

    result = json.loads((out / gpu_check.JSON_FILE).read_text())
    assert (out / gpu_check.MARKDOWN_FILE).read_text().startswith("# GPU check")
    device = result["device"]
    assert device["platform"] and device["device_kind"] and device["count"] >= 1
    assert device["name"] and device["name"] in printed
    if device["platform"] == "cpu":
        assert device["cpu_model"] and device["cpu_model"] in device["name"]
    assert result["mode"] == "reduced" and result["host"]["cpu_model"]
    assert result["estimate_s"] is None or result["estimate_s"] > 0

    assert [row["shape"] for row in result["rows"]] == ["bench-d32"]
    for row in result["rows"]:
        assert set(gpu_check.ROW_FIELDS) <= set(row), f"{row['shape']}: missing {set(gpu_check.ROW_FIELDS) - set(row)}"
        assert row["error"] is None, row["error"]
        assert row["tokens_per_s"] > 0 and row["steps"] > 0
        mfu = row["mfu"]
        if isinstance(mfu, str):
            assert mfu.startswith("unknown")
        else:
            assert 0 < mfu <= 1, f"{row['shape']}: MFU {mfu}"
        memory = row["peak_memory_bytes"]
        assert memory == gpu_check.NOT_REPORTED if device["platform"] == "cpu" else memory > 0
        assert row["xla_memory"] == gpu_check.NOT_REPORTED or row["xla_memory"]["total"] > 0
        assert row["shape"] in printed  # one progress line per shape


@pytest.mark.parametrize("reduced", [True, False])
def test_every_shape_has_a_valid_config(gpu_check, reduced) -> None:
    """The shapes not trained above: each mode's configs validate, on one device and split over two."""
    plan = gpu_check.shapes(reduced)
    assert {s.kind for s in plan} == {"benchmark", "ladder"}
    if not reduced:
        assert [s.name for s in plan] == list(gpu_check.FULL_STEPS)
        assert max(s.model.d_model for s in plan) == 1024
    for s in plan:
        for devices in (1, 2):
            cfg = gpu_check.train_config(s, "bf16", "stdlib", devices)
            assert cfg.mesh.data == devices and cfg.data.batch_size == s.shape.batch * devices
            assert cfg.optim.optimizer == ("adamh" if s.kind == "ladder" else "adamw")
            assert cfg.steps % gpu_check.bench.LOG_EVERY == 0 and (cfg.model.moe is not None) == (s.kind == "ladder")
        row = gpu_check.describe(s, gpu_check.train_config(s, "bf16", "stdlib", 1))
        assert gpu_check.estimate_s(row, gpu_check.H100_SXM_BF16) > gpu_check.ASSUMED_SETUP_S


def test_published_peaks_match_by_substring(gpu_check) -> None:
    peak = gpu_check.published_peak
    assert peak("NVIDIA H100 80GB HBM3", "bf16") == gpu_check.H100_SXM_BF16 == 989.4e12
    assert peak("NVIDIA H200", "bf16") == gpu_check.H200_SXM_BF16
    assert peak("NVIDIA H100 PCIe", "bf16") == gpu_check.H100_PCIE_BF16
    assert peak("NVIDIA A100-SXM4-80GB", "bf16") == gpu_check.A100_BF16 == 312e12
    assert peak("NVIDIA L4", "bf16") == gpu_check.L4_BF16 and peak("NVIDIA L40S", "bf16") == gpu_check.L40S_BF16
    assert peak("NVIDIA GeForce RTX 4090", "bf16") is None
    assert peak("NVIDIA H100 80GB HBM3", "f32") is None
    device = {"platform": "gpu", "device_kind": "Mystery Accelerator 9000", "count": 2}
    assert gpu_check.peak_for(device, "bf16") == (None, "unknown (no published bf16 peak for Mystery Accelerator 9000)")
    assert gpu_check.peak_for(device | {"device_kind": "NVIDIA H200"}, "bf16")[0] == 2 * gpu_check.H200_SXM_BF16
    gpu = gpu_check.default_out({"platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3"}, "2026-12-04")
    assert gpu.name == "gpu-check-2026-12-04-nvidia-h100-80gb-hbm3" and gpu.parent.name == "results"
    epyc = {"platform": "cpu", "device_kind": "cpu", "cpu_model": "AMD EPYC 7B13 64-Core Processor"}
    cpu = gpu_check.default_out(epyc, "2026-12-04")
    assert cpu.name == "gpu-check-2026-12-04-amd-epyc-7b13"
