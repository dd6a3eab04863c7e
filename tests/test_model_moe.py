"""MoE block: capacity dispatch equals a naive per-token reference, drops, stats, bias balancing."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import delphi.model.moe as moe_module
from delphi.model.config import ModelConfig, MoEConfig, MuPConfig
from delphi.model.moe import (
    DROPLESS_BLOCK,
    MoE,
    bias_update,
    block_slots,
    dispatch_slots,
    expert_capacity,
    rank_within_expert,
)


def make_moe(**moe_kwargs) -> MoE:
    cfg = ModelConfig(
        d_model=16,
        n_heads=2,
        moe=MoEConfig(**{"experts": 4, "top_k": 2, "d_expert": 8, **moe_kwargs}),
        mup=MuPConfig(init_std=0.3, base_d_model=16),
    )
    return MoE(cfg, rngs=nnx.Rngs(0))


def naive_moe(layer: MoE, x: jax.Array) -> jax.Array:
    """Token by token: route, run each chosen expert on that token alone, sum with the gates."""
    moe = layer.moe
    w_router, bias = np.asarray(layer.router[...]), np.asarray(layer.router_bias[...])
    w_in, w_out = np.asarray(layer.experts.w_in[...]), np.asarray(layer.experts.w_out[...])
    silu = lambda v: v / (1 + np.exp(-v))

    def expert(h_in, h_out, v):
        gate, up = np.split(v @ h_in, 2)
        return (silu(gate) * up) @ h_out

    out = []
    for v in np.asarray(x).reshape(-1, x.shape[-1]):
        logits = (v @ w_router) * layer.router_mult
        s = (
            np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
            if moe.score == "softmax"
            else 1 / (1 + np.exp(-logits))
        )
        chosen = np.argsort(-(s + bias), kind="stable")[: moe.top_k]
        gates = s[chosen] / s[chosen].sum() if moe.top_k > 1 else s[chosen]
        y = sum(g * moe.route_scale * expert(w_in[e], w_out[e], v) for g, e in zip(gates, chosen))
        if layer.shared is not None:
            y = y + expert(np.asarray(layer.shared.w_in[...]), np.asarray(layer.shared.w_out[...]), v)
        out.append(y)
    return np.stack(out).reshape(x.shape)


@nnx.jit(static_argnames="train")
def run(layer: MoE, x: jax.Array, train: bool):
    return layer(x, train=train)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"score": "sigmoid", "route_scale": 2.5, "shared_experts": 1},
        {"top_k": 1, "experts": 3},
    ],
    ids=["softmax-top2", "sigmoid-shared", "top1"],
)
@pytest.mark.parametrize("train", [False, True], ids=["dropless", "large-capacity"])
def test_moe_matches_naive_reference(kwargs, train):
    layer = make_moe(capacity_factor=8.0, **kwargs)  # capacity >= tokens: nothing can drop
    layer.router_bias[...] = jnp.array([0.3, -0.2, 0.1, 0.0][: layer.moe.experts])  # bias changes choices only
    x = jax.random.normal(jax.random.key(1), (2, 5, 16))
    y, stats = run(layer, x, train=train)
    assert float(stats.drop_frac) == 0.0
    np.testing.assert_allclose(np.asarray(y), naive_moe(layer, x), rtol=2e-4, atol=2e-5)


def test_dropless_blocks_match_capacity_groups_with_gradients(monkeypatch):
    """Many blocks per expert: the block layout gives the capacity groups' outputs and gradients."""
    layer = make_moe(capacity_factor=2.0)  # 4 experts top-2: dropless
    x = jax.random.normal(jax.random.key(2), (4, 40, 16))  # 320 assignments, ~3 blocks per expert

    def loss(layer, x):
        y, _ = layer(x, train=True)
        return jnp.sum(y**2), y

    (_, y_blocks), g_blocks = nnx.value_and_grad(loss, has_aux=True)(layer, x)
    monkeypatch.setattr(moe_module, "is_dropless", lambda *args, **kwargs: False)  # capacity = every token
    (_, y_groups), g_groups = nnx.value_and_grad(loss, has_aux=True)(layer, x)
    np.testing.assert_allclose(np.asarray(y_blocks), np.asarray(y_groups), rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(nnx.state(g_blocks)), jax.tree.leaves(nnx.state(g_groups))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)


def test_block_slots_layout():
    expert_idx = jnp.array([[0, 2]] * 40 + [[1, 0]] * 3)  # expert 0: 43 rows (2 blocks), 1: 3, 2: 40 (2)
    row, block_expert = block_slots(expert_idx, experts=4, block=DROPLESS_BLOCK)
    rows = np.asarray(row).reshape(-1)
    assert len(set(rows.tolist())) == rows.size  # one row per assignment
    experts = np.asarray(block_expert)[rows // DROPLESS_BLOCK]
    np.testing.assert_array_equal(experts, np.asarray(expert_idx).reshape(-1))  # each row in its expert's block
    assert np.asarray(block_expert)[:5].tolist() == [0, 0, 1, 2, 2]


@pytest.mark.parametrize("counted", [True, False])
def test_rank_within_expert_is_a_stable_sort_by_expert(counted, monkeypatch):
    """Counted or sorted, the ranks are the positions a stable argsort by expert gives."""
    if not counted:
        monkeypatch.setattr(moe_module, "COUNTED_RANK_MAX_CELLS", 0)
    flat = np.random.default_rng(0).integers(0, 8, 1024)
    rank, counts = rank_within_expert(jnp.asarray(flat), 8)
    order = np.argsort(flat, kind="stable")
    starts = np.cumsum(np.bincount(flat, minlength=8)) - np.bincount(flat, minlength=8)
    expected = np.empty_like(flat)
    expected[order] = np.arange(flat.size) - starts[flat[order]]
    np.testing.assert_array_equal(np.asarray(rank), expected)
    np.testing.assert_array_equal(np.asarray(counts), np.bincount(flat, minlength=8))


def test_capacity_drops_later_and_second_choices_first():
    # 4 tokens all choosing experts (0, 1): capacity ceil(0.5 * 4 * 2 / 2) = 2 per expert.
    expert_idx = jnp.array([[0, 1], [1, 0], [0, 1], [0, 1]])
    capacity = expert_capacity(4, 2, 2, 0.5, train=True)
    assert capacity == 2 and expert_capacity(4, 2, 2, 0.5, train=False) == 4
    slot, kept = dispatch_slots(expert_idx, 2, capacity)
    # first choices: expert 0 gets tokens 0, 2, 3 (keeps 0 and 2); expert 1 gets token 1 only,
    # so expert 1 keeps one second choice (token 0's, the earliest).
    np.testing.assert_array_equal(kept, [[True, True], [True, False], [True, False], [False, False]])
    assert len(set(np.asarray(slot)[np.asarray(kept)].tolist())) == int(kept.sum())  # distinct slots
    assert (np.asarray(slot)[~np.asarray(kept)] == 2 * capacity).all()  # the overflow slot


def test_drops_are_counted_and_zero():
    layer = make_moe(capacity_factor=0.25)
    x = jax.random.normal(jax.random.key(2), (2, 8, 16))
    y, stats = run(layer, x, train=True)
    capacity = expert_capacity(16, 2, 4, 0.25, train=True)
    assert float(stats.drop_frac) >= 1 - 4 * capacity / 32 - 1e-6
    y_free, stats_free = run(layer, x, train=False)
    assert float(stats_free.drop_frac) == 0.0
    assert not np.allclose(y, y_free)


def test_stats_and_losses():
    layer = make_moe(balance="aux", aux_loss_weight=1.0, z_loss_weight=0.0)
    x = jax.random.normal(jax.random.key(3), (4, 16, 16))
    _, stats = run(layer, x, train=False)
    assert float(stats.expert_load.sum()) == pytest.approx(1.0)
    # Switch aux = E * sum f_i P_i >= 1 for any routing with f = P and is about 1 near balance.
    assert 0.9 < float(stats.aux_loss) < 4.0
    assert 0 < float(stats.router_entropy) <= math.log(4) + 1e-6
    no_aux = make_moe(balance="bias", z_loss_weight=0.0)
    assert float(run(no_aux, x, train=False)[1].aux_loss) == 0.0


def test_bias_update_rule():
    load = jnp.array([0.5, 0.25, 0.25, 0.0])
    np.testing.assert_allclose(bias_update(jnp.zeros(4), load, 0.1), [-0.1, 0.0, 0.0, 0.1])
    stacked = bias_update(jnp.zeros((2, 4)), jnp.stack([load, load[::-1]]), 1.0)
    np.testing.assert_allclose(stacked, [[-1, 0, 0, 1], [1, 0, 0, -1]])


def test_bias_update_balances_a_skewed_router():
    layer = make_moe(experts=8, top_k=2)
    layer.router[...] = layer.router[...].at[:, 0].add(0.4)  # expert 0 preferred by most tokens
    x = jax.random.normal(jax.random.key(4), (8, 32, 16)) + 0.5
    imbalance = []
    for _ in range(80):
        _, stats = run(layer, x, train=False)
        imbalance.append(float(stats.expert_load.max() / stats.expert_load.mean()))
        layer.router_bias[...] = bias_update(layer.router_bias[...], stats.expert_load, 0.01)
    assert imbalance[0] > 2.0
    assert max(imbalance[-10:]) < 1.5, imbalance[::10]
