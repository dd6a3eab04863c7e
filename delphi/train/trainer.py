"""The training loop, one concept over ~1000 lines: `train(cfg, run_dir)` runs one config (or a seed
group) to a run directory; its program cache and run-identity helpers serve only this loop.

    validate everything (config, model size, store size, run dir) -> lock the run dir
    -> write config.yaml -> init or restore -> compile -> loop over chunks of steps:
         host: the next batches (a pure function of (seed, step))
         device: `steps_per_call` optimizer steps in one jitted call
         at log/eval/checkpoint steps: sync, check the loss is finite, write metrics
    -> final checkpoint -> summary.json

Ctrl-C and SIGTERM only set a flag for the whole run; the trainer stops at its next safe point
(between start-up stages, at a call boundary of the loop): delphi.train.interrupt.

Determinism: the batch at step s depends only on (data.seed, s) and the
training state lives entirely in the checkpoint, so a resumed run repeats the
uninterrupted run's numbers. Nothing is pulled to the host between sync points,
so the device never waits on Python logging.

Multi-host: every process runs this same code on its share of the mesh and takes part in every
checkpoint save; only process 0 writes the run directory's files (config, status, metrics,
summary, W&B, the progress bar).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from delphi.data.loader import TokenStore
from delphi.data.store import check_store_for_config
from delphi.errors import DelphiError
from delphi.hashes import sha256_bytes
from delphi.io import atomic_write_json, atomic_write_text, read_yaml
from delphi.model.config import ModelConfig
from delphi.model.flops import count_params, flops_per_token, palm_flops_per_token
from delphi.model.transformer import Transformer
from delphi.train import checkpoint as ckpt
from delphi.train import interrupt, sharding
from delphi.train.config import OPTIM_KEYS_ADDED, TrainConfig, train_config_to_dict
from delphi.train.device import check_precision, effective_device, request_platform, resolve_attention, select_devices
from delphi.train.environment import (  # CHECKPOINT_CLOCK_ENV, STEPS_PER_CALL_ENV: their old home is here
    SINGLE_THREAD_XLA_FLAG,
    check_training_environment,
    checkpoint_clock_env,
    steps_per_call_env,
    xla_cpu_threads,
)
from delphi.train.memory import CompiledMemory, check_program_fits
from delphi.train.optim import make_optimizer
from delphi.train.peak import peak_flops
from delphi.train.progress import PredictedLoss, Progress
from delphi.train.rundir import (
    CONFIG_FILE,
    LOCK_FILE,
    LOSS_UNIT,
    METRICS_FILE,
    RESUME_HINT,
    SUMMARY_FILE,
    MetricsLog,
    RunLock,
    WandbLog,
    check_not_locked,
    read_status,
    summary_problem,
    wandb_mode,
    warn,
    write_status,
)
from delphi.train.schedules import lr_schedule
from delphi.train.step import TrainState, bits_per_byte, eval_blocks, make_eval_step, make_train_chunk, split_model

# Scan length cap: more steps per call pay less dispatch per step, with diminishing returns past 16.
MAX_STEPS_PER_CALL = 16
# CHECKPOINT_CLOCK_ENV (seconds): a single-process run also checkpoints at the first log point this
# long after its last save, so a hard kill of a long run (a hero outlasting a working session) loses
# at most this much. A setting of the machine, not of the experiment: an environment variable, out
# of every config. It and STEPS_PER_CALL_ENV are read and checked in delphi.train.environment.
MATHS_FREE_KEYS = ("mesh", "eval_batch_size", "checkpoint_every_s", "device", "attention")  # left out of config_sha256
# Keys added after runs were on disk: unset (None), they are left out, so older runs keep their identity.
UNSET_SINCE_ADDED_KEYS = ("final_eval_tokens",)


def config_yaml(cfg: TrainConfig) -> str:
    import yaml

    return yaml.safe_dump(train_config_to_dict(cfg), sort_keys=False)


def identity_yaml(text: str) -> str:
    """The config without the keys that only say how the maths is laid out (MATHS_FREE_KEYS): a
    run keeps its config_sha256 on any mesh, eval batch, device or attention kernel and may be
    resumed on a different one."""
    import yaml

    data = yaml.safe_load(text) or {}
    for key in MATHS_FREE_KEYS:
        data.pop(key, None)
    for key in UNSET_SINCE_ADDED_KEYS:
        if data.get(key, 0) is None:
            data.pop(key)
    optim = data.get("optim")
    if isinstance(optim, dict):  # `optimizer: adamw` written out by hand is the config it always was
        for key, value in OPTIM_KEYS_ADDED.items():
            if key in optim and optim[key] == value:
                optim.pop(key)
    return yaml.safe_dump(data, sort_keys=False)


def steps_per_call(cfg: TrainConfig, cap: int | None = None) -> int:
    """Largest k <= cap dividing every sync period, so sync points fall on call boundaries."""
    if cap is None:
        cap = steps_per_call_env() or MAX_STEPS_PER_CALL
    period = math.gcd(cfg.log_every, cfg.eval_every, cfg.checkpoint_every, cfg.steps)
    return max(k for k in range(1, max(cap, 1) + 1) if period % k == 0)


def _existing_identity(path: Path) -> str:
    """The identity of a run dir's config.yaml; a file that is not a YAML mapping is a clear error."""
    import yaml

    try:
        data = read_yaml(path)
    except DelphiError as e:
        raise DelphiError(f"{e}; the run's config.yaml: restore it or use another --out") from None
    if not isinstance(data, dict):
        raise DelphiError(
            f"{path}: the run's config.yaml holds {type(data).__name__}, expected a mapping; restore it or use another --out"
        )
    return identity_yaml(yaml.safe_dump(data, sort_keys=False))


def _check_run_dir(run_dir: Path, text: str, resume: bool) -> None:
    """A run dir holds one config: refuse to mix configs or silently overwrite a run."""
    if run_dir.exists() and not run_dir.is_dir():
        raise DelphiError(f"--out: {run_dir} exists and is not a directory")
    existing = run_dir / CONFIG_FILE
    if existing.is_file():
        if _existing_identity(existing) != identity_yaml(text):
            raise DelphiError(f"--out: {run_dir} holds a run with a different config.yaml; use another directory")
        started = (run_dir / METRICS_FILE).exists() or ckpt.list_checkpoints(run_dir)
        if started and not resume:
            status = (read_status(run_dir) or {}).get("status", "unknown")
            raise DelphiError(f"--out: {run_dir} already holds a run (status {status}); pass --resume to continue it")
    elif run_dir.is_dir() and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
        raise DelphiError(f"--out: {run_dir} is a non-empty directory without a run config.yaml")


# The initial weights come from one jitted program keyed by an RBG key (XLA's RngBitGenerator).
# Built eagerly, every jax.random.normal of a new shape compiled its own threefry program: 9.5 s
# per new width on one core of the 2-core AMD EPYC (a d14 L3 MoE, 33 arrays); one jitted threefry
# program took 10 s to compile, the same program with RBG 2.5 s, then nothing for the next seed.
# RBG's bits are deterministic for a given seed and backend but not guaranteed equal across JAX
# versions or backends, which an initialisation does not need (a resumed run restores its weights).
INIT_PRNG_IMPL = "rbg"


@functools.partial(nnx.jit, static_argnums=(1, 2, 3, 4))
def _build_model(
    key: jax.Array, model: ModelConfig, compute_dtype: Any, mesh: jax.sharding.Mesh | None, attention: str
) -> nnx.Module:
    return Transformer(model, rngs=nnx.Rngs(key), compute_dtype=compute_dtype, mesh=mesh, attention=attention)


def platform_of(mesh: jax.sharding.Mesh | None) -> str:
    """The platform a model built for `mesh` runs on (None: JAX's default device's)."""
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def attention_kernel(cfg: TrainConfig, mesh: jax.sharding.Mesh | None = None) -> str:
    """The attention kernel of `cfg` on `mesh`'s platform (delphi.train.device.resolve_attention)."""
    return resolve_attention(cfg.attention, platform_of(mesh), cfg.precision)


def init_model(cfg: TrainConfig, mesh: jax.sharding.Mesh | None = None) -> nnx.Module:
    compute_dtype = jnp.bfloat16 if cfg.precision == "bf16" else jnp.float32
    key = jax.random.key(cfg.seed, impl=INIT_PRNG_IMPL)
    return _build_model(key, cfg.model, compute_dtype, mesh, attention_kernel(cfg, mesh))


# AOT-compiled programs, ("train", ...) -> (train chunk, compile seconds) and ("eval", ...) ->
# (eval step, compile seconds): a resumed or repeated run in the same process reuses its
# executables, and a run's train chunk, compiled by the memory check before anything is written
# (`check_compiled_memory`), is the one it trains with.
_COMPILED: dict[tuple, tuple[Callable, float]] = {}
COMPILED_CACHE_SIZE = 8


def _cache(key: tuple, build: Callable[[], Callable]) -> tuple[Callable, float]:
    """The cached program of `key` (the most recently used last), built on a miss."""
    if key in _COMPILED:
        _COMPILED[key] = _COMPILED.pop(key)
    else:
        start = time.perf_counter()
        program = build()
        while len(_COMPILED) >= COMPILED_CACHE_SIZE:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = (program, time.perf_counter() - start)
    return _COMPILED[key]


def latest_train_program() -> Callable | None:
    """The compiled train chunk used last in this process (benchmarks and tests read its HLO, cost
    and memory analyses), or None."""
    programs = [program for key, (program, _) in _COMPILED.items() if key[0] == "train"]
    return programs[-1] if programs else None


def _program_key(cfg: TrainConfig, mesh: jax.sharding.Mesh, seeds: int) -> tuple:
    devices = tuple((d.platform, d.id) for d in mesh.devices.flat)
    return (
        cfg.model,
        cfg.optim,
        cfg.steps,
        cfg.precision,
        cfg.data.seq_len,
        cfg.data.batch_size,
        seeds,
        cfg.mesh,
        attention_kernel(cfg, mesh),
        devices,
    )


def _train_chunk_program(
    cfg: TrainConfig, k: int, graphdef, tx, state: Any, tokens: Any, mesh, shardings, *, seeds: int = 0
) -> tuple[Callable, float]:
    """The compiled train chunk (and its compile seconds) for `state` and `tokens`, concrete arrays
    or jax.ShapeDtypeStructs of the same shapes, dtypes and shardings."""
    state_sh, train_batch_sh, _, replicated = shardings

    def build() -> Callable:
        with jax.set_mesh(mesh):
            chunk = make_train_chunk(
                graphdef, tx, cfg.model, (state_sh, train_batch_sh, replicated), seed_axis=seeds > 0
            )
            return chunk.lower(state, tokens).compile()

    return _cache(("train", k, *_program_key(cfg, mesh, seeds)), build)


def _compiled_steps(
    cfg: TrainConfig, k: int, graphdef, tx, state: TrainState, tokens, eval_set, mesh, shardings, *, seeds: int = 0
):
    """AOT-compiled (train chunk, eval step, compile seconds of both), cached per process by
    everything they depend on; `seeds` > 0: a seed group's, vmapped over a leading axis of that
    many seeds.

    Traced under `jax.set_mesh(mesh)`; the model's MoE block was given the mesh when it was built
    (`init_model(cfg, mesh)`, delphi.model.moe_parallel)."""
    state_sh, _, eval_batch_sh, replicated = shardings
    train_chunk, train_s = _train_chunk_program(cfg, k, graphdef, tx, state, tokens, mesh, shardings, seeds=seeds)

    def build_eval() -> Callable:
        with jax.set_mesh(mesh):
            eval_step = make_eval_step(graphdef, (state_sh, eval_batch_sh, replicated), seed_axis=seeds > 0)
            return eval_step.lower(state, *eval_set).compile()

    eval_step, eval_s = _cache(("eval", eval_set[0].shape, *_program_key(cfg, mesh, seeds)), build_eval)
    return train_chunk, eval_step, train_s + eval_s


def abstract_train_state(cfgs: list[TrainConfig], tx, mesh: jax.sharding.Mesh) -> tuple[Any, Any]:
    """(graphdef, the train state as jax.ShapeDtypeStructs) of `cfgs` (a seed group: stacked on a
    leading axis), each leaf with the sharding the trainer places it with; nothing is allocated."""
    cfg = cfgs[0]
    graphdef = split_model(nnx.eval_shape(lambda: init_model(cfg, mesh)))[0]

    def fresh() -> TrainState:
        _, params, router_bias, other = split_model(init_model(cfg, mesh))
        return TrainState(params, tx.init(params), router_bias, other)

    state = jax.eval_shape(fresh)
    if len(cfgs) > 1:
        state = jax.tree.map(lambda x: jax.ShapeDtypeStruct((len(cfgs), *x.shape), x.dtype), state)
    shardings = sharding.state_shardings(state, mesh)
    return graphdef, jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), state, shardings)


def compile_train_chunk(cfgs: list[TrainConfig], mesh: jax.sharding.Mesh) -> tuple[Callable, float]:
    """The train chunk of `cfgs` (one run, or a seed group) on `mesh`, compiled from abstract
    shapes (nothing allocated) and cached: the program the run then trains with, and its compile
    seconds."""
    cfg = cfgs[0]
    stacked = len(cfgs) > 1
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    graphdef, state = abstract_train_state(cfgs, tx, mesh)
    k = steps_per_call(cfg)
    batch_sh = sharding.batch_sharding(mesh, 2 if stacked else 1)
    shape = ((len(cfgs),) if stacked else ()) + (k, cfg.data.batch_size, cfg.data.seq_len + 1)
    tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sh)
    shardings = (jax.tree.map(lambda x: x.sharding, state), batch_sh, None, sharding.replicated(mesh))
    return _train_chunk_program(cfg, k, graphdef, tx, state, tokens, mesh, shardings, seeds=len(cfgs) if stacked else 0)


def check_compiled_memory(cfgs: list[TrainConfig], mesh: jax.sharding.Mesh) -> Any:
    """Refuse (DelphiError) a run whose compiled train chunk needs more memory than its device has
    (delphi.train.memory.check_program_fits), before anything is written; returns the program's
    memory (delphi.train.memory.CompiledMemory, None where XLA reports none)."""
    memory = CompiledMemory.of(compile_train_chunk(cfgs, mesh)[0])
    check_program_fits(cfgs[0], memory, sharding.local_devices(list(mesh.devices.flat)), seeds=len(cfgs))
    return memory


@dataclass(frozen=True)
class EvalSet:
    """The validation windows on the device as whole eval batches (`delphi.train.step.eval_blocks`),
    in chunks of one shape: chunk 0 is every evaluation's set, the others join it at the last step
    (`TokenStore.final_eval_chunks`; none without final_eval_tokens)."""

    chunks: tuple[
        tuple[jax.Array, jax.Array], ...
    ]  # (tokens (batches, eval batch, seq+1), weights (batches, eval batch))
    n_targets: int  # next-token targets of the real windows of one chunk
    # bytes of eval text per target (TokenStore.eval_bytes): of chunk 0 (the curve) and of all chunks
    # (the final evaluation); exactly 1.0 for a byte store
    bytes_per_target: tuple[float, float] = (1.0, 1.0)


def eval_set(cfg: TrainConfig, store: Any, batch_sharding: Any) -> EvalSet:
    """The windows of `TokenStore.eval_set` (how many: set by the training batch, so the val loss
    does not depend on the eval batch) in batches of `cfg.eval_batch_sequences`, and the final
    evaluation's further chunks."""
    b, t = cfg.data.batch_size, cfg.data.seq_len
    if cfg.final_eval_tokens is None:
        windows = [store.eval_set(cfg.eval_tokens, b, t)]
    else:
        windows = store.final_eval_chunks(cfg.eval_tokens, cfg.final_eval_tokens, b, t)
    per_batch = cfg.eval_batch_sequences(len(windows[0]))
    chunks = tuple(tuple(sharding.place(a, batch_sharding) for a in eval_blocks(w, per_batch)) for w in windows)
    n_targets = windows[0].shape[0] * (windows[0].shape[1] - 1)
    curve_bytes = store.eval_bytes(windows[0])
    all_bytes = curve_bytes + sum(store.eval_bytes(w) for w in windows[1:])
    return EvalSet(chunks, n_targets, (curve_bytes / n_targets, all_bytes / (len(windows) * n_targets)))


def evaluate(
    eval_step: Callable, state: TrainState, data: EvalSet, *, final: bool = False
) -> tuple[list[float], list[float]]:
    """Mean next-token loss (nats) per seed (one for a single run) over chunk 0, the curve's set,
    and over every chunk when `final` (else chunk 0 again): one device call per chunk, the
    per-batch sums added in float64."""
    chunks = data.chunks if final else data.chunks[:1]
    sums = np.stack([np.atleast_2d(np.asarray(eval_step(state, *c), np.float64)).sum(axis=-1) for c in chunks])
    curve = sums[0] / data.n_targets
    full = sums.sum(axis=0) / (len(chunks) * data.n_targets)
    return [float(v) for v in curve], [float(v) for v in full]


def _train_batches(cfgs: list[TrainConfig], store: Any, first: int, k: int, batch_sharding: Any) -> jax.Array:
    """Steps first .. first+k-1 as one (k, batch, seq+1) global array; a seed group: one such
    block per member (its own data.seed) stacked into (seeds, k, batch, seq+1)."""
    blocks = [
        np.stack(
            [store.train_batch(s, c.data.seed, c.data.batch_size, c.data.seq_len) for s in range(first, first + k)]
        )
        for c in cfgs
    ]
    return sharding.place(blocks[0] if len(cfgs) == 1 else np.stack(blocks), batch_sharding)


def _all_processes_agree(flag: bool) -> bool:
    """True if any process of a multi-host job says so (a signal may reach them at different times)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray([flag]))))


# ---- seed groups: members that differ only in their seeds, trained as one vmapped program

SEED_KEYS = ("seed", "data.seed", "name")  # what members of a seed group may differ in


def _without_seeds(cfg: TrainConfig) -> dict:
    data = train_config_to_dict(cfg)
    data.pop("seed")
    data.pop("name")
    data["data"].pop("seed")
    return data


def check_seed_group(cfgs: list[TrainConfig], run_dirs: list[Path]) -> None:
    """DelphiError unless the configs differ only in SEED_KEYS, their seeds and run dirs are
    distinct, and the group runs on one device."""
    if not cfgs or len(cfgs) != len(run_dirs):
        raise DelphiError(f"train_group: {len(cfgs)} configs for {len(run_dirs)} run directories")
    if len(cfgs) == 1:
        return
    shape = _without_seeds(cfgs[0])
    for i, cfg in enumerate(cfgs[1:], 1):
        if _without_seeds(cfg) != shape:
            differ = sorted(k for k in shape if shape[k] != _without_seeds(cfg).get(k))
            raise DelphiError(
                f"{run_dirs[i]}: a vmapped seed group whose members differ in shape: its config differs from "
                f"{run_dirs[0]}'s in {', '.join(differ)}; members may differ only in {', '.join(SEED_KEYS)}"
            )
    seeds = [(c.seed, c.data.seed) for c in cfgs]
    if len(set(seeds)) != len(seeds):
        raise DelphiError(f"seeds: (seed, data.seed) of a seed group must be unique, got {seeds}")
    dirs = [Path(d).resolve() for d in run_dirs]
    if len(set(dirs)) != len(dirs):
        raise DelphiError(
            f"--out: the run directories of a seed group must be distinct, got {[str(d) for d in run_dirs]}"
        )
    if cfgs[0].mesh.devices != 1:
        raise DelphiError(
            f"mesh: a seed group runs on one device (mesh.data x mesh.expert = {cfgs[0].mesh.devices} is not supported "
            "for groups); train the seeds one by one on a mesh"
        )


def _stack(trees: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _member(state: Any, i: int, stacked: bool) -> Any:
    return jax.tree.map(lambda x: x[i], state) if stacked else state


# ---- what the loop reads (RunContext, a Member per run) and what it changes (LoopState)


@dataclass(frozen=True)
class Member:
    """One run of a group (a single run is a group of one): its config, directory and writers."""

    cfg: TrainConfig
    run_dir: Path
    metrics: MetricsLog
    wandb: WandbLog
    bar: Progress
    primary: bool  # process 0: the one that writes the run directory

    def status(self, status: str, step: int, reason: str = "") -> None:
        if self.primary:
            write_status(self.run_dir, status, step, reason)

    def write_summary(self, summary: dict) -> None:
        if self.primary:
            atomic_write_json(self.run_dir / SUMMARY_FILE, summary)

    def log(self, record: dict, *, show: bool = True) -> None:
        self.metrics.write(record)
        if self.primary:
            self.wandb.write(record)
        if show:
            self.bar.show(record)


@dataclass(frozen=True)
class RunContext:
    """Everything fixed for the duration of the loop."""

    cfg: TrainConfig  # the members' common config (steps, periods, shapes)
    members: tuple[Member, ...]
    stacked: bool  # a seed group: the state and the batches have a leading seed axis
    store: Any  # delphi.data.loader.TokenStore
    k: int  # optimizer steps per jitted call
    train_chunk: Callable
    eval_step: Callable
    eval_data: EvalSet
    train_batch_sharding: Any
    lr_at: Callable[[int], float]
    exact_flops_per_token: float
    palm_per_token: float
    peak: float
    max_steps: int | None

    def batches(self, first: int) -> jax.Array:
        return _train_batches([m.cfg for m in self.members], self.store, first, self.k, self.train_batch_sharding)


@dataclass
class LoopState:
    """What the training loop mutates (per member: summaries, wall_before, active)."""

    state: TrainState
    step: int
    summaries: list[dict]
    wall_before: list[float]  # wall seconds of earlier sessions of each run (from its checkpoint)
    active: list[bool] = field(default_factory=list)  # False once a member has diverged
    run_start: float = field(default_factory=time.perf_counter)
    last_sync_step: int = 0
    last_sync_time: float = 0.0
    train_time: float = 0.0  # wall time inside training calls since start (excludes eval, checkpoints)
    eval_time: float = 0.0  # wall time of evaluations since start
    checkpoint_time: float = 0.0  # wall time of checkpoint saves since start
    last_checkpoint_time: float = 0.0  # perf_counter of the last save (or of the session's start)
    pending: list[dict] = field(default_factory=list)  # device outputs of calls since the last sync point
    stop_signal: str | None = None
    first_step: int = 0  # the step this session started from

    def __post_init__(self) -> None:
        self.first_step = self.last_sync_step = self.step
        self.last_sync_time = self.run_start
        self.active = [True] * len(self.summaries)

    def wall(self, i: int) -> float:
        return self.wall_before[i] + time.perf_counter() - self.run_start


# ---- train(), train_group(): validate, set up, run


def train(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    predicted_loss: PredictedLoss | None = None,
    progress: bool = True,
    max_steps: int | None = None,
) -> dict:
    """Train `cfg` into `run_dir` and return the summary (also written to summary.json).

    `max_steps` stops early after that many steps (as a kill would, leaving a
    checkpoint and a resumable run): used by tests and for time-boxed runs.
    """
    return train_group(
        [cfg], [run_dir], resume=resume, predicted_loss=predicted_loss, progress=progress, max_steps=max_steps
    )[0]


def train_group(
    cfgs: list[TrainConfig],
    run_dirs: list[Path],
    *,
    resume: bool = False,
    predicted_loss: PredictedLoss | None = None,
    progress: bool = True,
    max_steps: int | None = None,
) -> list[dict]:
    """Train seeds of one config together, one run directory each, and return their summaries.

    The members may differ only in their seeds (SEED_KEYS); they are trained as one program with a
    leading seed axis (jax.vmap over the train chunk and the eval), each from its own init and data
    order, each with its own config.yaml, metrics, status, summary and checkpoints, which a plain
    `train` of that member can resume as well. Resuming a group restarts every member from the
    newest step that all of them have a good checkpoint of. A single config is a group of one (no
    seed axis). Groups of more than one run on one device.

    A member equals its seed trained alone up to f32 rounding (the vmapped matmuls and reductions
    are blocked differently): 1e-7 relative after 20 steps of a tiny MoE, but training amplifies it
    (top-k routing flips), to ~2% of the final loss after 896 steps of the default ladder's d32 rung
    at its LR, as any rounding change would. The same group (same members) repeats its numbers
    exactly, also across a resume.
    """
    with interrupt.deferred_signals():
        return _train_group(cfgs, run_dirs, resume, predicted_loss, progress, max_steps)


def _train_group(
    cfgs: list[TrainConfig],
    run_dirs: list[Path],
    resume: bool,
    predicted_loss: PredictedLoss | None,
    progress: bool,
    max_steps: int | None,
) -> list[dict]:
    # ---- validate everything before writing anything
    cfgs = [cfg.validate() for cfg in cfgs]
    check_training_environment([c.wandb.mode for c in cfgs])  # DELPHI_*, WANDB_MODE and its API key
    run_dirs = [Path(d) for d in run_dirs]
    for run_dir in run_dirs:
        ckpt.check_checkpoint_path(run_dir)
    check_seed_group(cfgs, run_dirs)
    cfg = cfgs[0]
    device = effective_device(cfg.device)
    request_platform(device)  # before JAX starts its backends
    sharding.initialize_distributed(cfg.mesh)  # multi-host: before any other JAX call
    devices = select_devices(device)
    check_precision(cfg.precision, devices)
    mesh = sharding.make_mesh(cfg.mesh, devices)
    sharding.check_fits_in_memory(cfg, seeds=len(cfgs), devices=devices)
    texts = [config_yaml(c) for c in cfgs]
    for run_dir, text in zip(run_dirs, texts):
        _check_run_dir(run_dir, text, resume)
    store = TokenStore(check_store_for_config(cfg))  # its bytes and vocabulary, before any step
    store.check_feeds(**cfg.store_needs())  # its batches and evaluation windows
    done = [(read_status(d) or {}).get("status") == "completed" for d in run_dirs]
    for run_dir, finished in zip(run_dirs, done):
        if resume and finished and (problem := summary_problem(run_dir, "completed")):
            # its final evaluation cannot be redone from the last checkpoint: say so, do not guess
            raise DelphiError(f"{problem}; restore it, or train into a new directory")
    if resume and all(done):
        return [json.loads((d / SUMMARY_FILE).read_text()) for d in run_dirs]

    if jax.process_index() == 0:
        for run_dir in run_dirs:
            check_not_locked(run_dir)  # a second trainer is refused before it compiles
    check_compiled_memory(cfgs, mesh)  # the compiled program against the device's memory
    interrupt.check("start-up (nothing was written)")
    primary = jax.process_index() == 0
    ckpt.barrier("delphi_train_validated")  # every process has read the run dir before process 0 writes it
    with contextlib.ExitStack() as locks:
        if primary:
            for run_dir, text in zip(run_dirs, texts):
                locks.enter_context(RunLock(run_dir))
                _check_run_dir(run_dir, text, resume)  # again, now that no other trainer can write it
        return _train_locked(cfgs, run_dirs, texts, mesh, store, resume, predicted_loss, progress, max_steps, primary)


def _restore_group(run_dirs: list[Path], templates: list[TrainState], shardings: Any, primary: bool) -> list | None:
    """Each member's checkpoint of the newest step all members have a good one of, or None (start
    over). Corrupt checkpoints are reported and deleted as for a single run."""
    bound = None
    while True:
        found = []
        for run_dir, template in zip(run_dirs, templates):
            restoration = ckpt.restore_latest(run_dir, template, shardings, at_most=bound)
            note = restoration.message(run_dir)
            if note and primary:
                warn(note)
            ckpt.remove_checkpoints([path for path, _ in restoration.corrupt])
            found.append(restoration.restored)
        if any(r is None for r in found):
            if len(found) > 1 and any(r is not None for r in found) and primary:
                warn(
                    f"{run_dirs[found.index(None)]}: no checkpoint common to the seed group; every member restarts from step 0"
                )
            return None
        steps = {r.step for r in found}
        if len(steps) == 1:
            return found
        bound = min(steps)  # a kill between members' saves: go back to the step all of them hold


def _train_locked(
    cfgs: list[TrainConfig],
    run_dirs: list[Path],
    texts: list[str],
    mesh: jax.sharding.Mesh,
    store: Any,
    resume: bool,
    predicted_loss: PredictedLoss | None,
    progress: bool,
    max_steps: int | None,
    primary: bool,
) -> list[dict]:
    cfg, stacked = cfgs[0], len(cfgs) > 1
    summaries: list[dict] = []
    members: list[Member] = []
    start_step = 0
    try:
        # ---- the run directories (process 0)
        if primary:
            for run_dir, text in zip(run_dirs, texts):
                atomic_write_text(run_dir / CONFIG_FILE, text)
                write_status(run_dir, "pending", 0)
        interrupt.check("start-up")

        # ---- the state: fresh, or restored straight into this mesh's shardings
        tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
        fresh = []
        for c in cfgs:
            graphdef, params, router_bias, other = split_model(init_model(c, mesh))
            fresh.append(TrainState(params, tx.init(params), router_bias, other))
        member_sh = sharding.state_shardings(fresh[0], mesh)
        restored = _restore_group(run_dirs, fresh, member_sh, primary) if resume else None
        threads = cpu_threads()
        if restored is not None:
            check_resume_threads(run_dirs[0], restored[0].extra, threads)
            check_resume_store(run_dirs[0], restored[0].extra, store.sha256)
            states, start_step = [r.state for r in restored], restored[0].step
            wall_before = [float(r.extra.get("wall_s", 0.0)) for r in restored]
        else:
            states, start_step = [sharding.place_state(s, member_sh) for s in fresh], 0
            wall_before = [0.0] * len(cfgs)
        del fresh
        state = _stack(states) if stacked else states[0]
        del states
        state_sh = sharding.state_shardings(state, mesh)
        batch_sh = sharding.batch_sharding(mesh, 2 if stacked else 1)  # ([seeds,] steps, batch, seq+1)
        eval_sh = sharding.batch_sharding(mesh, 1)  # (eval batches, batch, seq+1), shared by the seeds
        shardings = (state_sh, batch_sh, eval_sh, sharding.replicated(mesh))
        interrupt.check("initialisation")

        summaries = [
            _summary_header(c, store, sha256_bytes(identity_yaml(text).encode()), start_step, wall)
            | {"cpu_threads": threads}
            for c, text, wall in zip(cfgs, texts, wall_before)
        ]
        for i, (c, run_dir) in enumerate(zip(cfgs, run_dirs)):
            members.append(
                Member(
                    cfg=c,
                    run_dir=run_dir,
                    primary=primary,
                    metrics=MetricsLog(
                        run_dir, keep_through_step=start_step if restored is not None else None, enabled=primary
                    ),
                    wandb=WandbLog(
                        wandb_mode(c.wandb.mode) if primary else "disabled",
                        project=c.wandb.project,
                        entity=c.wandb.entity,
                        name=c.name,
                        config=train_config_to_dict(c),
                        run_dir=run_dir,
                    ),
                    # one progress bar for the group: the first member's
                    bar=Progress(
                        c.steps, start_step, c.tokens_per_step, predicted_loss, enabled=progress and primary and i == 0
                    ),
                )
            )
        # ---- compile ahead of time so timings (and the progress bar) exclude it
        compile_start = time.perf_counter()
        k = summaries[0]["steps_per_call"]
        eval_data = eval_set(cfg, store, eval_sh)
        first_tokens = _train_batches(cfgs, store, start_step, k, batch_sh)
        train_chunk, eval_step, compiled_s = _compiled_steps(
            cfg,
            k,
            graphdef,
            tx,
            state,
            first_tokens,
            eval_data.chunks[0],
            mesh,
            shardings,
            seeds=len(cfgs) if stacked else 0,
        )
        interrupt.check("compilation")
        peak = peak_flops(cfg.precision)
        for summary in summaries:
            # the train chunk may have been compiled by the memory check before the run started
            summary["compile_s"] = round(max(time.perf_counter() - compile_start, compiled_s), 3)
            summary["peak_flops"] = peak
            summary["seed_group"] = len(cfgs)
        ctx = RunContext(
            cfg=cfg,
            members=tuple(members),
            stacked=stacked,
            store=store,
            k=k,
            train_chunk=train_chunk,
            eval_step=eval_step,
            eval_data=eval_data,
            train_batch_sharding=batch_sh,
            lr_at=lr_schedule(cfg.optim, cfg.steps),
            exact_flops_per_token=summaries[0]["flops_per_token"],
            palm_per_token=summaries[0]["flops_per_token_palm"],
            peak=peak,
            max_steps=max_steps,
        )
        return _run(ctx, LoopState(state=state, step=start_step, summaries=summaries, wall_before=wall_before))
    except BaseException as e:
        if primary:
            reason = str(e) if isinstance(e, interrupt.Interrupted) else failure_reason(e)
            for i, run_dir in enumerate(run_dirs):
                write_status(run_dir, "failed", summaries[i]["steps"] if summaries else start_step, reason)
        raise
    finally:
        for i, member in enumerate(members):
            member.bar.close()
            member.metrics.close()
            member.wandb.close(summaries[i])


# The status reason quotes an exception's message up to this many characters (XLA's run to pages).
FAILURE_REASON_MAX_CHARS = 500


def failure_reason(error: BaseException) -> str:
    """`Type: message` on one line, cut to FAILURE_REASON_MAX_CHARS: the status.json reason of a
    run that raised."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= FAILURE_REASON_MAX_CHARS else text[:FAILURE_REASON_MAX_CHARS] + "..."


def cpu_threads() -> int | None:
    """The XLA CPU thread count this process trains with (None on an accelerator, whose numbers do
    not depend on it): recorded in every summary and checkpoint."""
    return xla_cpu_threads() if jax.default_backend() == "cpu" else None


def check_resume_store(run_dir: Path, extra: dict, data_sha256: str) -> None:
    """Refuse (exit 2) to resume a run's checkpoint on another token store than it was trained on:
    the config names a store (`environment`, `stdlib`, a path), not its bytes, and a store built from
    installed packages changes with them, so the rest of the run would silently read other batches
    and evaluate on other windows. A checkpoint from before the store was recorded is resumed as before."""
    recorded = extra.get("data_sha256")
    if recorded is None or recorded == data_sha256:
        return
    raise DelphiError(
        f"{run_dir}: its checkpoint was trained on token store sha256 {recorded[:16]}..., this config's store is "
        f"{data_sha256[:16]}...: resumed so, the rest of the run would read other data. Resume where that store "
        "is, or start the run over in a new directory"
    )


def check_resume_threads(run_dir: Path, extra: dict, threads: int | None) -> None:
    """Refuse (exit 2) to resume a run's checkpoint under another XLA CPU thread count than it was
    trained with: the rest of the run would not repeat its numbers (docs/design.md §4.6). A
    checkpoint from before the count was recorded is resumed as before."""
    recorded = extra.get("cpu_threads")
    if recorded is None or threads is None or int(recorded) == threads:
        return
    how = (
        "XLA_FLAGS=" + SINGLE_THREAD_XLA_FLAG
        if int(recorded) == 1
        else f"{int(recorded)} cores (e.g. `taskset -c 0-{int(recorded) - 1}`) and XLA_FLAGS without {SINGLE_THREAD_XLA_FLAG}"
    )
    raise DelphiError(
        f"{run_dir}: its checkpoint was trained with {int(recorded)} XLA CPU thread(s), this process has {threads}: "
        f"resumed so, the run would not repeat its own numbers (a float sum split over another thread count rounds "
        f"differently). Resume with {how}, or start the run over in a new directory"
    )


def _summary_header(cfg: TrainConfig, store: Any, config_sha: str, start_step: int, wall_before: float) -> dict:
    counts = count_params(cfg.model)
    tokens_per_step = cfg.tokens_per_step
    exact_flops_per_token = flops_per_token(cfg.model, cfg.data.seq_len)
    return {
        "status": "running",
        "steps": start_step,
        "tokens": start_step * tokens_per_step,
        "flops": start_step * tokens_per_step * exact_flops_per_token,
        "val_loss": None,
        "val_bpb": None,
        "params_total": counts.total,
        "params_active": counts.active,
        "params_nonembedding": counts.nonembedding,
        "flops_per_token": exact_flops_per_token,
        "flops_per_token_palm": palm_flops_per_token(cfg.model, cfg.data.seq_len),
        "wall_time_s": wall_before,
        "data_sha256": store.sha256,
        "tokenizer": store.tokenizer_kind,
        "vocab_size": store.vocab_size,
        "loss_unit": LOSS_UNIT,
        "config_sha256": config_sha,
        "precision": cfg.precision,
        "steps_per_call": steps_per_call(cfg),
        "mesh": {"data": cfg.mesh.data, "expert": cfg.mesh.expert, "model": cfg.mesh.model},
    }


# ---- the loop


def _active(ctx: RunContext, loop: LoopState) -> list[tuple[int, Member]]:
    return [(i, m) for i, m in enumerate(ctx.members) if loop.active[i]]


def _run(ctx: RunContext, loop: LoopState) -> list[dict]:
    cfg = ctx.cfg
    for _, member in _active(ctx, loop):
        member.status("running", loop.step)
    loop.run_start = loop.last_sync_time = loop.last_checkpoint_time = time.perf_counter()
    # Stop signals only set a flag (delphi.train.interrupt, for all of train_group): looked at in _stop_requested.
    while loop.step < cfg.steps:
        tokens = ctx.batches(loop.step)  # host work overlaps the previous call still running
        loop.state, out = ctx.train_chunk(loop.state, tokens)
        loop.pending.append(out)
        loop.step += ctx.k
        ctx.members[0].bar.advance(ctx.k)

        step = loop.step
        is_log = step % cfg.log_every == 0 or step == cfg.steps
        is_eval = step % cfg.eval_every == 0 or step == cfg.steps
        is_ckpt = step < cfg.steps and (
            (step % cfg.checkpoint_every == 0 and _checkpoint_due(cfg, loop))
            or (is_log and _clock_checkpoint_due(loop))
        )
        stopping = _stop_requested(ctx, loop, at_sync_point=is_log or is_eval or is_ckpt)
        if not (is_log or is_eval or is_ckpt or stopping):
            continue

        records = _sync(ctx, loop)  # blocks until the device is done
        for i, (record, first_bad) in records.items():
            if first_bad is not None:
                _diverged(ctx, loop, i, record, first_bad)
        if not any(loop.active):
            return loop.summaries
        if is_eval:
            _evaluate_into(ctx, loop, records)
        if is_log or is_eval:
            for i, member in _active(ctx, loop):
                member.log(records[i][0], show=i == 0)
        if is_ckpt or stopping:
            _checkpoint(ctx, loop)
            for _, member in _active(ctx, loop):
                member.status("running", step)
        if stopping:
            return _stopped(ctx, loop)
        loop.last_sync_step, loop.last_sync_time = step, time.perf_counter()

    _checkpoint(ctx, loop)
    return _completed(ctx, loop)


def _checkpoint_due(cfg: TrainConfig, loop: LoopState) -> bool:
    return time.perf_counter() - loop.last_checkpoint_time >= cfg.checkpoint_every_s


def _clock_checkpoint_due(loop: LoopState) -> bool:
    """CHECKPOINT_CLOCK_ENV seconds since the last save, in a single process (processes of a
    multi-host job would disagree on the clock, and a save is collective)."""
    clock = checkpoint_clock_env()
    return clock > 0 and jax.process_count() == 1 and time.perf_counter() - loop.last_checkpoint_time >= clock


def _stop_requested(ctx: RunContext, loop: LoopState, *, at_sync_point: bool) -> bool:
    """max_steps reached, or a signal. One process stops at its next call boundary; a multi-host
    job only at a sync point its processes agree on (one collective per sync point)."""
    loop.stop_signal = loop.stop_signal or interrupt.requested()
    if ctx.max_steps is not None and loop.step >= ctx.max_steps:
        return True
    if jax.process_count() == 1:
        return loop.stop_signal is not None
    return at_sync_point and _all_processes_agree(loop.stop_signal is not None)


def _sync(ctx: RunContext, loop: LoopState) -> dict[int, tuple[dict, int | None]]:
    """Pull the pending outputs: per active member, the metrics record of the last step (or of the
    first non-finite one) and that non-finite step, if any."""
    axis = 1 if ctx.stacked else 0  # outputs are ([seeds,] steps)
    host = {key: np.concatenate([np.asarray(o[key]) for o in loop.pending], axis=axis) for key in loop.pending[0]}
    loop.pending.clear()
    if not ctx.stacked:
        host = {key: v[None] for key, v in host.items()}

    now = time.perf_counter()
    loop.train_time += now - loop.last_sync_time
    tokens_per_step = ctx.cfg.tokens_per_step
    tokens_per_s = (loop.step - loop.last_sync_step) * tokens_per_step / max(now - loop.last_sync_time, 1e-9)
    records = {}
    for i, _ in _active(ctx, loop):
        bad = np.flatnonzero(~np.isfinite(host["train_loss"][i]))
        first_bad = None if bad.size == 0 else loop.last_sync_step + int(bad[0]) + 1
        index = -1 if first_bad is None else int(bad[0])
        record_step = loop.step if first_bad is None else first_bad
        record = {
            "step": record_step,
            "tokens": record_step * tokens_per_step,
            "flops": record_step * tokens_per_step * ctx.exact_flops_per_token,
            "lr": float(ctx.lr_at(record_step - 1)),
            **{key: float(v[i][index]) for key, v in host.items()},
            "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * ctx.palm_per_token / ctx.peak,
            "wall_s": loop.wall(i),
            "time": time.time(),  # epoch seconds: lets `prereg verify` prove the prediction came first
        }
        loop.summaries[i].update(
            steps=record_step, tokens=record["tokens"], flops=record["flops"], wall_time_s=loop.wall(i)
        )
        records[i] = (record, first_bad)
    return records


def _evaluate_into(ctx: RunContext, loop: LoopState, records: dict[int, tuple[dict, int | None]]) -> None:
    eval_start = time.perf_counter()
    final = len(ctx.eval_data.chunks) > 1 and loop.step == ctx.cfg.steps
    val_losses, full_losses = evaluate(ctx.eval_step, loop.state, ctx.eval_data, final=final)
    eval_s = time.perf_counter() - eval_start
    loop.eval_time += eval_s
    for i, _ in _active(ctx, loop):
        record = records[i][0]
        record["val_loss"] = val_losses[i]  # the curve: every evaluation on one set
        record["val_bpb"] = bits_per_byte(val_losses[i], ctx.eval_data.bytes_per_target[0])
        record["eval_s"] = eval_s
        if final:  # the final loss on the larger set, the number the fits use
            record["val_loss_final_set"] = full_losses[i]
            loop.summaries[i].update(final_eval_targets=len(ctx.eval_data.chunks) * ctx.eval_data.n_targets)
        full_bytes_per_target = ctx.eval_data.bytes_per_target[1 if final else 0]
        loop.summaries[i].update(
            val_loss=full_losses[i],
            val_bpb=bits_per_byte(full_losses[i], full_bytes_per_target),
            eval_bytes_per_token=full_bytes_per_target,
        )


def _checkpoint(ctx: RunContext, loop: LoopState) -> None:
    """Every active member's checkpoint, then the pruning: a kill in between leaves each member a
    checkpoint of the previous common step (see _restore_group)."""
    start = time.perf_counter()
    for i, member in _active(ctx, loop):
        state = _member(loop.state, i, ctx.stacked)
        ckpt.save_checkpoint(
            member.run_dir,
            loop.step,
            state,
            keep=None,
            extra={
                "wall_s": loop.wall(i),
                "cpu_threads": loop.summaries[i]["cpu_threads"],
                "data_sha256": ctx.store.sha256,
            },
        )
    for _, member in _active(ctx, loop):
        ckpt.prune_checkpoints(member.run_dir, member.cfg.keep_checkpoints)
    loop.last_checkpoint_time = time.perf_counter()
    loop.checkpoint_time += loop.last_checkpoint_time - start


def _diverged(ctx: RunContext, loop: LoopState, i: int, record: dict, first_bad: int) -> None:
    """The member stops counting (a group trains on; its state is no longer saved or reported)."""
    member = ctx.members[i]
    member.log(record, show=False)
    reason = f"non-finite train loss at step {first_bad}"
    member.status("diverged", first_bad, reason)
    loop.summaries[i].update(status="diverged", reason=reason)
    member.write_summary(loop.summaries[i])
    loop.active[i] = False


def _stopped(ctx: RunContext, loop: LoopState) -> list[dict]:
    why = f"signal {loop.stop_signal}" if loop.stop_signal else f"max_steps={ctx.max_steps}"
    reason = f"stopped by {why} at step {loop.step}; {RESUME_HINT}"
    for i, member in _active(ctx, loop):
        member.status("failed", loop.step, reason)
        loop.summaries[i].update(status="failed", reason=reason)
    return loop.summaries


def _completed(ctx: RunContext, loop: LoopState) -> list[dict]:
    tokens_per_s = (loop.step - loop.first_step) * ctx.cfg.tokens_per_step / max(loop.train_time, 1e-9)
    for i, member in _active(ctx, loop):
        summary = loop.summaries[i]
        summary.update(
            status="completed",
            wall_time_s=loop.wall(i),
            tokens_per_s=tokens_per_s,  # each member's own tokens over the group's training time
            # this session's split of its wall time (a resumed run: since the resume; a group: shared)
            train_s=round(loop.train_time, 3),
            eval_s=round(loop.eval_time, 3),
            checkpoint_s=round(loop.checkpoint_time, 3),
        )
        summary["mfu"] = summary["tokens_per_s"] * ctx.palm_per_token / ctx.peak
        member.write_summary(summary)
        member.status("completed", loop.step)
    return loop.summaries
