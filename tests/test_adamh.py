"""AdamH (delphi.train.adamh, `optim.optimizer: adamh`): every AdamH matrix keeps its initial norm,
matrix by matrix; one step moves it by the requested relative amount; the real trainer resumes
bit-identically; bad configs exit 2 naming the key; AdamW configs keep their config_sha256."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from delphi.cli import main as cli_main
from delphi.model.config import ModelConfig, MoEConfig, MuPConfig
from delphi.train.adamh import ADAMH_GROUPS, adamh, matrix_norms, project_to_sphere, scale_by_sphere_projection
from delphi.train.config import (
    OptimConfig,
    TrainConfig,
    load_train_config,
    train_config_from_dict,
    train_config_to_dict,
)
from delphi.train.optim import group_hyperparams, make_optimizer, param_labels
from delphi.train.step import split_model
from tests.test_train import tiny_config, write_config

REPO = Path(__file__).resolve().parents[1]
NORM_RTOL = 1e-6  # the bound on the norm drift of an AdamH matrix
ADAMH = dict(optimizer="adamh", lr=0.05, adam_lr=1e-2, weight_decay=0.0)


def moe_model() -> ModelConfig:
    """Routed experts [E, d, f] and shared experts: every kind of hidden matrix the model has. The
    unembedding starts random so that every matrix gets a gradient on step 1 (zero, it gets none)."""
    return ModelConfig(
        d_model=32,
        n_layers=1,
        n_heads=2,
        mup=MuPConfig(base_d_model=16, zero_init_unembedding=False),
        moe=MoEConfig(experts=4, top_k=2, d_expert=16, shared_experts=1),
    )


@pytest.fixture(scope="module")
def moe():
    """graphdef, params, router biases, other of moe_model(), by the trainer's jitted init (an eager
    one compiles every weight's random draw on its own: tens of seconds on a busy 2-core machine)."""
    from delphi.train.trainer import init_model

    return split_model(init_model(TrainConfig(model=moe_model())))


def hidden_leaves(params) -> list[tuple[str, jax.Array]]:
    labels = param_labels(params)
    flat = jax.tree_util.tree_leaves_with_path(params)
    return [(jax.tree_util.keystr(p), leaf) for (p, leaf), g in zip(flat, jax.tree.leaves(labels)) if g in ADAMH_GROUPS]


def pseudo_grads(params, step: jax.Array):
    """Gradient-like noise in [-0.5, 0.5), different per leaf, entry and step: a sine hash, which
    compiles in a blink where jax.random's draws compile for seconds per shape on CPU."""
    leaves, treedef = jax.tree.flatten(params)

    def noise(i, x):
        phase = jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape) * 12.9898 + (step + 1.0) * 78.233 + i * 37.719
        return (jnp.sin(phase) * 43758.5453) % 1.0 - 0.5

    return jax.tree.unflatten(treedef, [noise(i, x) for i, x in enumerate(leaves)])


def relative_move(eta: float, cos: np.ndarray) -> np.ndarray:
    """||W1 - W0|| / ||W0|| of one exact AdamH step, for cos = <W0, u> / (||W0|| ||u||)."""
    stepped = np.sqrt(1 - 2 * eta * cos + eta**2)
    return np.sqrt(2 * (1 - (1 - eta * cos) / stepped))


# ---- the transformation ---------------------------------------------------------------------------


def test_stacked_matrices_keep_their_own_norms():
    """[L, E, rows, cols]: each of the L*E matrices, of different norms, keeps its own (not the stack's)."""
    scales = jnp.arange(1.0, 7.0).reshape(2, 3, 1, 1)  # distinct norms per matrix
    w0 = np.random.default_rng(0).standard_normal((2, 3, 8, 5)).astype(np.float32) * scales
    tx = scale_by_sphere_projection(0.3)

    @jax.jit
    def run(w):
        def step(carry, key):
            w, state = carry
            updates, state = tx.update(pseudo_grads(w, key) * scales[::-1], state, w)
            return (w + updates, state), None

        (w, state), _ = jax.lax.scan(step, (w, tx.init(w)), jnp.arange(5, dtype=jnp.float32))
        return w, state

    w, state = run(w0)
    assert state.radius.shape == (2, 3, 1, 1)
    assert float(jnp.abs(w - w0).min()) > 0  # every matrix moved
    np.testing.assert_allclose(matrix_norms(w), matrix_norms(w0), rtol=NORM_RTOL)
    np.testing.assert_allclose(state.radius[..., 0, 0], np.sqrt(8 * 5) * scales[..., 0, 0], rtol=0.5)


def test_one_step_moves_by_eta_of_the_norm():
    rng = np.random.default_rng(1)
    w = jnp.asarray(0.02 * rng.standard_normal((64, 48)), jnp.float32)
    u = jnp.asarray(rng.standard_normal((64, 48)), jnp.float32)
    radius = matrix_norms(w)
    for eta in (1e-3, 1e-2, 0.1):
        w1 = project_to_sphere(w, u, radius, eta)
        moved = float(jnp.linalg.norm(w1 - w) / jnp.linalg.norm(w))
        cos = float(jnp.vdot(w, u) / (jnp.linalg.norm(w) * jnp.linalg.norm(u)))
        assert moved == pytest.approx(relative_move(eta, cos), rel=1e-3)  # f32 differences of ~eta
        assert moved == pytest.approx(eta, rel=eta**2 + 3 * abs(cos))  # ~eta for small eta, u not along W
        assert float(jnp.linalg.norm(w1)) == pytest.approx(float(radius[0, 0]), rel=NORM_RTOL)


def test_zero_direction_is_no_step():
    w = jnp.ones((3, 4))
    tx = scale_by_sphere_projection(0.1)
    updates, _ = tx.update(jnp.zeros_like(w), tx.init(w), w)
    assert np.all(np.isfinite(updates)) and float(jnp.abs(updates).max()) < 1e-6


def test_vectors_are_refused():
    with pytest.raises(ValueError, match="matrices"):
        adamh(0.1, 0.9, 0.95, 1e-8).init({"gain": jnp.ones(4)})


# ---- the optimizer of a run -----------------------------------------------------------------------


def test_groups_under_adamh():
    cfg = moe_model()
    hp = group_hyperparams(cfg, OptimConfig(**ADAMH))
    assert {g for g, h in hp.items() if h["rule"] == "adamh"} == {"hidden"}
    assert {g for g, h in hp.items() if h["rule"] == "adam"} == {"embedding", "unembedding", "router", "vector"}
    assert hp["hidden"]["lr_multiplier"] == 1.0  # no width term on eta (m = 2 here)
    assert all(h["weight_decay"] == 0.0 for h in hp.values())
    assert all(h["base_lr"] == ("lr" if g == "hidden" else "adam_lr") for g, h in hp.items())
    adamw = group_hyperparams(cfg, OptimConfig())
    assert adamw["hidden"]["lr_multiplier"] == 0.5 and {h["rule"] for h in adamw.values()} == {"adamw"}


def test_every_adamh_matrix_keeps_its_initial_norm_after_k_steps(moe):
    cfg = moe_model()
    _, params, _, _ = moe
    optim = OptimConfig(**ADAMH, schedule="constant", warmup_frac=0.0)
    tx = make_optimizer(cfg, optim, steps=10)
    assert any(w.ndim == 3 for _, w in hidden_leaves(params))  # the routed experts are there
    k = 8

    @jax.jit
    def run(params):
        def step(carry, key):
            params, state = carry
            updates, state = tx.update(pseudo_grads(params, key), state, params)
            return (jax.tree.map(lambda p, u: p + u, params, updates), state), None

        (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), jnp.arange(k, dtype=jnp.float32))
        return params

    after = run(params)
    for (name, w0), (_, w) in zip(hidden_leaves(params), hidden_leaves(after)):
        np.testing.assert_allclose(matrix_norms(w), matrix_norms(w0), rtol=NORM_RTOL, err_msg=name)
        assert float(jnp.abs(w - w0).min()) > 0, name  # every matrix moved
    # plain Adam elsewhere: the embedding moved by ~adam_lr per step per entry, its norm is free
    moved = np.abs(np.asarray(after["embedding"][...] - params["embedding"][...]))
    assert moved.max() <= k * optim.adam_lr * 1.01 and moved.mean() > optim.adam_lr


def test_one_trainer_step_moves_each_matrix_by_eta(moe):
    """Real gradients, the run's optimizer (clip, schedule, groups): each hidden matrix, expert by
    expert, moves by eta of its norm on step 1 (Adam's first direction is u = g / (|g| + eps))."""
    from delphi.model.transformer import lm_loss

    cfg = moe_model()
    eta = 1e-2
    optim = OptimConfig(**(ADAMH | {"lr": eta}), schedule="constant", warmup_frac=0.0, grad_clip=0.0)
    graphdef, params, router_bias, other = moe
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 17)), jnp.int32)

    def loss(p):
        return lm_loss(nnx.merge(graphdef, p, router_bias, other), tokens)[0]

    grads = jax.jit(jax.grad(loss))(params)
    tx = make_optimizer(cfg, optim, steps=10)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    eps = group_hyperparams(cfg, optim)["hidden"]["eps"]
    for (name, w), (_, u), (_, g) in zip(hidden_leaves(params), hidden_leaves(updates), hidden_leaves(grads)):
        direction = g / (jnp.abs(g) + eps)
        cos = np.asarray(
            jnp.sum(w * direction, axis=(-2, -1)) / (matrix_norms(w) * matrix_norms(direction))[..., 0, 0], np.float64
        )
        moved = np.asarray(matrix_norms(u) / matrix_norms(w))[..., 0, 0]
        np.testing.assert_allclose(moved, relative_move(eta, cos), rtol=1e-3, err_msg=name)
        np.testing.assert_allclose(moved, eta, rtol=0.05, err_msg=name)


# ---- the trainer: resume --------------------------------------------------------------------------


def adamh_config(store: Path, **changes) -> TrainConfig:
    cfg = tiny_config(store)
    return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, **ADAMH), **changes).validate()


def final_state(run: Path, cfg: TrainConfig):
    from delphi.train import checkpoint as ckpt
    from delphi.train import sharding
    from delphi.train.step import TrainState
    from delphi.train.trainer import init_model

    mesh = sharding.make_mesh(cfg.mesh)
    _, params, router_bias, other = split_model(init_model(cfg, mesh))
    template = TrainState(params, make_optimizer(cfg.model, cfg.optim, cfg.steps).init(params), router_bias, other)
    restored = ckpt.restore_latest(run, template, sharding.state_shardings(template, mesh)).restored
    assert restored is not None and restored.step == cfg.steps
    return restored.state


def test_adamh_resume_is_bit_identical(store, tmp_path):
    from delphi.train.rundir import read_metrics
    from delphi.train.trainer import train

    cfg = adamh_config(store)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert train(cfg, whole, progress=False)["status"] == "completed"
    assert train(cfg, parts, progress=False, max_steps=6)["status"] == "failed"
    assert train(cfg, parts, resume=True, progress=False)["status"] == "completed"
    strip = lambda rs: [
        {k: v for k, v in r.items() if k not in {"tokens_per_s", "mfu", "wall_s", "eval_s", "time"}} for r in rs
    ]
    assert strip(read_metrics(whole)) == strip(read_metrics(parts))  # exactly, not approximately
    a, b = final_state(whole, cfg), final_state(parts, cfg)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # and the run's AdamH matrices are still on their spheres after 12 steps of real training
    radius = [
        leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(a.opt_state)
        if leaf.ndim >= 2 and leaf.shape[-2:] == (1, 1)
    ]
    assert radius and all(np.all(np.asarray(r) > 0) for r in radius)
    for _, w in hidden_leaves(a.params):
        assert any(matrix_norms(w).shape == r.shape and np.allclose(matrix_norms(w), r, rtol=NORM_RTOL) for r in radius)


# ---- the config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, key, wanted",
    [
        ({"optim.optimizer": "sgd"}, "optim.optimizer", "'sgd' is not one of"),
        (
            {"optim.optimizer": "adamh", "optim.adam_lr": 1e-2, "optim.weight_decay": 0.1},
            "optim.weight_decay",
            "no weight decay",
        ),
        ({"optim.optimizer": "adamh", "optim.weight_decay": 0.0}, "optim.adam_lr", "required"),
        ({"optim.optimizer": "adamh", "optim.adam_lr": 0.0}, "optim.adam_lr", "must be positive"),
        ({"optim.adam_lr": 1e-3}, "optim.adam_lr", "only for optim.optimizer adamh"),
    ],
)
def test_bad_optimizer_config_exits_2_naming_the_key(store, tmp_path, capsys, override, key, wanted):
    config = write_config(tmp_path / "cfg.yaml", tiny_config(store), **override)
    out = tmp_path / "run"
    assert cli_main(["train", str(config), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(config) in err and f"{key}:" in err and wanted in err, err
    assert not out.exists()


def test_adamh_yaml_round_trip_and_omitted_weight_decay(store, tmp_path):
    data = train_config_to_dict(tiny_config(store))
    data["optim"] = {k: v for k, v in data["optim"].items() if k != "weight_decay"} | {
        "optimizer": "adamh",
        "adam_lr": 3e-3,
    }
    cfg = train_config_from_dict(data)
    assert cfg.optim.optimizer == "adamh" and cfg.optim.weight_decay == 0.0 and cfg.optim.adam_lr == 3e-3
    written = train_config_to_dict(cfg)
    assert written["optim"]["optimizer"] == "adamh" and written["optim"]["adam_lr"] == 3e-3
    assert train_config_from_dict(written) == cfg


def committed_run_dirs() -> list[Path]:
    """One committed run dir per directory of runs under paper/ (every edition trained before AdamH,
    v1-v7: ladder, hero, probe; the eighth edition's runs are AdamH's)."""
    from delphi.editions import edition_tree

    seen: dict[Path, Path] = {}
    trees = [edition_tree(REPO / "paper" / "editions" / f"v{k}") for k in range(1, 8)]
    for summary in sorted(s for tree in trees for s in tree.rglob("summary.json")):
        if (summary.parent / "config.yaml").is_file():
            seen.setdefault(summary.parent.parent, summary.parent)
    return list(seen.values())


def test_adamw_configs_keep_their_config_sha256(tmp_path):
    """The sha256 each committed run recorded (before AdamH existed) is the one its config gets now;
    `optimizer: adamw` written out explicitly is the same config."""
    from delphi.hashes import sha256_bytes
    from delphi.train.trainer import config_yaml, identity_yaml

    runs = committed_run_dirs()
    assert len(runs) >= 10
    for run in runs:
        recorded = json.loads((run / "summary.json").read_text())["config_sha256"]
        cfg = load_train_config(run / "config.yaml")
        text = config_yaml(cfg)
        assert "optimizer" not in text and "adam_lr" not in text
        assert sha256_bytes(identity_yaml(text).encode()) == recorded, run
    # pinned: computed from this file before the optimizer key existed
    from delphi.editions import edition_tree

    v7 = edition_tree(REPO / "paper/editions/v7") / "lr_calibration/runs/LR_T4.2e+06_d192_L3_x1_s0"
    pinned = "8cfb58f21f984c438d7cdf319eacc5dddbe1ea510dddec59cd2f4093f9c48ca6"
    explicit = write_config(
        tmp_path / "explicit.yaml", load_train_config(v7 / "config.yaml"), **{"optim.optimizer": "adamw"}
    )
    assert "optimizer: adamw" in explicit.read_text()
    assert sha256_bytes(identity_yaml(explicit.read_text()).encode()) == pinned
    assert sha256_bytes(identity_yaml(config_yaml(load_train_config(explicit))).encode()) == pinned


def test_a_checkpoint_is_not_resumed_on_another_store(store, tmp_path):
    """A config names its store, not its bytes; a store rebuilt from other installed packages (the
    `environment` store) would have silently fed the rest of a resumed run other batches."""
    from delphi.errors import DelphiError
    from delphi.train.checkpoint import MANIFEST_FILE, list_checkpoints
    from delphi.train.trainer import train

    cfg = adamh_config(store)
    run = tmp_path / "run"
    assert train(cfg, run, progress=False, max_steps=6)["status"] == "failed"
    _, checkpoint = list_checkpoints(run)[-1]
    manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
    assert manifest["extra"]["data_sha256"] == json.loads((store / "meta.json").read_text())["sha256"]
    manifest["extra"]["data_sha256"] = "0" * 64  # as if trained on another build of the store
    (checkpoint / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(DelphiError, match="trained on token store sha256 0000000000000000"):
        train(cfg, run, resume=True, progress=False)
