"""benchmarks/seed_groups.py's arithmetic (the timing is a benchmark, run by hand, never a test):
the ladder-wide figure weights each shape's group ratio by its share of the ladder's FLOPs."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    yield from load_benchmark("seed_groups")


def test_the_ladder_figure_weights_shapes_by_their_flops(bench):
    rows = [
        {"ladder_flops_share": 0.75, "group2": {"group_wall_over_seeds_alone": 0.8}},
        {"ladder_flops_share": 0.25, "group2": {"group_wall_over_seeds_alone": 1.6}},
    ]
    assert bench.flops_weighted(rows, 2) == pytest.approx(0.75 * 0.8 + 0.25 * 1.6)  # 1.0, not the plain mean 1.2
    assert bench.flops_weighted(rows[:1], 2) == pytest.approx(0.8)  # shapes not timed do not count


def test_group_sizes_below_two_are_refused(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--seeds", "1"])
    assert exit_info.value.code == 2
    assert "--seeds: group sizes of at least 2" in capsys.readouterr().err
