"""Mixture-of-Experts feed-forward block: router, load balancing and a CPU-fast dispatch.

Routing (docs/design.md §4.2):
    scores s = softmax(r) or sigmoid(r), r = router logits
    top-k experts are chosen on s + b (b = `RouterBias`, DeepSeek-V3's aux-loss-free bias),
    the gates use s only, normalised over the selected experts, times `route_scale`.

Dispatch, two ways (both gather tokens into groups, run each projection as one batched einsum,
and gather the results back, summed with their gates; on XLA:CPU ~15x faster than
`jax.lax.ragged_dot`, which lowers to a masked dense matmul):
- capacity groups [E, capacity, d] when tokens may be dropped (capacity_factor < E / top_k).
  Assignments beyond an expert's capacity are dropped (their contribution is zero; the residual
  stream carries the token on); first choices have priority over second choices, and earlier
  tokens over later ones.
- dropless blocks (capacity_factor >= E / top_k, and evaluation): the assignments sorted by expert,
  each expert's run padded to whole blocks of DROPLESS_BLOCK rows, every block multiplied by its
  own expert's weights (MegaBlocks' block-sparse idea, Gale et al. 2023, arXiv:2211.15841). That
  costs tokens * k + E * (block - 1) rows at most instead of the E * tokens of capacity groups
  sized for the worst case, with the same outputs.

This block knows nothing of device meshes: on a mesh of several devices the model is built with
`delphi.model.moe_parallel.ExpertParallelMoE` instead (the transformer chooses, given the mesh).
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from delphi.model.config import ModelConfig


class RouterBias(nnx.Variable):
    """Per-expert selection bias b (DeepSeek-V3). Not an `nnx.Param`: the optimizer never sees it;
    the trainer updates it with `bias_update` after each step."""


def bias_update(
    bias: Float[Array, "*layers experts"], expert_load: Float[Array, "*layers experts"], rate: float
) -> Float[Array, "*layers experts"]:
    """DeepSeek-V3 (arXiv:2412.19437, sec. 2.1.2) aux-loss-free balancing: b += rate * sign(mean load - load).

    Under-loaded experts get a larger bias (chosen more often), over-loaded ones a smaller one.
    Works per layer ([E]) or on a stack of layers ([L, E]); the mean is over experts.
    """
    mean_load = jnp.mean(expert_load, axis=-1, keepdims=True)
    return bias + rate * jnp.sign(mean_load - expert_load)


def matmul(x: Array, w: Array, spec: str, compute_dtype: jnp.dtype) -> Float[Array, "..."]:
    """einsum with inputs cast to `compute_dtype` (bf16 or f32) and f32 accumulation/output.

    In bf16 the two backward matmuls also take bf16 inputs (the f32 cotangent is cast down), as
    torch autocast does. Plain autodiff would multiply the f32 cotangent by the bf16 operand, which
    XLA runs as an f32 matmul: the backward pass, 2/3 of the FLOPs, at f32 speed (1.27x slower step).
    """
    if jnp.dtype(compute_dtype) == jnp.float32:
        return jnp.einsum(spec, x.astype(jnp.float32), w.astype(jnp.float32), preferred_element_type=jnp.float32)
    return _low_precision_matmul(x, w, spec, jnp.dtype(compute_dtype))


def _einsum_f32(spec: str, a: Array, b: Array, compute_dtype: jnp.dtype) -> Float[Array, "..."]:
    return jnp.einsum(spec, a.astype(compute_dtype), b.astype(compute_dtype), preferred_element_type=jnp.float32)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _low_precision_matmul(x: Array, w: Array, spec: str, compute_dtype: jnp.dtype) -> Float[Array, "..."]:
    return _einsum_f32(spec, x, w, compute_dtype)


def _low_precision_matmul_fwd(x: Array, w: Array, spec: str, compute_dtype: jnp.dtype) -> tuple[Array, tuple]:
    x_c, w_c = x.astype(compute_dtype), w.astype(compute_dtype)  # saved in the compute dtype: half the memory
    dtypes = (jnp.zeros((), x.dtype), jnp.zeros((), w.dtype))  # residuals must be arrays: carry the dtypes as scalars
    return _einsum_f32(spec, x_c, w_c, compute_dtype), (x_c, w_c, dtypes)


def _low_precision_matmul_bwd(spec: str, compute_dtype: jnp.dtype, saved: tuple, grad: Array) -> tuple[Array, Array]:
    """For "x,w->out": dx = einsum("out,w->x"), dw = einsum("x,out->w"), bf16 inputs, f32 accumulation.

    Valid because every index of one operand appears in the other operand or in the output (true of
    every spec in this package: no index is summed over within a single operand).
    """
    x_c, w_c, (x_dtype, w_dtype) = saved
    inputs, out = spec.split("->")
    x_idx, w_idx = inputs.split(",")
    grad_c = grad.astype(compute_dtype)
    dx = _einsum_f32(f"{out},{w_idx}->{x_idx}", grad_c, w_c, compute_dtype)
    dw = _einsum_f32(f"{x_idx},{out}->{w_idx}", x_c, grad_c, compute_dtype)
    return dx.astype(x_dtype.dtype), dw.astype(w_dtype.dtype)


_low_precision_matmul.defvjp(_low_precision_matmul_fwd, _low_precision_matmul_bwd)


def swiglu(h: Float[Array, "... two_ff"]) -> Float[Array, "... ff"]:
    """SwiGLU (Shazeer 2020): the fused input projection holds [gate | up]."""
    gate, up = jnp.split(h, 2, axis=-1)
    return jax.nn.silu(gate) * up


# Rows per dropless block: small enough that padding (at most E * (block - 1) rows) stays a small
# share of a ladder batch's tokens x k (512 x 2), large enough that each block's matmul is not
# dominated by its weight gather.
DROPLESS_BLOCK = 32


def is_dropless(moe_capacity_factor: float, top_k: int, experts: int, *, train: bool) -> bool:
    """Whether every assignment fits: evaluation, or a capacity of at least the whole batch."""
    return not train or moe_capacity_factor * top_k >= experts


class Routing(NamedTuple):
    expert_idx: Int[Array, "tokens k"]  # chosen experts, by rank
    gates: Float[Array, "tokens k"]  # combine weights
    scores: Float[Array, "tokens experts"]  # s (softmax or sigmoid of the logits)
    logits: Float[Array, "tokens experts"]  # router logits r (after the muP multiplier)


class MoEStats(NamedTuple):
    expert_load: Float[Array, " experts"]  # fraction of routed assignments per expert (sums to 1)
    drop_frac: Float[Array, ""]  # fraction of assignments over capacity
    router_entropy: Float[Array, ""]  # mean per-token entropy of the normalised routing scores (nats)
    aux_loss: Float[Array, ""]  # weighted Switch aux loss (balance == "aux") + weighted z-loss


def expert_capacity(tokens: int, top_k: int, experts: int, capacity_factor: float, *, train: bool) -> int:
    """Slots per expert: ceil(capacity_factor * tokens * k / E) in training, `tokens` (dropless) otherwise.

    A token picks k distinct experts, so no expert can receive more than `tokens` assignments.
    """
    if not train:
        return tokens
    return min(tokens, max(1, math.ceil(capacity_factor * tokens * top_k / experts)))


# Above this many one-hot cells (assignments x experts; 16 MiB of int32) the ranks come from a sort:
# the count's memory grows with E x tokens, a sort's only with tokens.
COUNTED_RANK_MAX_CELLS = 1 << 22


def rank_within_expert(
    flat: Int[Array, " assignments"], experts: int
) -> tuple[Int[Array, " assignments"], Int[Array, " experts"]]:
    """Each assignment's rank among the earlier assignments to its expert, and each expert's count.

    What a stable sort by expert gives. At ladder sizes it is counted instead, with a cumulative sum
    over the one-hot [assignments, experts] matrix: the same integers, faster on XLA:CPU than the sort.
    """
    counts = jnp.bincount(flat, length=experts)
    if flat.size * experts > COUNTED_RANK_MAX_CELLS:
        order = jnp.argsort(flat, stable=True)
        starts = jnp.cumsum(counts) - counts  # first sorted index of each expert
        rank_sorted = jnp.arange(flat.size) - starts[flat[order]]
        return jnp.zeros_like(flat).at[order].set(rank_sorted), counts
    onehot = (flat[:, None] == jnp.arange(experts)[None, :]).astype(jnp.int32)
    earlier = jnp.cumsum(onehot, axis=0) - onehot
    return jnp.sum(earlier * onehot, axis=1), counts


def dispatch_slots(
    expert_idx: Int[Array, "tokens k"], experts: int, capacity: int
) -> tuple[Int[Array, "tokens k"], Bool[Array, "tokens k"]]:
    """Slot of each assignment in the flat [experts * capacity] buffer, and whether it fits.

    Assignments are ranked within their expert in choice-major order (every token's first
    choice before any second choice, then by token position). Dropped assignments get the
    overflow slot `experts * capacity`, which points at a zero row.
    """
    tokens, k = expert_idx.shape
    flat = expert_idx.T.reshape(-1)  # choice-major: priority to first choices
    position, _ = rank_within_expert(flat, experts)
    position = position.reshape(k, tokens).T
    kept = position < capacity
    slot = jnp.where(kept, expert_idx * capacity + position, experts * capacity)
    return slot, kept


def block_slots(
    expert_idx: Int[Array, "tokens k"], experts: int, block: int
) -> tuple[Int[Array, "tokens k"], Int[Array, " blocks"]]:
    """Dropless block layout: each assignment's row in a [blocks * block] buffer, and each block's expert.

    Assignments are sorted by expert (stably: token order within an expert) and each expert's run
    starts on a block boundary. `blocks` = ceil(tokens * k / block) + experts is a static bound on
    sum_e ceil(count_e / block); unused trailing blocks hold zero rows (and the last expert's index).
    """
    tokens, k = expert_idx.shape
    flat = expert_idx.reshape(-1)
    blocks = -(-tokens * k // block) + experts
    rank, counts = rank_within_expert(flat, experts)
    padded = -(-counts // block) * block
    padded_starts = jnp.cumsum(padded) - padded
    row = (padded_starts[flat] + rank).reshape(tokens, k)
    block_start = jnp.arange(blocks) * block
    block_expert = jnp.minimum(jnp.searchsorted(jnp.cumsum(padded), block_start, side="right"), experts - 1)
    return row, block_expert


class SwiGLUExperts(nnx.Module):
    """E independent SwiGLU experts stored as stacked matrices [E, d, 2*d_expert] and [E, d_expert, d]."""

    def __init__(self, experts: int, d_model: int, d_expert: int, std: float, *, rngs: nnx.Rngs):
        self.w_in = nnx.Param(std * jax.random.normal(rngs.params(), (experts, d_model, 2 * d_expert)))
        self.w_out = nnx.Param(std * jax.random.normal(rngs.params(), (experts, d_expert, d_model)))

    def __call__(
        self, xs: Float[Array, "experts capacity d"], compute_dtype: jnp.dtype
    ) -> Float[Array, "experts capacity d"]:
        h = swiglu(matmul(xs, self.w_in[...], "ecd,edf->ecf", compute_dtype))
        return matmul(h, self.w_out[...], "ecf,efd->ecd", compute_dtype)

    def blocks(
        self, xs: Float[Array, "blocks block d"], block_expert: Int[Array, " blocks"], compute_dtype: jnp.dtype
    ) -> Float[Array, "blocks block d"]:
        """Each block through its own expert (the weights gathered per block)."""
        h = swiglu(matmul(xs, self.w_in[...][block_expert], "bcd,bdf->bcf", compute_dtype))
        return matmul(h, self.w_out[...][block_expert], "bcf,bfd->bcd", compute_dtype)


class SharedExperts(nnx.Module):
    """Always-on experts, fused into one SwiGLU of width shared_experts * d_expert."""

    def __init__(self, d_model: int, d_hidden: int, std: float, *, rngs: nnx.Rngs):
        self.w_in = nnx.Param(std * jax.random.normal(rngs.params(), (d_model, 2 * d_hidden)))
        self.w_out = nnx.Param(std * jax.random.normal(rngs.params(), (d_hidden, d_model)))

    def __call__(self, x: Float[Array, "tokens d"], compute_dtype: jnp.dtype) -> Float[Array, "tokens d"]:
        h = swiglu(matmul(x, self.w_in[...], "td,df->tf", compute_dtype))
        return matmul(h, self.w_out[...], "tf,fd->td", compute_dtype)


class MoE(nnx.Module):
    """Routed SwiGLU experts (+ optional shared experts) replacing the dense FFN of a block."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: jnp.dtype = jnp.float32):
        assert cfg.moe is not None
        moe = cfg.moe
        self.moe = moe
        self.compute_dtype = compute_dtype
        d = cfg.d_model
        m = cfg.width_mult
        sigma = cfg.mup.init_std
        hidden_std = sigma / math.sqrt(m)  # muP: hidden matrices sigma / sqrt(m)
        # The router maps d_model -> E with E fixed, so muP treats it like the unembedding:
        # constant init std, full LR, and its logits multiplied by 1/m (docs/design.md §4.4).
        # It is not zero-initialised even when the unembedding is: equal scores would send every
        # token to the same first-k experts at step 0.
        self.router = nnx.Param(sigma * jax.random.normal(rngs.params(), (d, moe.experts)))
        self.router_mult = 1.0 / m
        self.router_bias = RouterBias(jnp.zeros((moe.experts,), jnp.float32))
        self.experts = SwiGLUExperts(moe.experts, d, moe.d_expert, hidden_std, rngs=rngs)
        self.shared = (
            SharedExperts(d, moe.shared_experts * moe.d_expert, hidden_std, rngs=rngs)
            if moe.shared_experts > 0
            else None
        )

    def route(self, x: Float[Array, "tokens d"]) -> Routing:
        moe = self.moe
        logits = matmul(x, self.router[...], "td,de->te", self.compute_dtype) * self.router_mult
        scores = jax.nn.softmax(logits, axis=-1) if moe.score == "softmax" else jax.nn.sigmoid(logits)
        # Selection on s + b; b only steers which experts are chosen, never the gate values.
        _, expert_idx = jax.lax.top_k(jax.lax.stop_gradient(scores + self.router_bias[...]), moe.top_k)
        gates = jnp.take_along_axis(scores, expert_idx, axis=-1)
        # Normalise over the selected experts. With k = 1 that would make every gate exactly 1 and
        # cut the router off from the LM gradient, so a single choice keeps its raw score (Switch).
        if moe.top_k > 1:
            gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        return Routing(expert_idx=expert_idx, gates=gates * moe.route_scale, scores=scores, logits=logits)

    def __call__(
        self, x: Float[Array, "batch seq d"], *, train: bool = True
    ) -> tuple[Float[Array, "batch seq d"], MoEStats]:
        moe = self.moe
        batch, seq, d = x.shape
        tokens = batch * seq
        xt = x.reshape(tokens, d)
        routing = self.route(xt)

        dropless = is_dropless(moe.capacity_factor, moe.top_k, moe.experts, train=train)
        if dropless:
            slot, block_expert = block_slots(routing.expert_idx, moe.experts, DROPLESS_BLOCK)
            kept = jnp.ones(slot.shape, bool)
            rows = block_expert.shape[0] * DROPLESS_BLOCK
        else:
            capacity = expert_capacity(tokens, moe.top_k, moe.experts, moe.capacity_factor, train=train)
            slot, kept = dispatch_slots(routing.expert_idx, moe.experts, capacity)
            rows = moe.experts * capacity

        # Gather tokens into the rows; empty rows read the zero row at index `tokens`.
        token_of_assignment = jnp.broadcast_to(jnp.arange(tokens)[:, None], slot.shape)
        slot_token = jnp.full((rows + 1,), tokens).at[slot.reshape(-1)].set(token_of_assignment.reshape(-1))
        x_padded = jnp.concatenate([xt, jnp.zeros((1, d), xt.dtype)])
        xs = x_padded[slot_token[:-1]]
        if dropless:
            ys = self.experts.blocks(xs.reshape(-1, DROPLESS_BLOCK, d), block_expert, self.compute_dtype)
        else:
            ys = self.experts(xs.reshape(moe.experts, -1, d), self.compute_dtype)
        ys_padded = jnp.concatenate([ys.reshape(rows, d), jnp.zeros((1, d), ys.dtype)])  # overflow slot -> zeros
        y = jnp.einsum("tk,tkd->td", routing.gates, ys_padded[slot])
        if self.shared is not None:
            y = y + self.shared(xt, self.compute_dtype)
        return y.reshape(batch, seq, d), self.stats(routing, kept)

    def stats(self, routing: Routing, kept: Bool[Array, "tokens k"]) -> MoEStats:
        moe = self.moe
        assignments = routing.expert_idx.size
        load = jnp.bincount(routing.expert_idx.reshape(-1), length=moe.experts) / assignments
        probs = routing.scores / jnp.sum(routing.scores, axis=-1, keepdims=True)  # sigmoid scores -> a distribution
        entropy = -jnp.mean(jnp.sum(probs * jnp.log(probs + 1e-20), axis=-1))
        # Switch (Fedus et al. 2021, eq. 4): alpha * E * sum_i f_i P_i; f_i is not differentiable.
        switch = moe.experts * jnp.sum(load * jnp.mean(probs, axis=0))
        aux = moe.aux_loss_weight * switch if moe.balance == "aux" else jnp.zeros(())
        # ST-MoE router z-loss (Zoph et al. 2022, eq. 5): mean over tokens of logsumexp(r)^2.
        z_loss = jnp.mean(jax.nn.logsumexp(routing.logits, axis=-1) ** 2)
        return MoEStats(
            expert_load=load,
            drop_frac=jnp.mean((~kept).astype(jnp.float32)),
            router_entropy=entropy,
            aux_loss=aux + moe.z_loss_weight * z_loss,
        )
