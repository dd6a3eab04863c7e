"""Evaluation in one fused call at its own batch size gives the val loss of the former
per-training-batch evaluation (to float rounding), whatever the eval batch; a larger final
evaluation on a superset of the curve's windows; checkpoints by time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from delphi.data.loader import TokenStore
from delphi.errors import DelphiError
from delphi.model.config import ModelConfig, MoEConfig
from delphi.model.transformer import cross_entropy
from delphi.train import sharding
from delphi.train.checkpoint import list_checkpoints
from delphi.train.config import EVAL_BATCH_TOKENS, DataConfig, OptimConfig, TrainConfig
from delphi.train.optim import make_optimizer
from delphi.train.step import TrainState, eval_blocks, make_eval_step, split_model
from delphi.train.trainer import config_yaml, eval_set, evaluate, identity_yaml, init_model, train

REL_TOL = 1e-6  # f32 sums in another order, other batch shapes (measured: 8e-8 and 3e-7)


def tiny_config(store: Path, **changes) -> TrainConfig:
    cfg = TrainConfig(
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, moe=MoEConfig(experts=4, top_k=2, d_expert=32)),
        data=DataConfig(store=str(store), seq_len=32, batch_size=6, seed=3),
        optim=OptimConfig(lr=1e-2, warmup_frac=0.1, decay_frac=0.3),
        steps=8,
        log_every=4,
        eval_every=4,
        eval_tokens=1000,
        checkpoint_every=8,
    )
    return dataclasses.replace(cfg, **changes).validate()


def per_batch_val_loss(cfg: TrainConfig, state: TrainState, graphdef, store: TokenStore) -> float:
    """The former evaluation: one call per training-size batch, mean loss x targets, summed on the host."""

    @jax.jit
    def eval_step(state: TrainState, tokens):
        model = nnx.merge(graphdef, state.params, state.router_bias, state.other)
        logits, _ = model(tokens[:, :-1], train=False)
        return cross_entropy(logits, tokens[:, 1:]) * tokens[:, 1:].size

    batches = list(store.eval_batches(cfg.eval_tokens, cfg.data.batch_size, cfg.data.seq_len))
    return float(sum(eval_step(state, batch) for batch in batches)) / sum(b[:, 1:].size for b in batches)


def test_fused_eval_equals_per_batch_eval(store):
    cfg = tiny_config(store)
    data = TokenStore(store)
    graphdef, params, router_bias, other = split_model(init_model(cfg))
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    state = TrainState(params, tx.init(params), router_bias, other)
    reference = per_batch_val_loss(cfg, state, graphdef, data)
    n_windows = data.eval_windows(cfg.eval_tokens, cfg.data.batch_size, cfg.data.seq_len)
    assert n_windows == 36  # ceil(1000 / (6 x 32)) = 6 batches of 6
    eval_step = make_eval_step(graphdef)
    placement = sharding.batch_sharding(sharding.make_mesh(cfg.mesh), 1)
    # 5: a padded last batch; None: one batch of all 36 (the default at seq 32)
    for batch in (5, None):
        got = evaluate(eval_step, state, eval_set(dataclasses.replace(cfg, eval_batch_size=batch), data, placement))[0][
            0
        ]
        assert got == pytest.approx(reference, rel=REL_TOL), batch


def test_eval_blocks_pad_with_zero_weights():
    windows = np.arange(7 * 3, dtype=np.int32).reshape(7, 3)
    tokens, weights = eval_blocks(windows, 3)
    assert tokens.shape == (3, 3, 3) and weights.shape == (3, 3)
    assert weights.sum() == 7 and weights[-1].tolist() == [1.0, 0.0, 0.0]
    np.testing.assert_array_equal(tokens.reshape(9, 3)[:7], windows)


def test_default_eval_batch_size():
    cfg = TrainConfig(data=DataConfig(seq_len=128, batch_size=2))
    assert cfg.eval_batch_sequences(512) == EVAL_BATCH_TOKENS // 128
    assert cfg.eval_batch_sequences(20) == 20  # never more than the windows
    assert dataclasses.replace(cfg, eval_batch_size=3).eval_batch_sequences(512) == 3


def test_eval_batch_size_is_not_part_of_the_run_identity(store):
    cfg = tiny_config(store)
    other = dataclasses.replace(cfg, eval_batch_size=4)
    assert config_yaml(cfg) != config_yaml(other)
    assert identity_yaml(config_yaml(cfg)) == identity_yaml(config_yaml(other))


@pytest.mark.parametrize("value", [0, -2])
def test_bad_eval_batch_size(store, value):
    with pytest.raises(DelphiError, match="eval_batch_size"):
        tiny_config(store, eval_batch_size=value)


@pytest.mark.slow  # two trainings: ~40 s on a loaded 2-core machine
def test_trained_val_loss_independent_of_eval_batch(store, tmp_path):
    """End to end: the default (one batch of all 36 windows) against the former batch (6)."""
    fused = train(tiny_config(store), tmp_path / "fused", progress=False)
    former = train(tiny_config(store, eval_batch_size=6), tmp_path / "former", progress=False)
    assert fused["val_loss"] == pytest.approx(former["val_loss"], rel=REL_TOL)
    assert fused["eval_s"] >= 0 and fused["checkpoint_s"] >= 0 and fused["train_s"] > 0
    assert jax.device_count() >= 1


def test_checkpoints_by_time_skip_periodic_saves_only(store, tmp_path):
    """checkpoint_every_s far above the run's length: no periodic save, the final one is written;
    the key is left out of the run's identity (it changes no number)."""
    cfg = tiny_config(store, checkpoint_every=2, keep_checkpoints=5, checkpoint_every_s=3600.0)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [8]
    assert identity_yaml(config_yaml(cfg)) == identity_yaml(
        config_yaml(dataclasses.replace(cfg, checkpoint_every_s=0.0))
    )
    with pytest.raises(DelphiError, match="checkpoint_every_s"):
        tiny_config(store, checkpoint_every_s=-1.0)


def test_a_checkpoint_clock_saves_at_log_points(store, tmp_path, monkeypatch):
    """DELPHI_CHECKPOINT_CLOCK_S: a save at each log point once that many seconds passed since the
    last, between the count's checkpoints; the run's identity is unchanged and it resumes from one."""
    from delphi.train.environment import CHECKPOINT_CLOCK_ENV

    monkeypatch.setenv(CHECKPOINT_CLOCK_ENV, "1e-9")
    cfg = tiny_config(store, steps=12, log_every=4, eval_every=12, checkpoint_every=12, keep_checkpoints=5)
    train(cfg, tmp_path / "run", progress=False, max_steps=8)
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [4, 8]
    monkeypatch.delenv(CHECKPOINT_CLOCK_ENV)
    resumed = train(cfg, tmp_path / "run", resume=True, progress=False)
    straight = train(cfg, tmp_path / "straight", progress=False)
    assert resumed["val_loss"] == pytest.approx(straight["val_loss"], rel=1e-5)


def test_final_eval_chunks_extend_the_curve_set(store):
    """Chunk 0 is the regular eval set; the chunks are disjoint, of one shape, and together an
    evenly spread set of m x k windows with at least final_tokens targets."""
    data = TokenStore(store)
    regular = data.eval_set(1000, 6, 32)
    chunks = data.final_eval_chunks(1000, 4000, 6, 32)
    assert len(chunks) == 4 and all(
        c.shape == regular.shape for c in chunks
    )  # ceil(4000 / 192) = 21 batches -> 4 x 36 windows
    np.testing.assert_array_equal(chunks[0], regular)
    np.testing.assert_array_equal(
        np.concatenate(chunks), np.concatenate([data._spread_windows(144, 32)[j::4] for j in range(4)])
    )
    assert data.n_val_windows(32) >= 144  # evenly spread over more windows than picked: none twice
    with pytest.raises(DelphiError, match="final_eval_tokens: 10000000 tokens"):
        data.final_eval_chunks(1000, 10_000_000, 6, 32)


def test_final_eval_is_the_mean_over_every_chunk(store):
    cfg = tiny_config(store, final_eval_tokens=3000)
    data = TokenStore(store)
    graphdef, params, router_bias, other = split_model(init_model(cfg))
    # weights away from the zero readout, so that windows differ in loss
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    params = jax.tree.unflatten(
        treedef, [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    )
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    state = TrainState(params, tx.init(params), router_bias, other)
    placement = sharding.batch_sharding(sharding.make_mesh(cfg.mesh), 1)
    evals = eval_set(cfg, data, placement)
    assert len(evals.chunks) == 3
    curve, full = evaluate(make_eval_step(graphdef), state, evals, final=True)
    assert curve[0] == pytest.approx(per_batch_val_loss(cfg, state, graphdef, data), rel=REL_TOL)
    per_chunk = [per_batch_val_loss(cfg, state, graphdef, _Chunk(c)) for c in data.final_eval_chunks(1000, 3000, 6, 32)]
    assert full[0] == pytest.approx(np.mean(per_chunk), rel=REL_TOL) and full[0] != curve[0]
    assert evaluate(make_eval_step(graphdef), state, evals)[1] == curve  # not final: chunk 0 only


class _Chunk:
    """A store whose eval batches are one chunk's windows (per_batch_val_loss reads eval_batches)."""

    def __init__(self, windows: np.ndarray) -> None:
        self.windows = windows

    def eval_batches(self, n_tokens: int, batch_size: int, seq_len: int):
        for b in range(0, len(self.windows), batch_size):
            yield self.windows[b : b + batch_size]


def test_trained_run_reports_the_final_set_and_keeps_the_curve_set(store, tmp_path):
    cfg = tiny_config(store, final_eval_tokens=3000)
    summary = train(cfg, tmp_path / "run", progress=False)
    from delphi.train.rundir import read_metrics

    evals = [r for r in read_metrics(tmp_path / "run") if r.get("val_loss") is not None]
    assert [r["step"] for r in evals] == [4, 8] and "val_loss_final_set" not in evals[0]
    assert summary["val_loss"] == evals[-1]["val_loss_final_set"] != evals[-1]["val_loss"]
    assert summary["final_eval_targets"] == 3 * 36 * 32
    # unset, the key leaves a run's identity as it was before the key existed
    plain = tiny_config(store)
    old_text = config_yaml(plain).replace("final_eval_tokens: null\n", "")
    assert "final_eval_tokens" not in old_text and identity_yaml(old_text) == identity_yaml(config_yaml(plain))
    assert identity_yaml(config_yaml(cfg)) != identity_yaml(config_yaml(plain))
    with pytest.raises(DelphiError, match="final_eval_tokens: must be >= eval_tokens"):
        tiny_config(store, final_eval_tokens=500)
