"""Learning-rate schedules and the muP parameter groups of the optimizer."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from delphi.model.config import ModelConfig, MoEConfig, MuPConfig
from delphi.train.config import OptimConfig
from delphi.train.optim import group_hyperparams, make_optimizer, param_labels
from delphi.train.schedules import decay_steps, lr_schedule, warmup_steps
from delphi.train.step import split_model
from delphi.train.trainer import TrainConfig, steps_per_call

STEPS = 1000


def curve(optim: OptimConfig, steps: int = STEPS) -> np.ndarray:
    return np.asarray(jax.vmap(lr_schedule(optim, steps))(jnp.arange(steps)))


def test_wsd_linear_shape():
    optim = OptimConfig(lr=1.0, schedule="wsd", warmup_frac=0.1, decay_frac=0.2, min_lr_frac=0.1)
    lr = curve(optim)
    n_warm, n_decay = warmup_steps(optim, STEPS), decay_steps(optim, STEPS)
    assert (n_warm, n_decay) == (100, 200)
    assert lr[0] == pytest.approx(1 / 100)  # warmup starts above zero so step 0 moves the weights
    assert np.all(np.diff(lr[:n_warm]) > 0)
    np.testing.assert_allclose(lr[n_warm : STEPS - n_decay], 1.0)  # stable
    decay = lr[STEPS - n_decay :]
    assert np.all(np.diff(decay) < 0)
    np.testing.assert_allclose(np.diff(decay), np.diff(decay)[0], rtol=1e-4)  # linear
    assert lr[-1] == pytest.approx(0.1)  # ends exactly on the floor


def test_wsd_sqrt_decays_faster_then_lands_on_the_floor():
    base = dict(lr=2.0, schedule="wsd", warmup_frac=0.0, decay_frac=0.5, min_lr_frac=0.0)
    linear = curve(OptimConfig(**base, decay_shape="linear"))
    sqrt = curve(OptimConfig(**base, decay_shape="sqrt"))
    np.testing.assert_allclose(linear[:500], 2.0)
    np.testing.assert_allclose(sqrt[:500], 2.0)
    assert np.all(sqrt[500:-1] < linear[500:-1])  # 1 - sqrt(p) < 1 - p on (0, 1)
    assert sqrt[-1] == pytest.approx(0.0, abs=1e-7) and linear[-1] == pytest.approx(0.0, abs=1e-7)
    p = (750 + 1 - 500) / 500
    assert sqrt[750] == pytest.approx(2.0 * (1 - np.sqrt(p)), rel=1e-5)


def test_cosine_and_constant():
    cos = curve(OptimConfig(lr=1.0, schedule="cosine", warmup_frac=0.05, min_lr_frac=0.1))
    assert np.argmax(cos) == 49 and cos.max() == pytest.approx(1.0)
    assert np.all(np.diff(cos[50:]) <= 1e-7)
    assert cos[-1] == pytest.approx(0.1)
    mid = 50 + (STEPS - 50) // 2
    assert cos[mid] == pytest.approx(0.55, abs=0.01)  # half way down the cosine
    const = curve(OptimConfig(lr=3.0, schedule="constant", warmup_frac=0.0))
    np.testing.assert_allclose(const, 3.0)


def test_steps_per_call_divides_every_sync_period():
    cfg = TrainConfig(steps=1000, log_every=10, eval_every=200, checkpoint_every=200)
    assert steps_per_call(cfg, cap=8) == 5
    assert steps_per_call(cfg) == 10  # default cap 16
    assert steps_per_call(dataclasses.replace(cfg, log_every=7), cap=8) == 1
    assert (
        steps_per_call(dataclasses.replace(cfg, log_every=8, eval_every=64, checkpoint_every=64, steps=128), cap=8) == 8
    )


def test_optimizer_applies_mup_group_multipliers():
    """First Adam step moves each weight by ~lr x its group's multiplier (|update| = lr for Adam's step 1)."""
    from delphi.model.transformer import Transformer

    cfg = ModelConfig(
        d_model=32,
        n_layers=1,
        n_heads=2,
        moe=MoEConfig(experts=4, top_k=2, d_expert=16),
        mup=MuPConfig(base_d_model=16),
    )
    assert cfg.width_mult == 2.0
    optim = OptimConfig(lr=1e-2, weight_decay=0.0, schedule="constant", warmup_frac=0.0, grad_clip=0.0, eps=1e-12)
    hp = group_hyperparams(cfg, optim)
    assert hp["hidden"]["lr_multiplier"] == 0.5 and hp["embedding"]["lr_multiplier"] == 1.0
    assert hp["vector"]["weight_decay"] == 0.0
    assert hp["hidden"]["eps"] == pytest.approx(1e-12 / (2.0 * 1.0))

    _, params, _, _ = split_model(Transformer(cfg, rngs=nnx.Rngs(0)))
    labels = jax.tree.leaves(param_labels(params))
    assert set(labels) == {"embedding", "hidden", "unembedding", "router", "vector"}
    tx = make_optimizer(cfg, optim, steps=10)
    grads = jax.tree.map(lambda p: jnp.ones_like(p), params)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    for label, update in zip(labels, jax.tree.leaves(updates)):
        expected = 1e-2 * (0.5 if label == "hidden" else 1.0)
        np.testing.assert_allclose(np.abs(np.asarray(update)), expected, rtol=1e-4, err_msg=label)


def test_weight_decay_scales_with_width_for_hidden_matrices():
    """lr x decay is width-independent: the hidden decay timescale does not change with m."""
    optim = OptimConfig(lr=1e-2, weight_decay=0.1)
    small = group_hyperparams(ModelConfig(d_model=64), optim)
    wide = group_hyperparams(ModelConfig(d_model=256), optim)
    for hp in (small, wide):
        assert hp["hidden"]["lr_multiplier"] * hp["hidden"]["weight_decay"] == pytest.approx(0.1)
    assert wide["embedding"]["weight_decay"] == small["embedding"]["weight_decay"] == 0.1
