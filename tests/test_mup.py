"""muP: parameter groups and multipliers, init scaling, and the coordinate check (muP passes, SP fails)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx

from delphi.experiments.coordcheck import CoordCheckSpec, coord_check, save_report
from delphi.model import mup
from delphi.model.config import ModelConfig, MoEConfig, MuPConfig
from delphi.model.transformer import Transformer

MOE = ModelConfig(
    d_model=128,
    n_layers=4,
    n_heads=4,
    moe=MoEConfig(experts=4, top_k=2, d_expert=64, shared_experts=1),
    mup=MuPConfig(base_d_model=32, base_n_layers=2),
)


def groups_of(cfg: ModelConfig) -> dict[str, str]:
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    labels = mup.param_labels(nnx.state(model, nnx.Param))
    return {
        "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path[:-1]): g
        for path, g in jax.tree_util.tree_leaves_with_path(labels)
    }


def test_every_parameter_has_the_right_group():
    groups = groups_of(MOE)
    assert groups["embedding"] == "embedding" and groups["unembedding"] == "unembedding"
    assert groups["final_norm/scale"] == "vector"
    for i in range(4):
        b = f"blocks/{i}"
        assert groups[f"{b}/ffn/router"] == "router"
        for name in (
            "attn/w_qkv",
            "attn/w_out",
            "ffn/experts/w_in",
            "ffn/experts/w_out",
            "ffn/shared/w_in",
            "ffn/shared/w_out",
        ):
            assert groups[f"{b}/{name}"] == "hidden", name
        for name in ("attn_norm/scale", "ffn_norm/scale", "attn/q_norm/scale", "attn/k_norm/scale"):
            assert groups[f"{b}/{name}"] == "vector", name
    assert not any("router_bias" in k for k in groups)  # RouterBias is not a Param
    assert mup.param_group(("blocks", 0, "attn", "w_qkv", "value")) == "hidden"
    with pytest.raises(ValueError):
        mup.param_group(("blocks", 0, "mystery"))


def test_multipliers_follow_design_table():
    m, m_l = 128 / 32, 4 / 2
    assert mup.lr_multiplier(MOE, "hidden") == pytest.approx(1 / m)
    assert mup.weight_decay_multiplier(MOE, "hidden") == pytest.approx(m)  # lr * wd unchanged
    for g in ("embedding", "unembedding", "router", "vector"):
        assert mup.lr_multiplier(MOE, g) == 1.0
    assert mup.weight_decay_multiplier(MOE, "vector") == 0.0
    assert mup.weight_decay_multiplier(MOE, "router") == 1.0
    assert mup.adam_eps(MOE, 1e-8) == pytest.approx(1e-8 / (m * m_l))
    sp = MOE.replace(mup=MuPConfig(enabled=False))
    assert all(mup.lr_multiplier(sp, g) == 1.0 for g in mup.GROUPS)
    assert mup.adam_eps(sp, 1e-8) == 1e-8


def test_init_std_and_forward_multipliers_scale_with_width():
    cfg = MOE
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    sigma, m = cfg.mup.init_std, cfg.width_mult
    assert float(np.std(model.embedding[...])) == pytest.approx(sigma, rel=0.05)
    assert float(np.std(model.blocks[0].attn.w_qkv[...])) == pytest.approx(sigma / np.sqrt(m), rel=0.05)
    assert float(np.std(model.blocks[0].ffn.experts.w_in[...])) == pytest.approx(sigma / np.sqrt(m), rel=0.05)
    assert float(np.std(model.blocks[0].ffn.router[...])) == pytest.approx(sigma, rel=0.1)
    assert float(np.abs(model.unembedding[...]).max()) == 0.0  # zero-init unembedding
    assert model.logit_mult == pytest.approx(cfg.mup.alpha_out / m)
    assert model.blocks[0].ffn.router_mult == pytest.approx(1 / m)
    assert model.blocks[0].branch_mult == pytest.approx(0.5)  # CompleteP 1 / m_L
    assert model.blocks[0].attn.scale == pytest.approx(1 / cfg.d_head)
    sp = Transformer(cfg.replace(mup=MuPConfig(enabled=False)), rngs=nnx.Rngs(0))
    assert sp.blocks[0].attn.scale == pytest.approx(cfg.d_head**-0.5)
    assert float(np.std(sp.unembedding[...])) == pytest.approx(sigma, rel=0.05)


# Fast coordinate check: 4 widths (8x), one layer, 4 seeds; the slow test runs 16x, dense and MoE.
FAST = dict(widths=(32, 64, 128, 256), seeds=(0, 1, 2, 3), n_layers=1, seq_len=16, batch_size=8, steps=10)


def test_coord_check_mup_passes_and_sp_fails(tmp_path):
    results = [coord_check(CoordCheckSpec(mup=True, **FAST)), coord_check(CoordCheckSpec(mup=False, **FAST))]
    mup_result, sp_result = results
    assert mup_result.passed, mup_result.summary()
    assert not sp_result.passed, sp_result.summary()
    # "visibly": under SP the hidden activations grow roughly linearly with width or faster
    assert sp_result.worst_slope > 0.5, sp_result.summary()
    report = save_report(results, tmp_path, passed=True)
    assert json.loads((tmp_path / "coordcheck.json").read_text())["results"][0]["passed"] is True
    assert (tmp_path / "coordcheck.png").stat().st_size > 10_000
    assert report["results"][1]["failing"]


@pytest.mark.slow
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_coord_check_full_16x(moe):
    spec = dict(widths=(32, 64, 128, 256, 512), seeds=(0, 1, 2, 3), n_layers=1, moe=moe)
    mup_result = coord_check(CoordCheckSpec(mup=True, **spec))
    sp_result = coord_check(CoordCheckSpec(mup=False, **spec))
    assert mup_result.passed, mup_result.summary()
    assert not sp_result.passed and sp_result.worst_slope > 0.5, sp_result.summary()
