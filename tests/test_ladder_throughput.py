"""benchmarks/ladder_throughput.py's arithmetic on made-up rates (the measurement itself is a benchmark,
run by hand): the aggregate is the ladder's FLOPs over the one-worker wall, i.e. the compute-weighted
harmonic mean of the shapes' rates, unmeasured shapes are left out and counted in `coverage`."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    yield from load_benchmark("ladder_throughput")


def rung(bench, run_id: str, budget: float, flops: float, shape: str, role: str = "isoflop"):
    return bench.LadderRung("v8", run_id, role, budget, flops, flops_per_token=1e6, batch_tokens=512, shape=shape)


def test_aggregate_is_the_compute_weighted_harmonic_mean(bench):
    rungs = [
        rung(bench, "a", 1e12, 1e12, "small"),
        rung(bench, "b", 1e12, 3e12, "large"),
        rung(bench, "c", 4e12, 4e12, "unmeasured", role="anchor"),
    ]
    rates = {"small": 1e10, "large": 4e10}  # 100 s + 75 s for 4e12 FLOPs
    out = bench.aggregate(rungs, rates, peak_flops_per_s=1e11)
    assert out["wall_s_one_worker"] == pytest.approx(175.0)
    assert out["model_flops_per_s"] == pytest.approx(4e12 / 175.0)  # not 2.5e10 (mean) nor 3.25e10 (FLOP-weighted mean)
    assert out["fraction_of_peak"] == pytest.approx(4e12 / 175.0 / 1e11)
    assert out["coverage"] == pytest.approx(0.5)
    assert (out["rungs"], out["rungs_measured"], out["shapes"], out["shapes_measured"]) == (3, 2, 3, 2)

    by_budget = bench.per_budget(rungs, rates, 1e11)
    assert list(by_budget) == ["1e+12", "4e+12 (anchor)"]
    assert by_budget["4e+12 (anchor)"]["model_flops_per_s"] is None  # nothing measured: no rate, no NaN


def test_unequal_weights_pull_towards_the_slow_shape(bench):
    rungs = [rung(bench, "a", 1e12, 9e12, "slow"), rung(bench, "b", 1e12, 1e12, "fast")]
    out = bench.aggregate(rungs, {"slow": 1e10, "fast": 1e11}, 1e11)
    assert out["model_flops_per_s"] == pytest.approx(1e13 / (900.0 + 10.0))


def test_overhead_fit_recovers_a_line(bench):
    overhead_s, rate = 2e-3, 5e10
    points = [(f, overhead_s + f / rate) for f in (1e8, 1e9, 4e9)]
    fit = bench.overhead_fit(points)
    assert fit["overhead_ms_per_step"] == pytest.approx(2.0)
    assert fit["marginal_flops_per_s"] == pytest.approx(rate)
    assert bench.overhead_fit(points[:1]) is None


def test_spread_keeps_both_ends(bench):
    items = [str(i) for i in range(10)]
    assert bench.spread(items, 2) == ["0", "9"]
    assert bench.spread(items, 4) == ["0", "3", "6", "9"]
    assert bench.spread(items, None) == items
    assert bench.spread(items, 20) == items


def test_the_default_ladder_is_planned_in_memory(bench):
    """The built-in study's ladder (issue 42's throughput row): its 40 rungs, each with a shape whose
    config is kept, the rungs' FLOPs those of the header of delphi/defaults/ladder_default.yaml."""
    rungs, configs = bench.default_rungs()
    assert len(rungs) == 40 and {r.ladder for r in rungs} == {"default"}
    assert {r.shape for r in rungs} == set(configs)
    assert sum(r.flops for r in rungs) == pytest.approx(7.5e12, rel=0.05)
    assert all(cfg.model.moe is not None for cfg in configs.values())
