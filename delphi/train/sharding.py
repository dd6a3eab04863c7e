"""Placing a training run on a device mesh (docs/scaling-out.md; docs/design.md §4.3).

    mesh axes ("data", "expert"), shape (mesh.data, mesh.expert), over every device of the job
    batches          split over data x expert on the batch axis
    expert weights   [E, ...] (and their Adam moments) split over "expert"
    everything else  replicated

The train step is jitted with these shardings as in/out shardings, so XLA inserts the gradient
reduction over the data axis itself; a model built for a mesh of more than one device
(`Transformer(..., mesh=mesh)`) has per-device dispatch with all-to-all in its MoE blocks
(delphi.model.moe_parallel). A 1 x 1 mesh takes the one-device path and gives its numbers.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from delphi.errors import DelphiError
from delphi.model.flops import check_plausible_size
from delphi.model.moe import expert_capacity
from delphi.model.moe_parallel import DATA_AXIS, EXPERT_AXIS
from delphi.train.config import MeshConfig, TrainConfig
from delphi.train.environment import distributed_env
from delphi.train.memory import check_estimate_fits

MESH_AXES = (DATA_AXIS, EXPERT_AXIS)
BATCH_AXES = (DATA_AXIS, EXPERT_AXIS)  # the batch axis is split over both
# DISTRIBUTED_ENV ("1": call jax.distributed.initialize() even if mesh.distributed is false) is read
# and checked in delphi.train.environment.


def wants_distributed(mesh_cfg: MeshConfig) -> bool:
    return mesh_cfg.distributed or distributed_env()


def initialize_distributed(mesh_cfg: MeshConfig) -> bool:
    """jax.distributed.initialize() once per process, if the config or the environment asks.

    Unset settings fall to JAX: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, or
    the cluster's auto-detection (SLURM, Open MPI, Cloud TPU). Must run before any JAX computation.
    """
    if not wants_distributed(mesh_cfg) or jax.distributed.is_initialized():
        return False
    jax.distributed.initialize(
        coordinator_address=mesh_cfg.coordinator_address,
        num_processes=mesh_cfg.num_processes,
        process_id=mesh_cfg.process_id,
    )
    return True


def make_mesh(mesh_cfg: MeshConfig, devices: list | None = None) -> Mesh:
    """The ("data", "expert") mesh over `devices` (default: every device of the job)."""
    devices = jax.devices() if devices is None else list(devices)
    if mesh_cfg.devices != len(devices):
        raise DelphiError(
            f"mesh: mesh.data x mesh.expert x mesh.model = {mesh_cfg.data} x {mesh_cfg.expert} x {mesh_cfg.model} "
            f"= {mesh_cfg.devices} devices, but JAX sees {len(devices)} {devices[0].platform} device(s); "
            f"set mesh.data and mesh.expert so that their product is {len(devices)}"
        )
    grid = np.asarray(devices, dtype=object).reshape(mesh_cfg.data, mesh_cfg.expert)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def check_fits_in_memory(cfg: TrainConfig, seeds: int = 1, devices: list | None = None) -> None:
    """Refuse, before anything is compiled, written or allocated, a run whose estimate
    (delphi.train.memory: parameters, gradients, optimizer state, activations, runtime) exceeds what
    one of its devices has free (its memory stats), or for CPU devices (which share the host's
    memory) what this machine has available now (MemAvailable). The compiled program is checked
    after (delphi.train.trainer.check_compiled_memory)."""
    check_plausible_size(cfg.model)
    check_estimate_fits(cfg, local_devices(devices), seeds)


def local_devices(devices: list | None = None) -> list:
    """This process's share of `devices` (default: every device of the job)."""
    devices = jax.devices() if devices is None else list(devices)
    return [d for d in devices if d.process_index == jax.process_index()] or devices


def _names(path: tuple) -> list:
    return [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]


def is_expert_weight(path: tuple, leaf: Any) -> bool:
    """Routed-expert matrices [E, ...] (module attribute `experts` of MoE), and their optimizer moments."""
    return "experts" in _names(path) and getattr(leaf, "ndim", 0) == 3


def state_shardings(state: Any, mesh: Mesh) -> Any:
    """NamedSharding per leaf of the train state: expert weights over "expert", the rest replicated."""
    split = mesh.shape[EXPERT_AXIS] > 1

    def spec(path, leaf):
        return NamedSharding(mesh, P(EXPERT_AXIS) if split and is_expert_weight(path, leaf) else P())

    return jax.tree_util.tree_map_with_path(spec, state)


def batch_sharding(mesh: Mesh, leading_axes: int = 0) -> NamedSharding:
    """Tokens [*leading, batch, seq+1] split over data x expert on the batch axis."""
    return NamedSharding(mesh, P(*([None] * leading_axes), BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def place(host: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from a host array every process holds in full (batches are a pure function
    of (seed, step), so each process computes them): each process uploads only its own shards."""
    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place_state(state: Any, shardings: Any) -> Any:
    def put(leaf, sharding):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return jax.device_put(leaf, sharding)
        return place(np.asarray(leaf), sharding)

    return jax.tree.map(put, state, shardings)


# ---- communication volume from the compiled HLO

_A2A = re.compile(
    r"^\s*(?:ROOT\s+)?\S+\s*=\s*(.*?)\s+all-to-all(?:-start)?\(", re.MULTILINE
)  # result type(s) of each op
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}


def all_to_all_bytes(hlo_text: str) -> tuple[int, int]:
    """(number of all-to-all ops, sum of their operand bytes per device) in an HLO module's text.

    An all-to-all's result has the same shapes as its operands, so the result type is summed.
    Ops inside a loop body (the scan over steps) are counted once, i.e. per step.
    """
    count = total = 0
    for match in _A2A.finditer(hlo_text):
        count += 1
        for dtype, dims in _ARRAY.findall(match.group(1)):
            size = int(np.prod([int(x) for x in dims.split(",") if x])) if dims else 1
            total += size * _DTYPE_BYTES[dtype]
    return count, total


def expected_all_to_all_bytes(cfg: TrainConfig, dtype_bytes: int = 4) -> int:
    """Per device and optimizer step: layers x 2 (dispatch + combine) x 2 (forward + backward)
    x E x C x d_model x bytes, C = expert_capacity of one device's tokens. The groups travel in
    f32 (the activations' dtype; bf16 runs cast inside the expert matmuls)."""
    moe = cfg.model.moe
    if moe is None or cfg.mesh.expert == 1:
        return 0
    local_tokens = cfg.tokens_per_step // (cfg.mesh.data * cfg.mesh.expert)
    capacity = expert_capacity(local_tokens, moe.top_k, moe.experts, moe.capacity_factor, train=True)
    return cfg.model.n_layers * 2 * 2 * moe.experts * capacity * cfg.model.d_model * dtype_bytes
