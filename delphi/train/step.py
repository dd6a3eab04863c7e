"""The jitted training and evaluation steps, in functional style.

The model is split once with `nnx.split` into a graphdef (static structure)
and three states: trainable params (`nnx.Param`), the MoE router biases
(`RouterBias`, updated by the balancing rule, not by Adam) and anything else.
The step takes the whole `TrainState` in and returns the new one, with its
input buffers donated so XLA updates the weights in place.

One call runs `steps_per_call` optimizer steps with `lax.scan`: for the small
rungs of a ladder the per-call dispatch (and host loop) costs as much as the
maths, so several steps per call keeps the CPU busy (see benchmarks/trainer.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Float, Int

from delphi.model.config import ModelConfig
from delphi.model.moe import RouterBias, bias_update
from delphi.model.transformer import cross_entropy


class TrainState(NamedTuple):
    params: Any  # nnx.State of nnx.Param
    opt_state: Any
    router_bias: Any  # nnx.State of RouterBias (empty for dense models)
    other: Any  # any other model state


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, Any, Any, Any]:
    return nnx.split(model, nnx.Param, RouterBias, ...)


def update_router_bias(router_bias: Any, expert_load: Float[Array, "layers experts"], rate: float) -> Any:
    """Apply the DeepSeek-V3 bias update to every layer's RouterBias.

    The biases come either as one (layers, experts) array (scanned layers) or as
    one (experts,) array per layer, in layer order (the state's sorted paths).
    """
    leaves, treedef = jax.tree.flatten(router_bias)
    if not leaves:
        return router_bias
    if len(leaves) == 1 and leaves[0].shape == expert_load.shape:
        return jax.tree.unflatten(treedef, [bias_update(leaves[0], expert_load, rate)])
    if len(leaves) != expert_load.shape[0]:
        raise ValueError(f"{len(leaves)} router biases for expert_load of shape {expert_load.shape}")
    return jax.tree.unflatten(treedef, [bias_update(b, expert_load[i], rate) for i, b in enumerate(leaves)])


def moe_step_stats(stats: dict) -> dict[str, Float[Array, ""]]:
    """Per-step balancing numbers: worst layer's max/mean expert load, drops, router entropy."""
    load = stats["expert_load"]
    max_over_mean = jnp.max(load.max(axis=-1) / jnp.maximum(load.mean(axis=-1), 1e-12))
    return {
        "load_max_over_mean": max_over_mean,
        "drop_frac": jnp.asarray(stats["drop_frac"], jnp.float32),
        "router_entropy": jnp.asarray(stats["router_entropy"], jnp.float32),
        "aux_loss": jnp.asarray(stats["aux_loss"], jnp.float32),
    }


def make_train_step(
    graphdef: nnx.GraphDef, tx: optax.GradientTransformation, model_cfg: ModelConfig
) -> Callable[[TrainState, Int[Array, "batch seq_plus_1"]], tuple[TrainState, dict]]:
    moe = model_cfg.moe
    bias_rate = moe.bias_update_rate if moe is not None and moe.balance == "bias" else 0.0

    def train_step(state: TrainState, tokens: Int[Array, "batch seq_plus_1"]) -> tuple[TrainState, dict]:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]

        def loss_fn(params):
            model = nnx.merge(graphdef, params, state.router_bias, state.other)
            logits, stats = model(inputs, train=True)
            ce = cross_entropy(logits, targets)
            return ce + stats["aux_loss"], (ce, stats)

        grads, (ce, stats) = jax.grad(loss_fn, has_aux=True)(state.params)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        router_bias = state.router_bias
        out = {"train_loss": ce, "grad_norm": grad_norm}
        if moe is not None:
            if bias_rate > 0:
                router_bias = update_router_bias(router_bias, stats["expert_load"], bias_rate)
            out |= moe_step_stats(stats)
        return TrainState(params, opt_state, router_bias, state.other), out

    return train_step


def make_train_chunk(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    model_cfg: ModelConfig,
    shardings: Any = None,
    *,
    seed_axis: bool = False,
) -> Callable[[TrainState, Int[Array, "steps batch seq_plus_1"]], tuple[TrainState, dict]]:
    """jit(scan(train_step)) over a (steps, batch, seq+1) block of batches, state donated.

    `shardings` = (state shardings, batch sharding, replicated) from delphi.train.sharding: the
    state keeps its placement across steps and XLA reduces the gradients over the data axis.
    `seed_axis`: a seed group (delphi.train.trainer.train_group), vmapped over a leading axis of
    the state, the tokens (seeds, steps, batch, seq+1) and the outputs."""
    train_step = make_train_step(graphdef, tx, model_cfg)

    def chunk(state: TrainState, tokens: Int[Array, "steps batch seq_plus_1"]) -> tuple[TrainState, dict]:
        if tokens.shape[0] == 1:  # no loop at all: lets XLA schedule the single step freely
            state, out = train_step(state, tokens[0])
            return state, jax.tree.map(lambda x: x[None], out)
        return jax.lax.scan(train_step, state, tokens)

    if seed_axis:
        chunk = jax.vmap(chunk)
    if shardings is None:
        return jax.jit(chunk, donate_argnums=(0,))
    state_sh, batch_sh, replicated = shardings
    return jax.jit(chunk, donate_argnums=(0,), in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, replicated))


def make_eval_step(
    graphdef: nnx.GraphDef, shardings: Any = None, *, seed_axis: bool = False
) -> Callable[
    [TrainState, Int[Array, "batches batch seq_plus_1"], Float[Array, "batches batch"]], Float[Array, " batches"]
]:
    """Summed next-token NLL (nats) of each batch of a whole validation set, in one call, dropless
    routing (train=False): `lax.map` over (batches, batch, seq+1) windows, each window weighted 1
    or 0 (0: padding that fills the last batch). The host adds the batch sums in float64. One call per evaluation: at small shapes the per-call
    dispatch and the host loop cost as much as the forward pass itself.

    `shardings` = (state shardings, batch sharding, replicated), batch sharding on axis 1.
    `seed_axis`: a seed group, vmapped over the state's leading axis: (seeds, batches) sums."""

    def batch_nll(
        state: TrainState, tokens: Int[Array, "batch seq_plus_1"], weights: Float[Array, " batch"]
    ) -> Float[Array, ""]:
        model = nnx.merge(graphdef, state.params, state.router_bias, state.other)
        logits, _ = model(tokens[:, :-1], train=False)
        # the per-token terms of delphi.model.transformer.cross_entropy (f32), summed per window
        nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:])
        return jnp.sum(nll.sum(axis=1) * weights)

    def eval_set(
        state: TrainState, tokens: Int[Array, "batches batch seq_plus_1"], weights: Float[Array, "batches batch"]
    ) -> Float[Array, " batches"]:
        return jax.lax.map(lambda batch: batch_nll(state, *batch), (tokens, weights))

    if seed_axis:
        eval_set = jax.vmap(eval_set, in_axes=(0, None, None))
    if shardings is None:
        return jax.jit(eval_set)
    state_sh, batch_sh, replicated = shardings
    return jax.jit(eval_set, in_shardings=(state_sh, batch_sh, batch_sh), out_shardings=replicated)


def eval_blocks(
    windows: Int[np.ndarray, "windows seq_plus_1"], batch: int
) -> tuple[Int[np.ndarray, "batches batch seq_plus_1"], Float[np.ndarray, "batches batch"]]:
    """The windows as whole batches of `batch`, the last one padded with zero-weight copies of
    window 0, and the weights (1 for a real window, 0 for padding)."""
    n = len(windows)
    batches = -(-n // batch)
    pad = batches * batch - n
    tokens = np.concatenate([windows, np.repeat(windows[:1], pad, axis=0)]) if pad else windows
    weights = (np.arange(batches * batch) < n).astype(np.float32)
    return tokens.reshape(batches, batch, windows.shape[1]), weights.reshape(batches, batch)


def bits_per_byte(loss_nats: float | None, bytes_per_token: float = 1.0) -> float | None:
    """nats/token -> bits/byte; exact for byte tokens (1 byte per token)."""
    if loss_nats is None:
        return None
    return loss_nats / math.log(2) / bytes_per_token
