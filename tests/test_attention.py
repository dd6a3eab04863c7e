"""The two attention kernels agree (delphi.model.transformer): the CPU's query-blocked attention with
its written-out backward pass, and the fused `jax.nn.dot_product_attention` a GPU uses (here its XLA
implementation, the one that runs on a CPU; on a GPU in bf16 the transformer asks for cuDNN's).

Each check runs a whole attention layer as the model applies it (fused QKV, QK-norm, RoPE, the muP
scale, causal masking, the output projection) from the same parameters through both kernels and
compares the outputs and the gradients of a loss with respect to the input and every parameter, at
the head sizes and sequence lengths of the shipped ladders (the default and eighth-edition ladders:
two heads of d_model / 2, seq 128) and of the GPU check's d1024 shapes (heads of 128, seq 1024).
Tolerances (relative, in the 2-norm): f32 1e-5 (measured <= 6e-7: the kernels sum in different
orders); bf16 1e-2 (measured <= 3.3e-3: both round their matmul inputs to bf16, in different places).
A kernel without the causal mask, the scale or RoPE misses them by orders of magnitude.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from delphi.model.config import ModelConfig, MoEConfig
from delphi.model.transformer import Attention, lm_loss, rope_tables

TOLERANCE = {"f32": 1e-5, "bf16": 1e-2}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
# (d_model, n_heads, seq): the ladders' narrowest and widest heads (2 heads, seq 128: d_head 8 at d16,
# 80 at d160, the eighth edition's widest) and the GPU check's (d_head 128 at seq 1024, batch 1)
SHAPES = [(16, 2, 128), (160, 2, 128), (1024, 8, 1024)]


def relative_error(a: jax.Array, b: jax.Array) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def attention_pair(cfg: ModelConfig, compute_dtype) -> tuple[Attention, Attention]:
    """The same parameters behind the blocked and the fused (XLA) kernel."""
    blocked = Attention(cfg, rngs=nnx.Rngs(0), compute_dtype=compute_dtype, kernel="blocked")
    fused = Attention(cfg, rngs=nnx.Rngs(0), compute_dtype=compute_dtype, kernel="xla")
    nnx.update(fused, nnx.state(blocked, nnx.Param))
    return blocked, fused


def output_and_grads(layer: Attention, x: jax.Array, rope) -> tuple[jax.Array, jax.Array, dict]:
    graphdef, params = nnx.split(layer, nnx.Param)
    probe = jax.random.normal(jax.random.key(2), x.shape)  # a loss whose gradient reaches every output

    def loss(params, x):
        out = nnx.merge(graphdef, params)(x, rope)
        return jnp.sum(out * probe), out

    (_, out), (d_params, d_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    return out, d_x, d_params


@pytest.mark.parametrize("precision", ["f32", "bf16"])
@pytest.mark.parametrize("d_model,n_heads,seq", SHAPES)
def test_fused_attention_matches_blocked(d_model, n_heads, seq, precision) -> None:
    cfg = ModelConfig(d_model=d_model, n_heads=n_heads, n_layers=2)
    batch = 1 if seq >= 1024 else 2
    x = jax.random.normal(jax.random.key(1), (batch, seq, d_model))
    # trained attention is peaked, not uniform: scale the inputs so the softmax is far from flat
    rope = rope_tables(seq, cfg.d_head, cfg.rope_theta)
    blocked, fused = attention_pair(cfg, DTYPES[precision])
    out_b, dx_b, dp_b = output_and_grads(blocked, 4.0 * x, rope)
    out_f, dx_f, dp_f = output_and_grads(fused, 4.0 * x, rope)
    tolerance = TOLERANCE[precision]
    assert relative_error(out_f, out_b) < tolerance
    assert relative_error(dx_f, dx_b) < tolerance
    for (path, g_b), (_, g_f) in zip(
        jax.tree_util.tree_leaves_with_path(dp_b), jax.tree_util.tree_leaves_with_path(dp_f)
    ):
        assert relative_error(g_f, g_b) < tolerance, jax.tree_util.keystr(path)


def test_fused_attention_is_causal() -> None:
    """A later token never changes an earlier position's output, through either kernel."""
    cfg = ModelConfig(d_model=32, n_heads=2, n_layers=2)
    seq = 64
    rope = rope_tables(seq, cfg.d_head, cfg.rope_theta)
    x = jax.random.normal(jax.random.key(3), (1, seq, 32))
    changed = x.at[:, 40:].set(jax.random.normal(jax.random.key(4), (1, seq - 40, 32)))
    for layer in attention_pair(cfg, jnp.float32):
        graphdef, state = nnx.split(layer)
        apply = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x, rope))  # noqa: B023  (called at once, inside the loop)
        before, after = apply(state, x), apply(state, changed)
        np.testing.assert_array_equal(np.asarray(before[:, :40]), np.asarray(after[:, :40]))
        assert not np.allclose(np.asarray(before[:, 40:]), np.asarray(after[:, 40:]))


def test_a_whole_moe_model_trains_the_same_through_either_kernel() -> None:
    """The ladder family's MoE model as the trainer builds it (`attention: blocked` and `fused`, which
    is JAX's XLA kernel on a CPU): the loss and every parameter's gradient agree (f32: in bf16 a
    rounding difference can flip a top-k routing choice, which no tolerance describes)."""
    from delphi.train.config import TrainConfig
    from delphi.train.trainer import attention_kernel, init_model

    model_cfg = ModelConfig(
        d_model=32, n_layers=2, n_heads=2, moe=MoEConfig(experts=8, top_k=2, d_expert=32, capacity_factor=4.0)
    )
    tokens = jax.random.randint(jax.random.key(5), (2, 129), 0, 256)
    results = []
    for attention in ("blocked", "fused"):
        cfg = TrainConfig(model=model_cfg, attention=attention)
        graphdef, params, rest = nnx.split(init_model(cfg), nnx.Param, ...)

        def loss(params):
            return lm_loss(nnx.merge(graphdef, params, rest), tokens)[0]  # noqa: B023  (called at once, inside the loop)

        results.append(jax.jit(jax.value_and_grad(loss))(params))
    assert attention_kernel(TrainConfig(attention="fused")) == "xla"  # on this CPU
    (loss_b, grads_b), (loss_f, grads_f) = results
    assert abs(float(loss_f) / float(loss_b) - 1) < 1e-6
    for g_b, g_f in zip(jax.tree.leaves(grads_b), jax.tree.leaves(grads_f)):
        assert relative_error(g_f, g_b) < TOLERANCE["f32"]


def test_an_unknown_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="attention kernel"):
        Attention(ModelConfig(), rngs=nnx.Rngs(0), kernel="flash")
