"""Decoder-only transformer in flax.nnx, readable top to bottom (DESIGN.md section 4).

    tokens -> embedding x alpha_in
           -> L x [ x += attn(RMSNorm(x)) / m_L ;  x += ffn(RMSNorm(x)) / m_L ]
           -> RMSNorm -> unembedding x alpha_out / m -> logits

Attention: fused QKV, QK-norm (RMSNorm over the head dimension), RoPE, causal softmax.
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
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from delphi.model.config import ModelConfig
from delphi.model.moe import MoE, bias_update, matmul, swiglu


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
    """cos and sin of the rotary angles position * theta^(-2i/d_head) (Su et al. 2021)."""
    inv_freq = theta ** (-jnp.arange(0, d_head, 2, dtype=jnp.float32) / d_head)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(
    x: Float[Array, "batch seq heads d_head"], cos: Float[Array, "seq half"], sin: Float[Array, "seq half"]
) -> Float[Array, "batch seq heads d_head"]:
    """Rotate the pairs (x_i, x_{i + d_head/2}) by their position's angle (the 'rotate half' layout)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: jnp.dtype = jnp.float32):
        d, kh = cfg.d_model, cfg.n_heads * cfg.d_head
        std = cfg.mup.init_std / math.sqrt(cfg.width_mult)  # hidden matrices: sigma / sqrt(m)
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.rope_theta = cfg.rope_theta
        self.compute_dtype = compute_dtype
        self.w_qkv = nnx.Param(std * jax.random.normal(rngs.params(), (d, 3 * kh)))
        self.w_out = nnx.Param(std * jax.random.normal(rngs.params(), (kh, d)))
        self.q_norm = RMSNorm(cfg.d_head, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.d_head, cfg.norm_eps)
        # muP: q.k / d_head keeps attention logits O(1) once q and k align during training;
        # standard parameterisation uses 1/sqrt(d_head) (Vaswani et al. 2017).
        self.scale = 1.0 / cfg.d_head if cfg.mup.enabled else 1.0 / math.sqrt(cfg.d_head)

    def __call__(self, x: Float[Array, "batch seq d"]) -> Float[Array, "batch seq d"]:
        batch, seq, _ = x.shape
        qkv = matmul(x, self.w_qkv[...], "bsd,df->bsf", self.compute_dtype)
        q, k, v = jnp.split(qkv.reshape(batch, seq, 3, self.n_heads, self.d_head), 3, axis=2)
        q, k, v = q[:, :, 0], k[:, :, 0], v[:, :, 0]  # each [batch, seq, heads, d_head]
        cos, sin = rope_tables(seq, self.d_head, self.rope_theta)
        q = apply_rope(self.q_norm(q), cos, sin)
        k = apply_rope(self.k_norm(k), cos, sin)

        scores = matmul(q, k, "bqhd,bkhd->bhqk", self.compute_dtype) * self.scale
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        scores = jnp.where(causal, scores, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1)
        out = matmul(probs, v, "bhqk,bkhd->bqhd", self.compute_dtype).reshape(batch, seq, -1)
        return matmul(out, self.w_out[...], "bsf,fd->bsd", self.compute_dtype)


class DenseFFN(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: jnp.dtype = jnp.float32):
        std = cfg.mup.init_std / math.sqrt(cfg.width_mult)
        self.compute_dtype = compute_dtype
        self.w_in = nnx.Param(std * jax.random.normal(rngs.params(), (cfg.d_model, 2 * cfg.d_ff)))  # [gate | up]
        self.w_out = nnx.Param(std * jax.random.normal(rngs.params(), (cfg.d_ff, cfg.d_model)))

    def __call__(self, x: Float[Array, "batch seq d"], *, train: bool = True) -> tuple[Float[Array, "batch seq d"], None]:
        h = swiglu(matmul(x, self.w_in[...], "bsd,df->bsf", self.compute_dtype))
        return matmul(h, self.w_out[...], "bsf,fd->bsd", self.compute_dtype), None


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: jnp.dtype = jnp.float32):
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, rngs=rngs, compute_dtype=compute_dtype)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = (
            MoE(cfg, rngs=rngs, compute_dtype=compute_dtype)
            if cfg.moe is not None
            else DenseFFN(cfg, rngs=rngs, compute_dtype=compute_dtype)
        )
        self.branch_mult = 1.0 / cfg.depth_mult  # CompleteP: residual branches x 1/m_L

    def __call__(self, x: Float[Array, "batch seq d"], *, train: bool = True) -> tuple[Float[Array, "batch seq d"], Any, dict]:
        attn_out = self.attn(self.attn_norm(x)) * self.branch_mult
        x = x + attn_out
        ffn_out, moe_stats = self.ffn(self.ffn_norm(x), train=train)
        ffn_out = ffn_out * self.branch_mult
        x = x + ffn_out
        return x, moe_stats, {"attn_out": attn_out, "ffn_out": ffn_out, "residual": x}


def mean_abs(x: Array) -> Float[Array, ""]:
    return jnp.mean(jnp.abs(x))


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: jnp.dtype = jnp.float32):
        cfg.validate()
        self.cfg = cfg
        self.compute_dtype = compute_dtype
        mup = cfg.mup
        d, V = cfg.d_model, cfg.vocab_size
        self.embedding = nnx.Param(mup.init_std * jax.random.normal(rngs.params(), (V, d)))  # constant std
        self.blocks = nnx.List([Block(cfg, rngs=rngs, compute_dtype=compute_dtype) for _ in range(cfg.n_layers)])
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
        moe_stats = []
        for i, block in enumerate(self.blocks):
            x, stats, outputs = block(x, train=train)
            if stats is not None:
                moe_stats.append(stats)
            if capture:
                activations.update({f"block{i}.{name}": mean_abs(value) for name, value in outputs.items()})
        x = self.final_norm(x)
        logits = matmul(x, self.unembedding[...], "bsd,dv->bsv", self.compute_dtype) * self.logit_mult
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

    def update_router_biases(self, expert_load: Float[Array, "layers experts"]) -> None:
        """In place: apply `bias_update` to every block's RouterBias (balance == "bias" only).

        `expert_load` is stats["expert_load"] of the step's forward pass. Pure alternative for a
        functional trainer: `delphi.model.moe.bias_update` on the RouterBias state directly.
        """
        moe = self.cfg.moe
        if moe is None or moe.balance != "bias":
            return
        for i, block in enumerate(self.blocks):
            bias = block.ffn.router_bias
            bias[...] = bias_update(bias[...], expert_load[i], moe.bias_update_rate)


def cross_entropy(logits: Float[Array, "batch seq vocab"], targets: Int[Array, "batch seq"]) -> Float[Array, ""]:
    """Mean next-token loss in nats per token."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def lm_loss(
    model: Transformer, batch: Int[Array, "batch seq_plus_1"], *, train: bool = True
) -> tuple[Float[Array, ""], dict[str, Any]]:
    """Training objective: cross-entropy of batch[:, 1:] given batch[:, :-1], plus the MoE aux losses.

    Returns (loss, stats) with stats["ce_loss"] the cross-entropy alone.
    """
    logits, stats = model(batch[:, :-1], train=train)
    ce = cross_entropy(logits, batch[:, 1:])
    return ce + stats["aux_loss"], {**stats, "ce_loss": ce}
