"""The MoE block on a device mesh: local dispatch per device, experts reached by all-to-all.

`ExpertParallelMoE` is the MoE block of a model built for a mesh of more than one device: the
mesh is given to the model when it is built (`Transformer(cfg, ..., mesh=mesh)`, as the trainer
does) and held by the layer, never read from a global. Mesh axes: "data" and "expert"; tokens
are split over both, the routed-expert weights [E, ...] over "expert" (device j of the expert
axis holds experts j*E/X .. (j+1)*E/X - 1, X = mesh size of "expert"); everything else is
replicated.

Inside `jax.shard_map`, every device:
    routes its own tokens (the router is replicated)
    -> capacity-padded groups [E, C, d], C = expert_capacity(local tokens)   (same as moe.py)
    -> all_to_all over "expert": [X, E/X, C, d], chunk j to device j  (dispatch)
    -> its E/X experts on the X*C slots it received from its expert group
    -> all_to_all back (combine) -> gates x outputs summed per token, + shared experts
The two all-to-alls move E*C*d values per device each way, and their transposes do the same in
the backward pass (benchmarks/sharding.py checks this against the compiled HLO).

Capacity is per device, as in GShard/Switch: C counts the device's own tokens, so with drops
the kept assignments can differ from a one-device run (which ranks all tokens together). With
no drops (capacity_factor >= experts / top_k, or evaluation, which is dropless) routing and
results match one device up to float summation order. Load statistics and the aux losses are
reduced over all devices, so they equal the one-device values exactly when nothing is dropped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from delphi.model.config import ModelConfig
from delphi.model.moe import MoE, MoEStats, Routing, dispatch_slots, expert_capacity

DATA_AXIS = "data"
EXPERT_AXIS = "expert"


def token_axes(mesh) -> tuple[str, ...]:
    """Mesh axes the batch is split over (all of them, in mesh order)."""
    return tuple(a for a in (DATA_AXIS, EXPERT_AXIS) if a in mesh.axis_names)


def spans_devices(mesh: jax.sharding.Mesh | None) -> bool:
    """Whether a model on `mesh` needs the expert-parallel block (more than one device on a token axis).
    A 1 x 1 mesh takes the one-device path and gives exactly its numbers."""
    return mesh is not None and mesh.size > 1 and bool(token_axes(mesh))


class ExpertParallelMoE(MoE):
    """`MoE` with the same parameters, run on `mesh` by `moe_sharded` (per-device dispatch + all-to-all)."""

    def __init__(
        self, cfg: ModelConfig, *, mesh: jax.sharding.Mesh, rngs: nnx.Rngs, compute_dtype: jnp.dtype = jnp.float32
    ):
        super().__init__(cfg, rngs=rngs, compute_dtype=compute_dtype)
        self.mesh = mesh  # static: part of the graph definition, not of the state

    def __call__(
        self, x: Float[Array, "batch seq d"], *, train: bool = True
    ) -> tuple[Float[Array, "batch seq d"], MoEStats]:
        return moe_sharded(self, x, mesh=self.mesh, train=train)


def _is_expert_weight(path: tuple) -> bool:
    names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
    return "experts" in names


def moe_sharded(
    layer: MoE, x: Float[Array, "batch seq d"], *, mesh: jax.sharding.Mesh, train: bool
) -> tuple[Float[Array, "batch seq d"], MoEStats]:
    """`layer(x)` with per-device dispatch and expert parallelism over `mesh`."""
    moe = layer.moe
    axes = token_axes(mesh)
    n_token_shards = 1
    for a in axes:
        n_token_shards *= mesh.shape[a]
    n_expert_shards = mesh.shape.get(EXPERT_AXIS, 1)
    experts = moe.experts
    if experts % n_expert_shards:
        raise ValueError(f"{experts} experts do not split over {n_expert_shards} devices of the expert axis")
    local_experts = experts // n_expert_shards
    batch, seq, d = x.shape
    if batch % n_token_shards:
        raise ValueError(f"batch {batch} does not split over {n_token_shards} devices")
    local_tokens = (batch // n_token_shards) * seq
    capacity = expert_capacity(local_tokens, moe.top_k, experts, moe.capacity_factor, train=train)

    graphdef, state = nnx.split(layer)
    state_specs = jax.tree_util.tree_map_with_path(
        lambda path, _: P(EXPERT_AXIS) if _is_expert_weight(path) and n_expert_shards > 1 else P(), state
    )

    def local(state, x_local: Float[Array, "b seq d"]) -> tuple[Float[Array, "b seq d"], MoEStats]:
        # Mark every weight as varying over the token axes before use. The gradient of the cast is
        # the psum over those axes (the data-parallel reduction), and custom-VJP matmuls (moe.matmul
        # in bf16) then see cotangents with the same varying axes as their inputs, which they must.
        state = jax.tree.map(lambda w: _varying(w, axes), state)
        layer_local = nnx.merge(graphdef, state)  # its experts are this device's E/X experts
        b = x_local.shape[0]
        tokens = b * seq
        xt = x_local.reshape(tokens, d)
        routing = layer_local.route(xt)
        slot, kept = dispatch_slots(routing.expert_idx, experts, capacity)

        # Gather into [E, C, d] exactly as MoE.__call__; empty slots read the zero row at `tokens`.
        token_of_assignment = jnp.broadcast_to(jnp.arange(tokens)[:, None], slot.shape)
        slot_token = (
            jnp.full((experts * capacity + 1,), tokens).at[slot.reshape(-1)].set(token_of_assignment.reshape(-1))
        )
        x_padded = jnp.concatenate([xt, jnp.zeros((1, d), xt.dtype)])
        xs = x_padded[slot_token[:-1]].reshape(experts, capacity, d)

        if n_expert_shards > 1:
            # dispatch: chunk j (experts of shard j) goes to device j of the expert axis; we receive
            # [source device, local expert, C, d] and run each local expert over X*C slots.
            xs = xs.reshape(n_expert_shards, local_experts, capacity, d)
            received = jax.lax.all_to_all(xs, EXPERT_AXIS, 0, 0)
            groups = received.transpose(1, 0, 2, 3).reshape(local_experts, n_expert_shards * capacity, d)
            out = layer_local.experts(groups, layer_local.compute_dtype)
            out = out.reshape(local_experts, n_expert_shards, capacity, d).transpose(1, 0, 2, 3)
            ys = jax.lax.all_to_all(out, EXPERT_AXIS, 0, 0)  # combine: back to the tokens' devices
        else:
            ys = layer_local.experts(xs, layer_local.compute_dtype)
        ys = ys.reshape(experts * capacity, d)
        ys_padded = jnp.concatenate([ys, jnp.zeros((1, d), ys.dtype)])  # overflow slot -> zeros
        y = jnp.einsum("tk,tkd->td", routing.gates, ys_padded[slot])
        if layer_local.shared is not None:
            y = y + layer_local.shared(xt, layer_local.compute_dtype)
        return y.reshape(b, seq, d), global_stats(layer_local, routing, kept, axes)

    sharded = jax.shard_map(local, mesh=mesh, in_specs=(state_specs, P(axes)), out_specs=(P(axes), P()))
    return sharded(state, x)


def _varying(w: Array, axes: tuple[str, ...]) -> Array:
    missing = tuple(a for a in axes if a not in jax.typeof(w).mat.varying)  # axes it is still invariant over
    return jax.lax.pcast(w, missing, to="varying") if missing else w


def global_stats(layer: MoE, routing: Routing, kept, axes: tuple[str, ...]) -> MoEStats:
    """`MoE.stats` over the tokens of all devices (every device holds the same number of tokens,
    so a mean over devices of per-device means is the global mean). Keep in step with MoE.stats."""
    moe = layer.moe
    assignments = routing.expert_idx.size
    load = jax.lax.pmean(jnp.bincount(routing.expert_idx.reshape(-1), length=moe.experts) / assignments, axes)
    probs = routing.scores / jnp.sum(routing.scores, axis=-1, keepdims=True)
    entropy = jax.lax.pmean(-jnp.mean(jnp.sum(probs * jnp.log(probs + 1e-20), axis=-1)), axes)
    mean_probs = jax.lax.pmean(jnp.mean(probs, axis=0), axes)
    switch = moe.experts * jnp.sum(load * mean_probs)  # Switch aux loss on the global f_i, P_i
    aux = moe.aux_loss_weight * switch if moe.balance == "aux" else jnp.zeros(())
    z_loss = jax.lax.pmean(jnp.mean(jax.nn.logsumexp(routing.logits, axis=-1) ** 2), axes)
    drop_frac = jax.lax.pmean(jnp.mean((~kept).astype(jnp.float32)), axes)
    return MoEStats(
        expert_load=load, drop_frac=drop_frac, router_entropy=entropy, aux_loss=aux + moe.z_loss_weight * z_loss
    )
