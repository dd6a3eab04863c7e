"""The transformer: shapes, causal masking, validation, precision, the loss at init."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from delphi.errors import DelphiError
from delphi.model.config import ModelConfig, MoEConfig, MuPConfig
from delphi.model.transformer import Transformer, apply_rope, lm_loss, rope_tables

DENSE = ModelConfig(
    d_model=32, n_layers=2, n_heads=2, d_ff=64, mup=MuPConfig(zero_init_unembedding=False, base_d_model=32)
)
MOE = DENSE.replace(moe=MoEConfig(experts=4, top_k=2, d_expert=16, shared_experts=1))


@nnx.jit(static_argnames="train")
def forward(model: Transformer, t: jax.Array, train: bool = True):
    """Compiled forward pass: eager op-by-op execution is much slower on CPU."""
    return model(t, train=train)


def tokens(batch: int, seq: int, seed: int = 0) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, 256)


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_forward_shapes_and_stats(cfg):
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    logits, stats = forward(model, tokens(2, 12))
    assert logits.shape == (2, 12, 256) and logits.dtype == jnp.float32
    experts = cfg.moe.experts if cfg.moe else 0
    assert stats["expert_load"].shape == (cfg.n_layers, experts)
    for key in ("aux_loss", "drop_frac", "router_entropy"):
        assert stats[key].shape == ()
    if cfg.moe:
        np.testing.assert_allclose(stats["expert_load"].sum(axis=1), 1.0, rtol=1e-6)
        assert 0 < float(stats["router_entropy"]) <= math.log(experts) + 1e-6
        assert float(stats["aux_loss"]) > 0  # z-loss is on by default
    else:
        assert float(stats["aux_loss"]) == 0.0


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_future_tokens_do_not_change_past_logits(cfg):
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    a = tokens(2, 16, seed=1)
    b = a.at[:, 9:].set((a[:, 9:] + 7) % 256)  # change every token from position 9 on
    # MoE: dropless evaluation; with a training capacity a later token can take an earlier
    # token's expert slot, which is the known non-causality of capacity-limited routing.
    la, _ = forward(model, a, train=False)
    lb, _ = forward(model, b, train=False)
    np.testing.assert_allclose(la[:, :9], lb[:, :9], atol=1e-5)
    assert not np.allclose(la[:, 9:], lb[:, 9:], atol=1e-3)


def test_rope_is_a_relative_rotation():
    cos, sin = rope_tables(8, 4, 10_000.0)
    q = jax.random.normal(jax.random.key(0), (1, 1, 1, 4))
    k = jax.random.normal(jax.random.key(1), (1, 1, 1, 4))

    def score(i, j):
        qi = apply_rope(jnp.broadcast_to(q, (1, 8, 1, 4)), cos, sin)[0, i, 0]
        kj = apply_rope(jnp.broadcast_to(k, (1, 8, 1, 4)), cos, sin)[0, j, 0]
        return float(qi @ kj)

    assert score(5, 3) == pytest.approx(score(4, 2), rel=1e-5)  # depends on i - j only
    assert score(5, 3) != pytest.approx(score(5, 2), rel=1e-3)


def test_zero_init_unembedding_gives_uniform_loss():
    cfg = DENSE.replace(mup=MuPConfig(base_d_model=32))
    loss, stats = nnx.jit(lm_loss)(Transformer(cfg, rngs=nnx.Rngs(0)), tokens(2, 9))
    assert float(stats["ce_loss"]) == pytest.approx(math.log(256), rel=1e-6)


def test_bf16_compute_keeps_f32_params_and_close_logits():
    f32 = Transformer(MOE, rngs=nnx.Rngs(0))
    bf16 = Transformer(MOE, rngs=nnx.Rngs(0), compute_dtype=jnp.bfloat16)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(bf16, nnx.Param)))
    t = tokens(2, 8)
    l32, _ = forward(f32, t, train=False)
    l16, _ = forward(bf16, t, train=False)
    assert l16.dtype == jnp.float32
    np.testing.assert_allclose(l16, l32, atol=0.05 * float(jnp.abs(l32).max()))


def test_gradients_reach_every_parameter():
    model = Transformer(MOE, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch = tokens(2, 9)
    grads = jax.jit(jax.grad(lambda p: lm_loss(nnx.merge(graphdef, p, rest), batch)[0]))(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert float(jnp.abs(g).max()) > 0, path


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"n_heads": 3}, "model.n_heads"),  # does not divide d_model = 32
        ({"n_heads": 32}, "model.n_heads"),  # head size 1: odd, RoPE needs pairs
        ({"d_ff": 0}, "model.d_ff"),
        ({"moe": MoEConfig(experts=2, top_k=3)}, "model.moe.top_k"),
        ({"moe": MoEConfig(capacity_factor=0.0)}, "model.moe.capacity_factor"),
        ({"moe": MoEConfig(experts=0, top_k=0)}, "model.moe.experts"),
        ({"mup": MuPConfig(base_d_model=0)}, "model.mup.base_d_model"),
    ],
)
def test_invalid_configs_name_the_field(changes, field):
    cfg = DENSE.replace(**changes)
    with pytest.raises(DelphiError, match=field.replace(".", r"\.")):
        cfg.validate("model")
    with pytest.raises(DelphiError):  # the model refuses to build before any compilation
        Transformer(cfg, rngs=nnx.Rngs(0))
