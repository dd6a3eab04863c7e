"""The training loop: `train(cfg, run_dir)` runs one config to a run directory.

    validate everything (config, store size, run dir, prereg) -> write config.yaml
    -> init or restore -> compile -> loop over chunks of steps:
         host: the next batches (a pure function of (seed, step))
         device: `steps_per_call` optimizer steps in one jitted call
         at log/eval/checkpoint steps: sync, check the loss is finite, write metrics
    -> final eval -> summary.json

Determinism: the batch at step s depends only on (data.seed, s) and the
training state lives entirely in the checkpoint, so a resumed run repeats the
uninterrupted run's numbers. Nothing is pulled to the host between sync points,
so the device never waits on Python logging.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import threading
import time
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
from delphi.train.progress import Progress, load_prediction
from delphi.train.rundir import (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    MetricsLog,
    WandbLog,
    read_status,
    wandb_mode,
    write_status,
)
from delphi.train.schedules import lr_schedule
from delphi.train.step import TrainState, bits_per_byte, make_eval_step, make_train_chunk, split_model

MAX_STEPS_PER_CALL = 16  # scan length cap: d_model 32, 1 -> 4 -> 8 -> 16 steps per call: 360, 255, 235, 230 ms/step
STEPS_PER_CALL_ENV = "DELPHI_STEPS_PER_CALL"


def config_yaml(cfg: TrainConfig) -> str:
    import yaml

    return yaml.safe_dump(train_config_to_dict(cfg), sort_keys=False)


def identity_yaml(text: str) -> str:
    """The config without its `mesh` section: what defines the run's maths. A run keeps its
    config_sha256 on any mesh and may be resumed on a different one."""
    import yaml

    data = yaml.safe_load(text) or {}
    data.pop("mesh", None)
    return yaml.safe_dump(data, sort_keys=False)


def steps_per_call(cfg: TrainConfig, cap: int | None = None) -> int:
    """Largest k <= cap dividing every sync period, so sync points fall on call boundaries."""
    if cap is None:
        cap = int(os.environ.get(STEPS_PER_CALL_ENV, MAX_STEPS_PER_CALL))
    period = math.gcd(cfg.log_every, cfg.eval_every, cfg.checkpoint_every, cfg.steps)
    return max(k for k in range(1, max(cap, 1) + 1) if period % k == 0)


def _check_run_dir(run_dir: Path, text: str, resume: bool) -> None:
    """A run dir holds one config: refuse to mix configs or silently overwrite a run."""
    if run_dir.exists() and not run_dir.is_dir():
        raise DelphiError(f"--out: {run_dir} exists and is not a directory")
    existing = run_dir / CONFIG_FILE
    if existing.is_file():
        if identity_yaml(existing.read_text()) != identity_yaml(text):
            raise DelphiError(f"--out: {run_dir} holds a run with a different config.yaml; use another directory")
        started = (run_dir / METRICS_FILE).exists() or ckpt.list_checkpoints(run_dir)
        if started and not resume:
            status = (read_status(run_dir) or {}).get("status", "unknown")
            raise DelphiError(f"--out: {run_dir} already holds a run (status {status}); pass --resume to continue it")
    elif run_dir.is_dir() and any(run_dir.iterdir()):
        raise DelphiError(f"--out: {run_dir} is a non-empty directory without a run config.yaml")


def init_model(cfg: TrainConfig) -> nnx.Module:
    from delphi.model.transformer import Transformer

    compute_dtype = jnp.bfloat16 if cfg.precision == "bf16" else jnp.float32
    return Transformer(cfg.model, rngs=nnx.Rngs(cfg.seed), compute_dtype=compute_dtype)


@contextlib.contextmanager
def _stop_on_signals(flag: dict) -> Iterator[None]:
    """SIGINT/SIGTERM set flag["signal"]; the loop checkpoints and stops at the next call boundary."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        flag["signal"] = signal.Signals(signum).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


_COMPILED: dict[tuple, tuple[Callable, Callable]] = {}
COMPILED_CACHE_SIZE = 4  # a resumed or repeated run in the same process reuses its executables


def _compiled_steps(cfg: TrainConfig, k: int, graphdef, tx, state: TrainState, tokens, eval_tokens, mesh, shardings):
    """AOT-compiled (train chunk, eval step), cached per process by everything they depend on.

    Traced under `jax.set_mesh(mesh)` so that the MoE block sees the mesh (delphi.model.moe_parallel)."""
    devices = tuple(d.id for d in mesh.devices.flat)
    key = (cfg.model, cfg.optim, cfg.steps, cfg.precision, cfg.data.seq_len, cfg.data.batch_size, k, cfg.mesh, devices)
    if key not in _COMPILED:
        state_sh, train_batch_sh, eval_batch_sh, replicated = shardings
        with jax.set_mesh(mesh):
            train_chunk = make_train_chunk(graphdef, tx, cfg.model, (state_sh, train_batch_sh, replicated))
            train_chunk = train_chunk.lower(state, tokens).compile()
            eval_step = make_eval_step(graphdef, (state_sh, eval_batch_sh, replicated)).lower(state, eval_tokens).compile()
        while len(_COMPILED) >= COMPILED_CACHE_SIZE:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = (train_chunk, eval_step)
    return _COMPILED[key]


def evaluate(eval_step: Callable, state: TrainState, batches: list[np.ndarray]) -> float:
    total = sum(eval_step(state, batch) for batch in batches)
    n_targets = sum(b.shape[0] * (b.shape[1] - 1) for b in batches)
    return float(total) / n_targets


def train(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    prereg: Path | None = None,
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
    run_dir = Path(run_dir)
    text = config_yaml(cfg)
    _check_run_dir(run_dir, text, resume)
    store = TokenStore(cfg.data.store)
    store.check_run(cfg.data.batch_size, cfg.data.seq_len, cfg.eval_tokens)
    if store.vocab_size > cfg.model.vocab_size:
        raise DelphiError(
            f"model.vocab_size: {cfg.model.vocab_size} is smaller than the store's vocabulary ({store.vocab_size})"
        )
    predicted_loss = load_prediction(prereg) if prereg is not None else None
    status = read_status(run_dir) or {}
    if resume and status.get("status") == "completed" and (run_dir / SUMMARY_FILE).is_file():
        return json.loads((run_dir / SUMMARY_FILE).read_text())

    # ---- the run directory
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / CONFIG_FILE, text)
    config_sha = sha256_bytes(identity_yaml(text).encode())
    write_status(run_dir, "pending", 0)

    model = init_model(cfg)
    graphdef, params, router_bias, other = split_model(model)
    del model
    tx = make_optimizer(cfg.model, cfg.optim, cfg.steps)
    state = TrainState(params, tx.init(params), router_bias, other)

    start_step, wall_before = 0, 0.0
    restored = ckpt.restore_latest(run_dir, state) if resume else None
    if restored is not None:
        state = restored.state  # host arrays, gathered when saved: any mesh can take them
        start_step, wall_before = restored.step, float(restored.extra.get("wall_s", 0.0))
    state_sh = sharding.state_shardings(state, mesh)
    state = sharding.place_state(state, state_sh)
    shardings = (state_sh, sharding.batch_sharding(mesh, 1), sharding.batch_sharding(mesh, 0), sharding.replicated(mesh))
    if resume and restored is None:
        for _, path in ckpt.list_checkpoints(run_dir):  # all corrupt: start over cleanly
            shutil.rmtree(path, ignore_errors=True)
    metrics = MetricsLog(run_dir, keep_through_step=start_step if restored is not None else None)

    counts = count_params(cfg.model)
    seq_len, batch_size = cfg.data.seq_len, cfg.data.batch_size
    tokens_per_step = cfg.tokens_per_step
    exact_flops_per_token = flops_per_token(cfg.model, seq_len)
    palm_per_token = palm_flops_per_token(cfg.model, seq_len)
    lr_at = lr_schedule(cfg.optim, cfg.steps)
    k = steps_per_call(cfg)
    summary: dict[str, Any] = {
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
        "flops_per_token_palm": palm_per_token,
        "wall_time_s": wall_before,
        "data_sha256": store.sha256,
        "config_sha256": config_sha,
        "precision": cfg.precision,
        "steps_per_call": k,
        "mesh": {"data": cfg.mesh.data, "expert": cfg.mesh.expert, "model": cfg.mesh.model},
    }
    wandb = WandbLog(
        wandb_mode(cfg.wandb.mode), project=cfg.wandb.project, entity=cfg.wandb.entity,
        name=cfg.name, config=train_config_to_dict(cfg), run_dir=run_dir,
    )
    bar = Progress(cfg.steps, start_step, tokens_per_step, predicted_loss, enabled=progress)
    try:
        result = _run(
            cfg, run_dir, store, graphdef, tx, state, start_step, wall_before, k, metrics, wandb, bar,
            summary, lr_at, palm_per_token, exact_flops_per_token, max_steps, mesh, shardings,
        )
    except BaseException as e:
        write_status(run_dir, "failed", summary["steps"], f"{type(e).__name__}: {e}")
        raise
    finally:
        bar.close()
        metrics.close()
        wandb.close(summary)
    return result


def _run(
    cfg: TrainConfig, run_dir: Path, store, graphdef, tx, state: TrainState, start_step: int, wall_before: float,
    k: int, metrics: MetricsLog, wandb: WandbLog, bar, summary: dict, lr_at, palm_per_token: float,
    exact_flops_per_token: float, max_steps: int | None, mesh, shardings: tuple,
) -> dict:
    seq_len, batch_size, seed = cfg.data.seq_len, cfg.data.batch_size, cfg.data.seed
    tokens_per_step = cfg.tokens_per_step

    _, train_batch_sh, eval_batch_sh, _ = shardings

    def batches(first: int) -> jax.Array:
        host = np.stack([store.train_batch(s, seed, batch_size, seq_len) for s in range(first, first + k)])
        return sharding.place(host, train_batch_sh)

    # ---- compile ahead of time so timings (and the progress bar) exclude it
    compile_start = time.perf_counter()
    eval_batches = [sharding.place(b, eval_batch_sh) for b in store.eval_batches(cfg.eval_tokens, batch_size, seq_len)]
    train_chunk, eval_step = _compiled_steps(
        cfg, k, graphdef, tx, state, batches(start_step), eval_batches[0], mesh, shardings
    )
    summary["compile_s"] = round(time.perf_counter() - compile_start, 3)
    peak = peak_flops(cfg.precision)
    summary["peak_flops"] = peak

    write_status(run_dir, "running", start_step)
    stop = {"signal": None}
    step = start_step
    last_sync_step, last_sync_time = step, time.perf_counter()
    run_start = last_sync_time
    train_time = 0.0  # wall time inside training calls since start (excludes eval, checkpoints)
    pending: list[dict] = []  # device outputs of calls since the last sync point

    def wall() -> float:
        return wall_before + time.perf_counter() - run_start

    def sync() -> tuple[dict, int | None]:
        """Pull the pending outputs; return the last step's stats and the first non-finite step."""
        host = {key: np.concatenate([np.asarray(o[key]) for o in pending]) for key in pending[0]}
        bad = np.flatnonzero(~np.isfinite(host["train_loss"]))
        first_bad = None if bad.size == 0 else last_sync_step + int(bad[0]) + 1
        pending.clear()
        index = -1 if first_bad is None else int(bad[0])
        return {key: float(v[index]) for key, v in host.items()}, first_bad

    with _stop_on_signals(stop):
        while step < cfg.steps:
            tokens = batches(step)  # host work overlaps the previous call still running
            t0 = time.perf_counter()
            state, out = train_chunk(state, tokens)
            pending.append(out)
            step += k
            bar.advance(k)
            is_log = step % cfg.log_every == 0 or step == cfg.steps
            is_eval = step % cfg.eval_every == 0 or step == cfg.steps
            is_ckpt = step % cfg.checkpoint_every == 0 and step < cfg.steps
            stopping = stop["signal"] is not None or (max_steps is not None and step >= max_steps)
            if not (is_log or is_eval or is_ckpt or stopping):
                continue

            stats, first_bad = sync()  # blocks until the device is done
            now = time.perf_counter()
            train_time += now - last_sync_time
            interval_tokens = (step - last_sync_step) * tokens_per_step
            tokens_per_s = interval_tokens / max(now - last_sync_time, 1e-9)
            record_step = step if first_bad is None else first_bad
            record = {
                "step": record_step,
                "tokens": record_step * tokens_per_step,
                "flops": record_step * tokens_per_step * exact_flops_per_token,
                "lr": float(lr_at(record_step - 1)),
                **stats,
                "tokens_per_s": tokens_per_s,
                "mfu": tokens_per_s * palm_per_token / peak,
                "wall_s": wall(),
                "time": time.time(),  # epoch seconds: lets `prereg verify` prove the prediction came first
            }
            summary.update(steps=record_step, tokens=record["tokens"], flops=record["flops"], wall_time_s=wall())
            if first_bad is not None:
                metrics.write(record)
                wandb.write(record)
                reason = f"non-finite train loss at step {first_bad}"
                write_status(run_dir, "diverged", first_bad, reason)
                summary.update(status="diverged", reason=reason)
                atomic_write_json(run_dir / SUMMARY_FILE, summary)
                return summary
            if is_eval:
                eval_start = time.perf_counter()
                val_loss = evaluate(eval_step, state, eval_batches)
                record["val_loss"] = val_loss
                record["val_bpb"] = bits_per_byte(val_loss)
                record["eval_s"] = time.perf_counter() - eval_start
                summary.update(val_loss=val_loss, val_bpb=record["val_bpb"])
            if is_log or is_eval:
                metrics.write(record)
                wandb.write(record)
                bar.show(record)
            if is_ckpt or stopping:
                ckpt.save_checkpoint(run_dir, step, state, extra={"wall_s": wall()}, keep=cfg.keep_checkpoints)
                write_status(run_dir, "running", step)
            if stopping:
                why = f"signal {stop['signal']}" if stop["signal"] else f"max_steps={max_steps}"
                reason = f"stopped by {why} at step {step}; continue with --resume"
                write_status(run_dir, "failed", step, reason)
                summary.update(status="failed", reason=reason)
                return summary
            last_sync_step, last_sync_time = step, time.perf_counter()

    ckpt.save_checkpoint(run_dir, step, state, extra={"wall_s": wall()}, keep=cfg.keep_checkpoints)
    summary.update(
        status="completed",
        wall_time_s=wall(),
        tokens_per_s=(step - start_step) * tokens_per_step / max(train_time, 1e-9),
    )
    summary["mfu"] = summary["tokens_per_s"] * palm_per_token / peak
    atomic_write_json(run_dir / SUMMARY_FILE, summary)
    write_status(run_dir, "completed", step)
    return summary
