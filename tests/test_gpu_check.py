"""benchmarks/gpu_check.py in its --smoke form on the CPU: every item of the GPU table (the same-run
peak, the dense and MoE steps, the dropless MoE rung, the small ladder alone and as seed groups)
through the real trainer at the smallest sizes, into a temporary directory; the results name the
device, every row has its numbers and every target its value. The full sizes' configs are built
and validated without training: the GPU run itself needs a GPU (the script's docstring says how).
"""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def gpu_check():
    yield from load_benchmark("gpu_check")


def test_the_smoke_run_covers_the_whole_table(gpu_check, store, tmp_path, capsys) -> None:
    out = tmp_path / "results"
    assert gpu_check.main(["--smoke", "--store", str(store), "--out", str(out)]) == 0
    printed = capsys.readouterr().out

    result = json.loads((out / gpu_check.JSON_FILE).read_text())
    assert (out / gpu_check.MARKDOWN_FILE).read_text().startswith("# GPU check")
    device = result["device"]
    assert device["name"] in printed and device["count"] == 1
    assert result["mode"] == "smoke" and result["peak_flops"] > 0
    rows = {r["item"]: r for r in result["rows"]}
    assert set(rows) == set(gpu_check.ITEMS), set(rows)
    assert all(r["error"] is None and not r.get("skipped") for r in rows.values()), rows
    for name in ("dense-d1024", "moe-d1024", "moe-dropless-d1024"):
        row = rows[name]
        assert 0 < row["mfu"] <= 1 and row["tokens_per_s"] > 0 and row["attention"] == "blocked"
        assert row["memory"]["compiled"]["total"] > 0 and row["memory"]["estimate"] > 0
        assert row["peak_memory_bytes"] == gpu_check.NOT_REPORTED  # the CPU keeps no device peak
        assert name in printed
    assert (
        rows["moe-d1024"]["moe"]["capacity_factor"] == 1.25
        and rows["moe-dropless-d1024"]["moe"]["capacity_factor"] == 4.0
    )
    ladder = rows["ladder"]
    assert (
        ladder["alone_wall_s"] > 0 and ladder["grouped_wall_s"] > 0 and isinstance(ladder["shared_program_pays"], bool)
    )
    assert set(result["targets"]) >= {"dense-d1024 MFU", "moe-d1024 MFU", "moe-dropless-d1024 memory estimate / peak"}


def test_an_item_past_the_budget_is_skipped_not_cut(gpu_check, store, tmp_path) -> None:
    out = tmp_path / "results"
    assert (
        gpu_check.main(
            ["--smoke", "--store", str(store), "--out", str(out), "--budget-s", "1", "--only", "dense-d1024"]
        )
        == 0
    )
    rows = {r["item"]: r for r in json.loads((out / gpu_check.JSON_FILE).read_text())["rows"]}
    assert set(rows) == {"peak", "dense-d1024"} and "budget" in rows["dense-d1024"]["skipped"]


def test_the_full_table_s_configs_are_valid(gpu_check) -> None:
    """What a GPU session would train: d1024 at sequence 1024 for the dense item and its MoE twin
    (same active parameters), the ladder family's d1024 rung for the dropless one, bf16."""
    from delphi.model.flops import count_params

    sizes = gpu_check.FULL
    configs = gpu_check.item_configs(sizes, "stdlib")
    dense, moe, dropless = configs["dense-d1024"], configs["moe-d1024"], configs["moe-dropless-d1024"]
    assert dense.model.d_model == moe.model.d_model == dropless.model.d_model == 1024
    assert dense.data.seq_len >= 1024 and moe.data.seq_len >= 1024 and dense.precision == "bf16"
    assert dense.model.d_head == 128  # cuDNN's flash attention takes it
    assert count_params(moe.model).active == pytest.approx(count_params(dense.model).active, rel=1e-3)  # + the router
    assert dropless.optim.optimizer == "adamh" and dropless.model.moe.capacity_factor * 2 >= 8
    ladder = gpu_check.ladder_configs(sizes, "stdlib")
    assert list(ladder) == list(sizes.ladder_widths) and all(len(c) == sizes.ladder_seeds for c in ladder.values())
    assert all(len({(c.seed, c.data.seed) for c in cfgs}) == sizes.ladder_seeds for cfgs in ladder.values())


def test_the_full_run_is_planned_to_fit_the_budget_on_an_h100(gpu_check) -> None:
    """At the predicted MFU and set-up per program, with an H100's measured bf16 rate (798 TFLOP/s,
    /work/.library/device/KINDS.md), every item fits the 8 minutes."""
    sizes = gpu_check.FULL
    peak = 798e12
    configs = gpu_check.item_configs(sizes, "stdlib")
    total = gpu_check.ladder_predicted_s(gpu_check.ladder_configs(sizes, "stdlib"), sizes, peak)
    total += sum(gpu_check.predicted_s([c], sizes, peak, 1, 1) for c in configs.values())
    assert total < gpu_check.BUDGET_S - 60, total  # a minute for JAX's start and the peak
