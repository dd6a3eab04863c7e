"""benchmarks/moe_dispatch.py (issue 42) in its quick mode: the `jax.lax.ragged_dot` dispatch it
measures against the shipped block layout is the same function (every gradient agrees), so the
timing compares like with like. The timing itself is a benchmark, run by hand, never a test."""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def moe_dispatch():
    yield from load_benchmark("moe_dispatch")


def test_ragged_dot_dispatch_is_the_shipped_layer(moe_dispatch, tmp_path) -> None:
    out = tmp_path / "moe_dispatch.json"
    assert moe_dispatch.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["same_function"] and row["max_rel_grad_diff"] < moe_dispatch.AGREEMENT_RTOL
    assert row["blocks_ms"] > 0 and row["ragged_dot_ms"] > 0 and result["machine"]["cpu_model"]


def test_a_different_function_is_caught(moe_dispatch) -> None:
    """The agreement check can fail: dropping the gates changes every gradient."""
    import jax.numpy as jnp
    from flax import nnx

    from delphi.model.moe import MoE

    cfg = moe_dispatch.moe_same_active(moe_dispatch.LADDER_D32, moe_dispatch.DROPLESS_CAPACITY_FACTOR)
    moe = MoE(cfg, rngs=nnx.Rngs(0))
    x = jnp.ones((1, 8, cfg.d_model))
    _, shipped = moe_dispatch.timed_grad(moe_dispatch.shipped_forward, moe, x, reps=1)
    _, doubled = moe_dispatch.timed_grad(lambda m, x: 2 * moe_dispatch.ragged_forward(m, x), moe, x, reps=1)
    diff = max(float(abs(a - b).max() / (abs(a).max() + 1e-30)) for a, b in zip(shipped, doubled))
    assert diff > moe_dispatch.AGREEMENT_RTOL
