"""A run's seeds (hero.seeds): their configs and run dirs, and training them side by side, one
process each, supervised until every seed has ended or a signal stops them all."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from delphi.errors import CheckFailed
from delphi.io import atomic_write_yaml
from delphi.prereg_format import predicted_loss_curve
from delphi.signals import PARENT_PID_ENV, stop_signals_raise
from delphi.study.state import say
from delphi.train.config import load_train_config, train_config_to_dict
from delphi.train.environment import single_thread_xla_flags
from delphi.train.rundir import CONFIG_FILE, SUMMARY_FILE, read_metrics
from delphi.train.trainer import train

SEED_PROGRESS_EVERY_S = 60.0  # how often a run's side-by-side seeds report their progress
ETA_RECORDS = 8  # metrics records the ETA's rate is measured over (the newest)
SEED_STOP_WAIT_S = 120.0  # a stopping seed saves a checkpoint first; past this it is killed


def seed_runs(config: Path, run: Path, seeds: tuple[int, ...]) -> list[tuple[Path, Path]]:
    """(config, run dir) of each of a run's seeds (hero.seeds): the sized config's own seed keeps its
    paths; every other seed gets a copy of the config with seed and data.seed set to it, at
    NAME_s<seed>.yaml, trained into RUN_s<seed>. No seeds: the one run."""
    if not seeds:
        return [(config, run)]
    base = train_config_to_dict(load_train_config(config))
    out = []
    for seed in seeds:
        if seed == base["seed"]:
            out.append((config, run))
            continue
        other = config.with_name(f"{config.stem}_s{seed}.yaml")
        doc = base | {
            "seed": seed,
            "data": base["data"] | {"seed": seed},
            "name": f"{base.get('name') or run.name}_s{seed}",
        }
        if not other.is_file():
            atomic_write_yaml(other, doc)
        out.append((other, run.with_name(f"{run.name}_s{seed}")))
    return out


def finished(summary: dict, what: str) -> dict:
    """A run that ended (completed, or diverged: a diverged hero is a failed prediction, checked as
    such); one stopped before its end (a signal) is not a stage done: nothing after it may run."""
    if summary.get("status") not in ("completed", "diverged"):
        raise CheckFailed(
            f"{what} stopped before its end ({summary.get('reason') or summary.get('status')}); nothing "
            "after it ran or was checked. Run the same `delphi study` command to resume it."
        )
    return summary


def seed_progress(run: Path, steps: int) -> str:
    """One seed's progress from its metrics log: step, train loss, tokens/s and the time left."""
    rows = [r for r in read_metrics(run) if isinstance(r.get("step"), int)]
    if not rows:
        return f"{run.name} starting"
    last = rows[-1]
    # The rate over the newest records, in the run's own training time (wall_s): a resumed run's
    # clock time since its first record counts the hours it stood stopped.
    rate = [r for r in rows if isinstance(r.get("wall_s"), (int, float))][-ETA_RECORDS:]
    steps_per_s = (
        (rate[-1]["step"] - rate[0]["step"]) / (rate[-1]["wall_s"] - rate[0]["wall_s"])
        if len(rate) > 1 and rate[-1]["wall_s"] > rate[0]["wall_s"]
        else None
    )
    eta = f", ETA {(steps - last['step']) / steps_per_s / 60:.0f} min" if steps_per_s else ""
    loss = last.get("train_loss")
    return (
        f"{run.name} step {last['step']}/{steps}"
        + (f", loss {loss:.4f}" if isinstance(loss, float) else "")
        + (f", {last['tokens_per_s']:,.0f} tok/s" if isinstance(last.get("tokens_per_s"), float) else "")
        + eta
    )


def _stop_all(procs: list) -> None:
    """Stop every still-running seed process (SIGTERM: it checkpoints and exits), waiting for each."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=SEED_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            p.kill()


def train_seeds(runs: list[tuple[Path, Path]], seal: Path, what: str) -> list[dict]:
    """Train one run's seeds side by side, one process each (`delphi train`, single-threaded XLA when
    the seeds share the cores), and return their summaries; one seed trains in this process. Each
    resumes where it stopped; a signal stops them all (their checkpoints stay)."""
    if len(runs) == 1:
        ((config, run),) = runs
        return [
            finished(
                train(
                    load_train_config(config),
                    run,
                    resume=(run / CONFIG_FILE).exists(),
                    predicted_loss=predicted_loss_curve(seal),
                ),
                what,
            )
        ]

    env = dict(os.environ) | {PARENT_PID_ENV: str(os.getpid())}  # each trainer stops when this process dies
    if len(runs) >= (os.cpu_count() or 1):
        env["XLA_FLAGS"] = single_thread_xla_flags(env.get("XLA_FLAGS"))
    procs: list[subprocess.Popen] = []
    # SIGTERM or SIGHUP to the study must reach its seeds' processes, not orphan them: on the way out
    # each is stopped at a checkpoint (`_stop_all`), and the same command resumes them.
    with (
        stop_signals_raise(f"{what}: its seeds stopped at a checkpoint; rerun the study to resume"),
        contextlib.ExitStack() as stack,
    ):
        stack.callback(_stop_all, procs)
        for config, run in runs:
            log = run.with_name(f"{run.name}.log")
            cmd = [
                sys.executable,
                "-m",
                "delphi.cli",
                "train",
                str(config),
                "--out",
                str(run),
                "--prereg",
                str(seal),
                "--no-progress",
            ] + (["--resume"] if (run / CONFIG_FILE).exists() else [])
            with open(log, "a") as handle:
                procs.append(subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env))
            say(f"{what}: {run.name} training (log {log})")
        while any(p.poll() is None for p in procs):
            time.sleep(SEED_PROGRESS_EVERY_S if all(p.poll() is None for p in procs) else 1.0)
            say(f"{what}: " + "; ".join(seed_progress(run, load_train_config(config).steps) for config, run in runs))
        codes = [p.wait() for p in procs]
    summaries = []
    for (_config, run), code in zip(runs, codes):
        summary_path = run / SUMMARY_FILE
        if not summary_path.is_file():
            raise CheckFailed(
                f"{what}: {run} ended with exit {code} and no summary (log {run.with_name(run.name + '.log')}); "
                "run the same `delphi study` command to resume it"
            )
        summaries.append(finished(json.loads(summary_path.read_text()), f"{what} ({run.name})"))
    return summaries
