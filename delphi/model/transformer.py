"""Decoder-only transformer in flax.nnx, readable top to bottom (docs/design.md §4.1).

    tokens -> embedding x alpha_in
           -> L x [ x += attn(RMSNorm(x)) / m_L ;  x += ffn(RMSNorm(x)) / m_L ]
           -> RMSNorm -> unembedding x alpha_out / m -> logits

Attention: fused QKV, QK-norm (RMSNorm over the head dimension), RoPE, causal softmax computed in
query blocks (`causal_attention`, the CPU's kernel), or by `jax.nn.dot_product_attention` (`fused`:
cuDNN's flash attention on a GPU in bf16; the trainer chooses, delphi.train.device).
FFN: SwiGLU, dense or Mixture-of-Experts (delphi.model.moe). Embeddings are untied.

muP (multiplier form; m = d_model / base_d_model, m_L = n_layers / base_n_layers, both 1 under
standard parameterisation):
    embedding       init std sigma          forward x alpha_in
    hidden matrices init std sigma/sqrt(m)  (their LR eta/m lives in delphi.model.mup)
    unembedding     init zero or sigma      forward x alpha_out / m
    attention       q.k / d_head under muP, q.k / sqrt(d_head) under SP
    residual branch x 1/m_L (CompleteP, alpha = 1)

Parameters are f32. With `compute_dtype=jnp.bfloat16` every matmul casts its inputs to bf16 and
accumulates in f32; norms, softmax, the residual stream and the logits stay f32.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Float, Int

from delphi.model.config import ModelConfig
from delphi.model.moe import MoE, matmul, swiglu
from delphi.model.moe_parallel import ExpertParallelMoE, spans_devices


def linear(
    x: Float[Array, "... d_in"], w: Float[Array, "d_in d_out"], compute_dtype: jnp.dtype
) -> Float[Array, "... d_out"]:
    """x @ w on the last axis as one 2-D matmul over all tokens. XLA:CPU runs the weight gradient of
    the 3-D einsum "bsd,df->bsf" (a contraction over both batch and seq) ~1.4x slower."""
    tokens = x.reshape(-1, x.shape[-1])
    return matmul(tokens, w, "td,df->tf", compute_dtype).reshape(*x.shape[:-1], w.shape[-1])


def rms_norm(x: Float[Array, "... d"], scale: Float[Array, " d"], eps: float) -> Float[Array, "... d"]:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        return rms_norm(x, self.scale[...], self.eps)


def rope_tables(seq: int, d_head: int, theta: float) -> tuple[Float[Array, "seq half"], Float[Array, "seq half"]]:
    """cos and sin of the rotary angles position * theta^(-2i/d_head) (Su et al. 2021).

    Computed in numpy, so under jit they are constants: built once per trace, shared by every layer.
    """
    inv_freq = theta ** (-np.arange(0, d_head, 2, dtype=np.float32) / d_head)
    angles = np.arange(seq, dtype=np.float32)[:, None] * inv_freq[None, :].astype(np.float32)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(
    x: Float[Array, "batch seq heads d_head"], cos: Float[Array, "seq half"], sin: Float[Array, "seq half"]
) -> Float[Array, "batch seq heads d_head"]:
    """Rotate the pairs (x_i, x_{i + d_head/2}) by their position's angle (the 'rotate half' layout)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


# On CPU attention is bound by memory traffic over the [batch, heads, seq, seq] tensors, not by FLOPs:
# at d_model 32-64 it is most of the step. Two things cut that traffic: queries go in blocks that only
# see keys up to their own end, so most of the masked upper triangle is never computed ((n+1)/2n of
# seq^2 for n blocks) and each block's tensors stay in cache; and the backward pass is written out
# (`attend_block`). Whole train step, seq 256, d_model 64: 1.65x. 3 blocks run as fast as 4 (2 are
# 1.2x slower) and keep XLA's FLOP count within 5% of the full-attention count in delphi.model.flops
# (tests/test_flops.py); 4 blocks would drop it 5.2% below.
ATTENTION_QUERY_BLOCKS = 3


def causal_attention(
    q: Float[Array, "batch heads seq d_head"],
    k: Float[Array, "batch heads seq d_head"],
    v: Float[Array, "batch heads seq d_head"],
    compute_dtype: jnp.dtype,
) -> Float[Array, "batch heads seq d_head"]:
    """softmax(q k^T, causal) v in query blocks; q carries the attention scale already."""
    seq = q.shape[2]
    n_blocks = min(ATTENTION_QUERY_BLOCKS, seq)
    bounds = [i * seq // n_blocks for i in range(n_blocks + 1)]
    outs = [
        attend_block(q[:, :, lo:hi], k[:, :, :hi], v[:, :, :hi], lo, compute_dtype)
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ]
    return jnp.concatenate(outs, axis=2)


def causal_mask(queries: int, keys: int, query_offset: int) -> np.ndarray:
    """[queries, keys] bool: query i (at position query_offset + i) sees keys 0 .. query_offset + i."""
    return (query_offset + np.arange(queries))[:, None] >= np.arange(keys)[None, :]


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def attend_block(
    q: Float[Array, "batch heads q d_head"],
    k: Float[Array, "batch heads k d_head"],
    v: Float[Array, "batch heads k d_head"],
    query_offset: int,
    compute_dtype: jnp.dtype,
) -> Float[Array, "batch heads q d_head"]:
    """Causal attention of one query block over the keys before its end; probabilities in f32."""
    return _attend_block_fwd(q, k, v, query_offset, compute_dtype)[0]


def _attend_block_fwd(
    q: Float[Array, "batch heads q d_head"],
    k: Float[Array, "batch heads k d_head"],
    v: Float[Array, "batch heads k d_head"],
    query_offset: int,
    compute_dtype: jnp.dtype,
) -> tuple[Float[Array, "batch heads q d_head"], tuple[Array, ...]]:
    scores = matmul(q, k, "bhqd,bhkd->bhqk", compute_dtype)
    scores = jnp.where(causal_mask(q.shape[2], k.shape[2], query_offset), scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = matmul(probs, v, "bhqk,bhkd->bhqd", compute_dtype)
    return out, (q, k, v, probs, out)


def _attend_block_bwd(
    query_offset: int, compute_dtype: jnp.dtype, saved: tuple[Array, ...], d_out: Float[Array, "batch heads q d_head"]
) -> tuple[Array, Array, Array]:
    """The softmax backward dS = P (dP - rowsum(dP P)) with rowsum(dP P) = rowsum(dO O), an O(seq d)
    reduction instead of one over the seq^2 tensors (FlashAttention, Dao et al. 2022, appendix B.2)."""
    q, k, v, probs, out = saved
    d_v = matmul(probs, d_out, "bhqk,bhqd->bhkd", compute_dtype)
    d_probs = matmul(d_out, v, "bhqd,bhkd->bhqk", compute_dtype)
    d_scores = probs * (d_probs - jnp.sum(d_out * out, axis=-1, keepdims=True))
    d_q = matmul(d_scores, k, "bhqk,bhkd->bhqd", compute_dtype)
    d_k = matmul(d_scores, q, "bhqk,bhqd->bhkd", compute_dtype)
    return d_q, d_k, d_v


attend_block.defvjp(_attend_block_fwd, _attend_block_bwd)

# The attention kernels Attention takes: this file's query-blocked one, or jax.nn.dot_product_attention
# with one of its implementations (delphi.train.device.resolve_attention chooses).
ATTENTION_KERNELS = ("blocked", "cudnn", "xla")


def fused_causal_attention(
    q: Float[Array, "batch seq heads d_head"],
    k: Float[Array, "batch seq heads d_head"],
    v: Float[Array, "batch seq heads d_head"],
    compute_dtype: jnp.dtype,
    implementation: str,
) -> Float[Array, "batch seq heads d_head"]:
    """softmax(q k^T, causal) v by jax.nn.dot_product_attention (its [batch, seq, heads, d_head]
    layout; q carries the attention scale already). Inputs in the compute dtype, softmax in f32,
    the output back in f32 as `causal_attention`'s. cuDNN refuses some shapes (a head size over
    its limit, a sequence it cannot tile): it raises while the program is traced, and JAX's XLA
    implementation, which takes any shape, is used instead."""
    q, k, v = (t.astype(compute_dtype) for t in (q, k, v))

    def attend(how: str) -> Array:
        return jax.nn.dot_product_attention(q, k, v, scale=1.0, is_causal=True, implementation=how)

    if implementation == "cudnn":
        try:
            return attend("cudnn").astype(jnp.float32)
        except (ValueError, NotImplementedError, RuntimeError, TypeError):
            pass
    return attend("xla").astype(jnp.float32)


class Attention(nnx.Module):
    def __init__(
        self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: jnp.dtype = jnp.float32, kernel: str = "blocked"
    ):
        if kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention kernel {kernel!r}: expected one of {ATTENTION_KERNELS}")
        d, kh = cfg.d_model, cfg.n_heads * cfg.d_head
        self.kernel = kernel
        std = cfg.mup.init_std / math.sqrt(cfg.width_mult)  # hidden matrices: sigma / sqrt(m)
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.compute_dtype = compute_dtype
        self.w_qkv = nnx.Param(std * jax.random.normal(rngs.params(), (d, 3 * kh)))
        self.w_out = nnx.Param(std * jax.random.normal(rngs.params(), (kh, d)))
        self.q_norm = RMSNorm(cfg.d_head, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.d_head, cfg.norm_eps)
        # muP: q.k / d_head keeps attention logits O(1) once q and k align during training;
        # standard parameterisation uses 1/sqrt(d_head) (Vaswani et al. 2017).
        self.scale = 1.0 / cfg.d_head if cfg.mup.enabled else 1.0 / math.sqrt(cfg.d_head)

    def __call__(
        self, x: Float[Array, "batch seq d"], rope: tuple[Float[Array, "seq half"], Float[Array, "seq half"]]
    ) -> Float[Array, "batch seq d"]:
        batch, seq, _ = x.shape
        qkv = linear(x, self.w_qkv[...], self.compute_dtype)
        qkv = qkv.reshape(batch, seq, 3, self.n_heads, self.d_head)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each [batch, seq, heads, d_head]
        q = apply_rope(self.q_norm(q), *rope) * self.scale  # scale q (seq d) rather than the scores (seq^2)
        k = apply_rope(self.k_norm(k), *rope)
        if self.kernel == "blocked":
            q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # head-major [batch, heads, seq, d_head]
            out = causal_attention(q, k, v, self.compute_dtype).transpose(0, 2, 1, 3)
        else:
            out = fused_causal_attention(q, k, v, self.compute_dtype, self.kernel)
        out = out.reshape(batch, seq, -1)
        return linear(out, self.w_out[...], self.compute_dtype)


class DenseFFN(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: jnp.dtype = jnp.float32):
        std = cfg.mup.init_std / math.sqrt(cfg.width_mult)
        self.compute_dtype = compute_dtype
        self.w_in = nnx.Param(std * jax.random.normal(rngs.params(), (cfg.d_model, 2 * cfg.d_ff)))  # [gate | up]
        self.w_out = nnx.Param(std * jax.random.normal(rngs.params(), (cfg.d_ff, cfg.d_model)))

    def __call__(
        self, x: Float[Array, "batch seq d"], *, train: bool = True
    ) -> tuple[Float[Array, "batch seq d"], None]:
        h = swiglu(linear(x, self.w_in[...], self.compute_dtype))
        return linear(h, self.w_out[...], self.compute_dtype), None


def feed_forward(
    cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: jnp.dtype, mesh: jax.sharding.Mesh | None
) -> nnx.Module:
    """The block's FFN: dense, MoE, or (on a mesh of several devices) the expert-parallel MoE."""
    if cfg.moe is None:
        return DenseFFN(cfg, rngs=rngs, compute_dtype=compute_dtype)
    if spans_devices(mesh):
        return ExpertParallelMoE(cfg, mesh=mesh, rngs=rngs, compute_dtype=compute_dtype)
    return MoE(cfg, rngs=rngs, compute_dtype=compute_dtype)


class Block(nnx.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        compute_dtype: jnp.dtype = jnp.float32,
        mesh: jax.sharding.Mesh | None = None,
        attention: str = "blocked",
    ):
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, rngs=rngs, compute_dtype=compute_dtype, kernel=attention)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = feed_forward(cfg, rngs=rngs, compute_dtype=compute_dtype, mesh=mesh)
        self.branch_mult = 1.0 / cfg.depth_mult  # CompleteP: residual branches x 1/m_L

    def __call__(
        self, x: Float[Array, "batch seq d"], rope: tuple[Array, Array], *, train: bool = True
    ) -> tuple[Float[Array, "batch seq d"], Any, dict]:
        attn_out = self.attn(self.attn_norm(x), rope) * self.branch_mult
        x = x + attn_out
        ffn_out, moe_stats = self.ffn(self.ffn_norm(x), train=train)
        ffn_out = ffn_out * self.branch_mult
        x = x + ffn_out
        return x, moe_stats, {"attn_out": attn_out, "ffn_out": ffn_out, "residual": x}


def mean_abs(x: Array) -> Float[Array, ""]:
    return jnp.mean(jnp.abs(x))


class Transformer(nnx.Module):
    """`mesh`: the device mesh the model will run on (None: one device). Only the MoE block
    depends on it; the parameters and the numbers are the same on every mesh. `attention`: the
    attention kernel (ATTENTION_KERNELS); the parameters are the same for each, the numbers equal
    up to rounding (tests/test_attention.py)."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        compute_dtype: jnp.dtype = jnp.float32,
        mesh: jax.sharding.Mesh | None = None,
        attention: str = "blocked",
    ):
        cfg.validate()
        self.cfg = cfg
        self.compute_dtype = compute_dtype
        mup = cfg.mup
        d, V = cfg.d_model, cfg.vocab_size
        self.embedding = nnx.Param(mup.init_std * jax.random.normal(rngs.params(), (V, d)))  # constant std
        self.blocks = nnx.List(
            [
                Block(cfg, rngs=rngs, compute_dtype=compute_dtype, mesh=mesh, attention=attention)
                for _ in range(cfg.n_layers)
            ]
        )
        self.final_norm = RMSNorm(d, cfg.norm_eps)
        if mup.enabled and mup.zero_init_unembedding:
            self.unembedding = nnx.Param(jnp.zeros((d, V), jnp.float32))
        else:  # standard parameterisation: every matrix starts at std sigma
            self.unembedding = nnx.Param(mup.init_std * jax.random.normal(rngs.params(), (d, V)))
        self.alpha_in = mup.alpha_in if mup.enabled else 1.0
        self.logit_mult = mup.alpha_out / cfg.width_mult if mup.enabled else 1.0

    def __call__(
        self, tokens: Int[Array, "batch seq"], *, train: bool = True, capture: bool = False
    ) -> tuple[Float[Array, "batch seq vocab"], dict[str, Any]]:
        """Logits (f32) and stats. `capture=True` adds stats["activations"]: the mean |x| of every
        layer output (embedding, each block's attention/FFN branch and residual stream, logits),
        which the muP coordinate check reads."""
        x = self.embedding[...][tokens] * self.alpha_in
        activations = {"embedding": mean_abs(x)}
        rope = rope_tables(tokens.shape[1], self.cfg.d_head, self.cfg.rope_theta)  # once, for every layer
        moe_stats = []
        for i, block in enumerate(self.blocks):
            x, stats, outputs = block(x, rope, train=train)
            if stats is not None:
                moe_stats.append(stats)
            if capture:
                activations.update({f"block{i}.{name}": mean_abs(value) for name, value in outputs.items()})
        x = self.final_norm(x)
        logits = linear(x, self.unembedding[...], self.compute_dtype) * self.logit_mult
        activations["logits"] = mean_abs(logits)

        stats: dict[str, Any] = {
            "aux_loss": jnp.zeros((), jnp.float32),
            "expert_load": jnp.zeros((self.cfg.n_layers, 0), jnp.float32),
            "drop_frac": jnp.zeros((), jnp.float32),
            "router_entropy": jnp.zeros((), jnp.float32),
        }
        if moe_stats:
            stats["aux_loss"] = sum(s.aux_loss for s in moe_stats)
            stats["expert_load"] = jnp.stack([s.expert_load for s in moe_stats])
            stats["drop_frac"] = jnp.mean(jnp.stack([s.drop_frac for s in moe_stats]))
            stats["router_entropy"] = jnp.mean(jnp.stack([s.router_entropy for s in moe_stats]))
        if capture:
            stats["activations"] = activations
        return logits, stats


def cross_entropy(logits: Float[Array, "batch seq vocab"], targets: Int[Array, "batch seq"]) -> Float[Array, ""]:
    """Mean next-token loss in nats per token, computed in f32: the one definition the trainer,
    its evaluation and the muP experiments share."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()


def lm_loss(
    model: Transformer, batch: Int[Array, "batch seq_plus_1"], *, train: bool = True
) -> tuple[Float[Array, ""], dict[str, Any]]:
    """Training objective: cross-entropy of batch[:, 1:] given batch[:, :-1], plus the MoE aux losses.

    Returns (loss, stats) with stats["ce_loss"] the cross-entropy alone.
    """
    logits, stats = model(batch[:, :-1], train=train)
    ce = cross_entropy(logits, batch[:, 1:])
    return ce + stats["aux_loss"], {**stats, "ce_loss": ce}
