"""The training loop: `train(cfg, run_dir)` runs one config to a run directory.

    validate everything (config, model size, store size, run dir) -> lock the run dir
    -> write config.yaml -> init or restore -> compile -> loop over chunks of steps:
         host: the next batches (a pure function of (seed, step))
         device: `steps_per_call` optimizer steps in one jitted call
         at log/eval/checkpoint steps: sync, check the loss is finite, write metrics
    -> final checkpoint -> summary.json

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
import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from delphi.errors import DelphiError
from delphi.io import atomic_write_json, atomic_write_text, sha256_bytes
from delphi.model.flops import count_params, flops_per_token, palm_flops_per_token
from delphi.train import checkpoint as ckpt
from delphi.train import sharding
from delphi.train.config import TrainConfig, train_config_to_dict
from delphi.train.optim import make_optimizer
from delphi.train.peak import peak_flops
from delphi.train.progress import PredictedLoss, Progress
from delphi.train.rundir import (
    CONFIG_FILE,
    LOCK_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    MetricsLog,
    RunLock,
    WandbLog,
    read_status,
    wandb_mode,
    warn,
    write_status,
)
from delphi.train.schedules import lr_schedule
from delphi.train.step import TrainState, bits_per_byte, eval_blocks, make_eval_step, make_train_chunk, split_model

MAX_STEPS_PER_CALL = 16  # scan length cap: d_model 32, 1 -> 4 -> 8 -> 16 steps per call: 360, 255, 235, 230 ms/step
STEPS_PER_CALL_ENV = "DELPHI_STEPS_PER_CALL"
MATHS_FREE_KEYS = ("mesh", "eval_batch_size")  # config keys left out of config_sha256


def config_yaml(cfg: TrainConfig) -> str:
    import yaml

    return yaml.safe_dump(train_config_to_dict(cfg), sort_keys=False)


def identity_yaml(text: str) -> str:
    """The config without the keys that only say how the maths is laid out (MATHS_FREE_KEYS): a
    run keeps its config_sha256 on any mesh or eval batch and may be resumed on a different one."""
    import yaml

    data = yaml.safe_load(text) or {}
    for key in MATHS_FREE_KEYS:
        data.pop(key, None)
    return yaml.safe_dump(data, sort_keys=False)


def steps_per_call(cfg: TrainConfig, cap: int | None = None) -> int:
    """Largest k <= cap dividing every sync period, so sync points fall on call boundaries."""
    if cap is None:
        cap = int(os.environ.get(STEPS_PER_CALL_ENV, MAX_STEPS_PER_CALL))
    period = math.gcd(cfg.log_every, cfg.eval_every, cfg.checkpoint_every, cfg.steps)
    return max(k for k in range(1, max(cap, 1) + 1) if period % k == 0)


def _existing_identity(path: Path) -> str:
    """The identity of a run dir's config.yaml; a file that is not a YAML mapping is a clear error."""
    import yaml

    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        problem = getattr(e, "problem", None) or type(e).__name__
        raise DelphiError(
            f"{path}: the run's config.yaml is not valid YAML ({problem}); restore it or use another --out"
        ) from None
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


def init_model(cfg: TrainConfig, mesh: jax.sharding.Mesh | None = None) -> nnx.Module:
    from delphi.model.transformer import Transformer

    compute_dtype = jnp.bfloat16 if cfg.precision == "bf16" else jnp.float32
    return Transformer(cfg.model, rngs=nnx.Rngs(cfg.seed), compute_dtype=compute_dtype, mesh=mesh)


_COMPILED: dict[tuple, tuple[Callable, Callable]] = {}
COMPILED_CACHE_SIZE = 4  # a resumed or repeated run in the same process reuses its executables


def _compiled_steps(cfg: TrainConfig, k: int, graphdef, tx, state: TrainState, tokens, eval_set, mesh, shardings):
    """AOT-compiled (train chunk, eval step), cached per process by everything they depend on.

    Traced under `jax.set_mesh(mesh)`; the model's MoE block was given the mesh when it was built
    (`init_model(cfg, mesh)`, delphi.model.moe_parallel)."""
    devices = tuple(d.id for d in mesh.devices.flat)
    eval_shape = eval_set[0].shape
    key = (cfg.model, cfg.optim, cfg.steps, cfg.precision, cfg.data.seq_len, cfg.data.batch_size, k, eval_shape, cfg.mesh, devices)
    if key not in _COMPILED:
        state_sh, train_batch_sh, eval_batch_sh, replicated = shardings
        with jax.set_mesh(mesh):
            train_chunk = make_train_chunk(graphdef, tx, cfg.model, (state_sh, train_batch_sh, replicated))
            train_chunk = train_chunk.lower(state, tokens).compile()
            eval_step = make_eval_step(graphdef, (state_sh, eval_batch_sh, replicated)).lower(state, *eval_set).compile()
        while len(_COMPILED) >= COMPILED_CACHE_SIZE:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = (train_chunk, eval_step)
    return _COMPILED[key]


@dataclass(frozen=True)
class EvalSet:
    """The validation windows on the device as whole eval batches (`delphi.train.step.eval_blocks`)."""

    tokens: jax.Array  # (batches, eval batch, seq+1)
    weights: jax.Array  # (batches, eval batch): 1 a window, 0 padding
    n_targets: int  # next-token targets of the real windows


def eval_set(cfg: TrainConfig, store: Any, batch_sharding: Any) -> EvalSet:
    """The windows of `TokenStore.eval_set` (how many: set by the training batch, so the val loss
    does not depend on the eval batch) in batches of `cfg.eval_batch_sequences`."""
    windows = store.eval_set(cfg.eval_tokens, cfg.data.batch_size, cfg.data.seq_len)
    tokens, weights = eval_blocks(windows, cfg.eval_batch_sequences(len(windows)))
    n_targets = windows.shape[0] * (windows.shape[1] - 1)
    return EvalSet(sharding.place(tokens, batch_sharding), sharding.place(weights, batch_sharding), n_targets)


def evaluate(eval_step: Callable, state: TrainState, data: EvalSet) -> float:
    """Mean next-token loss (nats) over the validation windows: one device call."""
    return float(np.sum(np.asarray(eval_step(state, data.tokens, data.weights), np.float64))) / data.n_targets


def _train_batches(cfg: TrainConfig, store: Any, first: int, k: int, batch_sharding: Any) -> jax.Array:
    """Steps first .. first+k-1 as one (k, batch, seq+1) global array."""
    data = cfg.data
    host = np.stack([store.train_batch(s, data.seed, data.batch_size, data.seq_len) for s in range(first, first + k)])
    return sharding.place(host, batch_sharding)


def _all_processes_agree(flag: bool) -> bool:
    """True if any process of a multi-host job says so (a signal may reach them at different times)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray([flag]))))


# ---- what the loop reads (RunContext) and what it changes (LoopState)


@dataclass(frozen=True)
class RunContext:
    """Everything fixed for the duration of the loop."""

    cfg: TrainConfig
    run_dir: Path
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
    metrics: MetricsLog
    wandb: WandbLog
    bar: Progress
    primary: bool  # process 0: the one that writes the run directory

    def batches(self, first: int) -> jax.Array:
        return _train_batches(self.cfg, self.store, first, self.k, self.train_batch_sharding)

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


@dataclass
class LoopState:
    """What the training loop mutates."""

    state: TrainState
    step: int
    summary: dict
    wall_before: float  # wall seconds of earlier sessions of this run (from the checkpoint)
    run_start: float = field(default_factory=time.perf_counter)
    last_sync_step: int = 0
    last_sync_time: float = 0.0
    train_time: float = 0.0  # wall time inside training calls since start (excludes eval, checkpoints)
    eval_time: float = 0.0  # wall time of evaluations since start
    checkpoint_time: float = 0.0  # wall time of checkpoint saves since start
    pending: list[dict] = field(default_factory=list)  # device outputs of calls since the last sync point
    stop_signal: str | None = None
    first_step: int = 0  # the step this session started from

    def __post_init__(self) -> None:
        self.first_step = self.last_sync_step = self.step
        self.last_sync_time = self.run_start

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.run_start


@contextlib.contextmanager
def _stop_on_signals(loop: LoopState) -> Iterator[None]:
    """SIGINT/SIGTERM set loop.stop_signal; the loop checkpoints and stops at the next call boundary
    (multi-host: at the next sync point, once the processes agree)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        loop.stop_signal = signal.Signals(signum).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ---- train(): validate, set up, run


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
    from delphi.data.loader import TokenStore

    # ---- validate everything before writing anything
    cfg.validate()
    sharding.initialize_distributed(cfg.mesh)  # multi-host: before any other JAX call
    mesh = sharding.make_mesh(cfg.mesh)
    sharding.check_fits_in_memory(cfg)
    run_dir = Path(run_dir)
    text = config_yaml(cfg)
    _check_run_dir(run_dir, text, resume)
    store = TokenStore(cfg.data.store)
    store.check_run(cfg.data.batch_size, cfg.data.seq_len, cfg.eval_tokens)
    if store.vocab_size > cfg.model.vocab_size:
        raise DelphiError(
            f"model.vocab_size: {cfg.model.vocab_size} is smaller than the store's vocabulary ({store.vocab_size})"
        )
    status = read_status(run_dir) or {}
    if resume and status.get("status") == "completed" and (run_dir / SUMMARY_FILE).is_file():
        return json.loads((run_dir / SUMMARY_FILE).read_text())

    primary = jax.process_index() == 0
    ckpt.barrier("delphi_train_validated")  # every process has read the run dir before process 0 writes it
    with RunLock(run_dir) if primary else contextlib.nullcontext():
        if primary:
            _check_run_dir(run_dir, text, resume)  # again, now that no other trainer can write it
        return _train_locked(cfg, run_dir, text, mesh, store, resume, predicted_loss, progress, max_steps, primary)


def _train_locked(
    cfg: TrainConfig, run_dir: Path, text: str, mesh: jax.sharding.Mesh, store: Any, resume: bool,
    predicted_loss: PredictedLoss | None, progress: bool, max_steps: int | None, primary: bool,
) -> dict:
    # ---- the run directory (process 0)
    if primary:
        atomic_write_text(run_dir / CONFIG_FILE, text)
        write_status(run_dir, "pending", 0)
    config_sha = sha256_bytes(identity_yaml(text).encode())

    # ---- the state: fresh, or restored straight into this mesh's shardings
    model = init_model(cfg, mesh)
    graphdef, params, router_bias, other = split_model(model)
    del model
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    state = TrainState(params, tx.init(params), router_bias, other)
    state_sh = sharding.state_shardings(state, mesh)
    restored = None
    if resume:
        found = ckpt.restore_latest(run_dir, state, state_sh)
        note = found.message(run_dir)
        if note and primary:
            warn(note)
        ckpt.remove_checkpoints([path for path, _ in found.corrupt])
        restored = found.restored
    if restored is not None:
        state, start_step, wall_before = restored.state, restored.step, float(restored.extra.get("wall_s", 0.0))
    else:
        state, start_step, wall_before = sharding.place_state(state, state_sh), 0, 0.0
    batch_sh = sharding.batch_sharding(mesh, 1)  # (steps or eval batches, batch, seq+1)
    shardings = (state_sh, batch_sh, batch_sh, sharding.replicated(mesh))

    summary = _summary_header(cfg, store, config_sha, start_step, wall_before)
    metrics = MetricsLog(run_dir, keep_through_step=start_step if restored is not None else None, enabled=primary)
    wandb = WandbLog(
        wandb_mode(cfg.wandb.mode) if primary else "disabled", project=cfg.wandb.project, entity=cfg.wandb.entity,
        name=cfg.name, config=train_config_to_dict(cfg), run_dir=run_dir,
    )
    bar = Progress(cfg.steps, start_step, cfg.tokens_per_step, predicted_loss, enabled=progress and primary)
    try:
        # ---- compile ahead of time so timings (and the progress bar) exclude it
        compile_start = time.perf_counter()
        k = summary["steps_per_call"]
        _, train_batch_sh, eval_batch_sh, _ = shardings
        eval_data = eval_set(cfg, store, eval_batch_sh)
        first_tokens = _train_batches(cfg, store, start_step, k, train_batch_sh)
        train_chunk, eval_step = _compiled_steps(
            cfg, k, graphdef, tx, state, first_tokens, (eval_data.tokens, eval_data.weights), mesh, shardings
        )
        summary["compile_s"] = round(time.perf_counter() - compile_start, 3)
        summary["peak_flops"] = peak = peak_flops(cfg.precision)
        ctx = RunContext(
            cfg=cfg, run_dir=run_dir, store=store, k=k, train_chunk=train_chunk, eval_step=eval_step,
            eval_data=eval_data, train_batch_sharding=train_batch_sh, lr_at=lr_schedule(cfg.optim, cfg.steps),
            exact_flops_per_token=summary["flops_per_token"], palm_per_token=summary["flops_per_token_palm"],
            peak=peak, max_steps=max_steps, metrics=metrics, wandb=wandb, bar=bar, primary=primary,
        )
        return _run(ctx, LoopState(state=state, step=start_step, summary=summary, wall_before=wall_before))
    except BaseException as e:
        if primary:
            write_status(run_dir, "failed", summary["steps"], f"{type(e).__name__}: {e}")
        raise
    finally:
        bar.close()
        metrics.close()
        wandb.close(summary)


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
        "config_sha256": config_sha,
        "precision": cfg.precision,
        "steps_per_call": steps_per_call(cfg),
        "mesh": {"data": cfg.mesh.data, "expert": cfg.mesh.expert, "model": cfg.mesh.model},
    }


# ---- the loop


def _run(ctx: RunContext, loop: LoopState) -> dict:
    cfg = ctx.cfg
    ctx.status("running", loop.step)
    loop.run_start = loop.last_sync_time = time.perf_counter()
    with _stop_on_signals(loop):
        while loop.step < cfg.steps:
            tokens = ctx.batches(loop.step)  # host work overlaps the previous call still running
            loop.state, out = ctx.train_chunk(loop.state, tokens)
            loop.pending.append(out)
            loop.step += ctx.k
            ctx.bar.advance(ctx.k)

            step = loop.step
            is_log = step % cfg.log_every == 0 or step == cfg.steps
            is_eval = step % cfg.eval_every == 0 or step == cfg.steps
            is_ckpt = step % cfg.checkpoint_every == 0 and step < cfg.steps
            stopping = _stop_requested(ctx, loop, at_sync_point=is_log or is_eval or is_ckpt)
            if not (is_log or is_eval or is_ckpt or stopping):
                continue

            record, first_bad = _sync(ctx, loop)  # blocks until the device is done
            if first_bad is not None:
                return _diverged(ctx, loop, record, first_bad)
            if is_eval:
                _evaluate_into(ctx, loop, record)
            if is_log or is_eval:
                ctx.log(record)
            if is_ckpt or stopping:
                _checkpoint(ctx, loop)
                ctx.status("running", step)
            if stopping:
                return _stopped(ctx, loop)
            loop.last_sync_step, loop.last_sync_time = step, time.perf_counter()

    _checkpoint(ctx, loop)
    return _completed(ctx, loop)


def _stop_requested(ctx: RunContext, loop: LoopState, *, at_sync_point: bool) -> bool:
    """max_steps reached, or a signal. One process stops at its next call boundary; a multi-host
    job only at a sync point its processes agree on (one collective per sync point)."""
    if ctx.max_steps is not None and loop.step >= ctx.max_steps:
        return True
    if jax.process_count() == 1:
        return loop.stop_signal is not None
    return at_sync_point and _all_processes_agree(loop.stop_signal is not None)


def _sync(ctx: RunContext, loop: LoopState) -> tuple[dict, int | None]:
    """Pull the pending outputs: the metrics record of the last step (or of the first non-finite
    one) and that non-finite step, if any."""
    host = {key: np.concatenate([np.asarray(o[key]) for o in loop.pending]) for key in loop.pending[0]}
    loop.pending.clear()
    bad = np.flatnonzero(~np.isfinite(host["train_loss"]))
    first_bad = None if bad.size == 0 else loop.last_sync_step + int(bad[0]) + 1
    index = -1 if first_bad is None else int(bad[0])
    stats = {key: float(v[index]) for key, v in host.items()}

    now = time.perf_counter()
    loop.train_time += now - loop.last_sync_time
    tokens_per_step = ctx.cfg.tokens_per_step
    tokens_per_s = (loop.step - loop.last_sync_step) * tokens_per_step / max(now - loop.last_sync_time, 1e-9)
    record_step = loop.step if first_bad is None else first_bad
    record = {
        "step": record_step,
        "tokens": record_step * tokens_per_step,
        "flops": record_step * tokens_per_step * ctx.exact_flops_per_token,
        "lr": float(ctx.lr_at(record_step - 1)),
        **stats,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * ctx.palm_per_token / ctx.peak,
        "wall_s": loop.wall(),
        "time": time.time(),  # epoch seconds: lets `prereg verify` prove the prediction came first
    }
    loop.summary.update(steps=record_step, tokens=record["tokens"], flops=record["flops"], wall_time_s=loop.wall())
    return record, first_bad


def _evaluate_into(ctx: RunContext, loop: LoopState, record: dict) -> None:
    eval_start = time.perf_counter()
    val_loss = evaluate(ctx.eval_step, loop.state, ctx.eval_data)
    record["val_loss"] = val_loss
    record["val_bpb"] = bits_per_byte(val_loss)
    record["eval_s"] = time.perf_counter() - eval_start
    loop.eval_time += record["eval_s"]
    loop.summary.update(val_loss=val_loss, val_bpb=record["val_bpb"])


def _checkpoint(ctx: RunContext, loop: LoopState) -> None:
    start = time.perf_counter()
    ckpt.save_checkpoint(ctx.run_dir, loop.step, loop.state, extra={"wall_s": loop.wall()}, keep=ctx.cfg.keep_checkpoints)
    loop.checkpoint_time += time.perf_counter() - start


def _diverged(ctx: RunContext, loop: LoopState, record: dict, first_bad: int) -> dict:
    ctx.log(record, show=False)
    reason = f"non-finite train loss at step {first_bad}"
    ctx.status("diverged", first_bad, reason)
    loop.summary.update(status="diverged", reason=reason)
    ctx.write_summary(loop.summary)
    return loop.summary


def _stopped(ctx: RunContext, loop: LoopState) -> dict:
    why = f"signal {loop.stop_signal}" if loop.stop_signal else f"max_steps={ctx.max_steps}"
    reason = f"stopped by {why} at step {loop.step}; continue with --resume"
    ctx.status("failed", loop.step, reason)
    loop.summary.update(status="failed", reason=reason)
    return loop.summary


def _completed(ctx: RunContext, loop: LoopState) -> dict:
    summary = loop.summary
    summary.update(
        status="completed",
        wall_time_s=loop.wall(),
        tokens_per_s=(loop.step - loop.first_step) * ctx.cfg.tokens_per_step / max(loop.train_time, 1e-9),
        # this session's split of its wall time (a resumed run: since the resume)
        train_s=round(loop.train_time, 3),
        eval_s=round(loop.eval_time, 3),
        checkpoint_s=round(loop.checkpoint_time, 3),
    )
    summary["mfu"] = summary["tokens_per_s"] * ctx.palm_per_token / ctx.peak
    ctx.write_summary(summary)
    ctx.status("completed", loop.step)
    return summary
