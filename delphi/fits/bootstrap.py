"""Bootstrap over runs: seeded resamples, refits in parallel processes, percentile intervals.

Resampling unit: a run. When the table holds several rows per `run_id`
(intermediate checkpoints of one run), whole runs are resampled (a clustered
bootstrap), because checkpoints of one run share its noise. Otherwise rows
are resampled. `strata` (e.g. "budget" for isoFLOP fits) resamples within each
stratum, so every budget keeps its size and an isoFLOP design stays an
isoFLOP design.

With seeds (rows sharing a `cell_id`) `resample` names what a draw varies (RESAMPLE_MODES):
- "cells": cells with replacement within each stratum, then seeds within each drawn cell;
- "seeds": every cell kept, its own seeds drawn with replacement.
Which one moves a fit as much as a second ladder of the same design does was measured on the
default study's ladders (`benchmarks/default_study/bootstrap_ratio.py`, `bootstrap_ratio.csv`): the
sd of the 3x hero's predicted loss across 10 ladders over the bootstrap's (its 90% percentile
half-width / 1.645, the width a seal uses) was 0.87 for "cells" (1.18 on study seeds 0-4, which chose
it; 0.61 on seeds 5-9) and 3.3 for "seeds". Drawing k seeds from k gives a cell mean (k - 1) / k of its
sampling variance, but that is not the whole gap: seed noise of the right size (pooled, rescaled
residuals) still gave 1.9, because the two seeds of one ladder agree with each other better than two
ladders do (F = 3.7 over 13 ladders; the cause is not identified: docs/notebook.md §8.24). The
cells resample, which also varies the sizes each parabola sees, is as wide as that spread; its draws
have heavy tails (plain sd ratio 0.57), which a percentile interval ignores, and with 5 sizes per
budget about a third of them leave a budget fewer than 3 distinct sizes (no parabola): those are
counted in `bootstrap_failed`, not refitted. Every fit uses it
(for the isoFLOP fits: delphi.fits.isoflop.ISOFLOP_RESAMPLE).

All resample indices are drawn up front from one `numpy.random.default_rng(seed)`,
so the draws do not depend on the number of worker processes.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import pandas as pd

from delphi.errors import DelphiError
from delphi.signals import die_with_parent, held, stop_signals_raise
from delphi.train.memory import host_available_bytes

Refit = Callable[[pd.DataFrame], dict[str, float]]
# Below this many refits the process start-up costs more than it saves.
MIN_REFITS_PER_WORKER = 25
# The fewest replicates that make a 90% percentile interval (the CLI refuses 1..19; 0 is no bootstrap
# and no interval). Each 5% tail must hold at least one draw: below 20 draws the "interval" is just
# the extreme draws, and one draw gives a zero-width interval that need not contain the estimate.
MIN_BOOTSTRAP_FOR_INTERVAL = 20
# Memory a bootstrap holds per replicate, besides its resample indices (8 bytes per row, drawn up
# front, and a second copy pickled into a worker): one refit's parameter dict (~10 floats, ~650 bytes)
# and its entries in the per-parameter sample lists. A generous round number: an upper bound.
BOOTSTRAP_RESULT_BYTES = 1024
RESAMPLE_UNITS = {
    "cells": "seeds within cells, then cells",
    "seeds": "seeds within cells (design fixed)",
}
RESAMPLE_MODES = tuple(RESAMPLE_UNITS)


def bootstrap_memory_bytes(n: int, rows: int) -> int:
    """What `bootstrap` holds at its peak for `n` replicates of a `rows`-row table: the resample
    indices twice (8-byte integers, the parent's and a worker's pickled copy) plus
    BOOTSTRAP_RESULT_BYTES per replicate. The refits' own memory is transient and left out."""
    return int(n) * (2 * 8 * int(rows) + BOOTSTRAP_RESULT_BYTES)


def check_bootstrap_memory(n: int, rows: int, flag: str = "bootstrap") -> None:
    """DelphiError (exit 2) when `n` replicates would need more memory than is available now
    (MemAvailable), before any index is drawn."""
    need = bootstrap_memory_bytes(n, rows)
    available = host_available_bytes()
    if available is not None and need > available:
        gib = 1024**3
        raise DelphiError(
            f"{flag} {n}: about {need / gib:.3g} GiB for {n:,} replicates of {rows:,} rows "
            f"({2 * 8 * rows + BOOTSTRAP_RESULT_BYTES:,} bytes each), more than the {available / gib:.3g} GiB available; "
            f"use at most {max(available // (2 * 8 * rows + BOOTSTRAP_RESULT_BYTES), 0):,}"
        )


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the system has one, else os.cpu_count())."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _worker_init(parent: int) -> None:
    """In each bootstrap worker: Ctrl-C is the parent's to handle (it terminates the pool), SIGTERM
    and SIGHUP end the worker (the parent's handlers may have been inherited by a fork), and on
    Linux the worker is sent SIGTERM if its parent dies, however it dies (even SIGKILL)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    if not die_with_parent(parent):  # the parent died before the death signal was armed
        os._exit(1)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """End a pool's worker processes now (SIGTERM, then SIGKILL) and wait for them: an interrupted
    bootstrap leaves no process behind."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for proc in processes:
        try:
            proc.terminate()
        except (OSError, ValueError, AttributeError):
            pass
    for proc in processes:
        try:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        except (OSError, ValueError, AssertionError, AttributeError):
            pass
    # concurrent.futures' exit hook wakes every pool's manager thread through a pipe; for a pool torn
    # down here that pipe can be half-closed by then, and CPython 3.11 prints an "Exception ignored ...
    # Bad file descriptor" traceback (the SIGINT, SIGTERM and SIGHUP tests saw it). Let the manager
    # thread finish, then take the pool off the hook's list: there is nothing left for it to wake.
    # (shutdown() forgets the thread, so it is taken first.)
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    if manager is not None:
        manager.join(timeout=5)
        import concurrent.futures.process as pool_module

        getattr(pool_module, "_threads_wakeups", {}).pop(manager, None)


def resample_indices(
    table: pd.DataFrame, n: int, seed: int, strata: str | None = None, resample: str = "cells"
) -> list[np.ndarray]:
    """`n` bootstrap resamples of `table`'s row positions (`resample`: the module says which)."""
    rng = np.random.default_rng(seed)
    if _hierarchical(table):
        if resample == "seeds":
            return _seed_indices(table, n, rng)
        return _hierarchical_indices(table, n, rng, strata or ("budget" if "budget" in table else None))
    clustered = "run_id" in table and table["run_id"].duplicated().any()
    unit = table["run_id"].to_numpy() if clustered else np.arange(len(table))
    groups = table[strata].to_numpy() if strata and strata in table else np.zeros(len(table))
    # For each stratum, the list of units and the row positions of each unit.
    plan = []
    for g in pd.unique(groups):
        in_group = np.flatnonzero(groups == g)
        units = pd.unique(unit[in_group])
        rows = [in_group[unit[in_group] == u] for u in units]
        plan.append(rows)
    out = []
    for _ in range(n):
        parts = []
        for rows in plan:
            pick = rng.integers(0, len(rows), size=len(rows))
            parts.extend(rows[i] for i in pick)
        out.append(np.concatenate(parts))
    return out


def _hierarchical(table: pd.DataFrame) -> bool:
    """Seeds of one configuration share a `cell_id`: the table has replicates."""
    return "cell_id" in table and bool(table["cell_id"].duplicated().any())


def _seed_indices(table: pd.DataFrame, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Every cell kept, its seeds drawn with replacement: the design fixed, the seed noise resampled."""
    cells = table["cell_id"].to_numpy()
    plan = [np.flatnonzero(cells == c) for c in pd.unique(cells)]
    return [np.concatenate([rows[rng.integers(0, len(rows), size=len(rows))] for rows in plan]) for _ in range(n)]


def _hierarchical_indices(
    table: pd.DataFrame, n: int, rng: np.random.Generator, strata: str | None
) -> list[np.ndarray]:
    """Two-level resample (seed noise enters every draw): cells with replacement within each
    stratum (budget), then, inside each drawn cell, its seeds with replacement."""
    cells = table["cell_id"].to_numpy()
    groups = table[strata].to_numpy() if strata and strata in table else np.zeros(len(table))
    plan = []
    for g in pd.unique(groups):
        in_group = np.flatnonzero(groups == g)
        plan.append([in_group[cells[in_group] == c] for c in pd.unique(cells[in_group])])
    out = []
    for _ in range(n):
        parts = []
        for rows in plan:
            for i in rng.integers(0, len(rows), size=len(rows)):
                parts.append(rows[i][rng.integers(0, len(rows[i]), size=len(rows[i]))])
        out.append(np.concatenate(parts))
    return out


def _run_chunk(refit: Refit, table: pd.DataFrame, chunk: list[np.ndarray]) -> list[dict[str, float] | None]:
    out: list[dict[str, float] | None] = []
    for idx in chunk:
        try:
            # A degenerate draw's overflow or 0/0 is counted below (non-finite), not printed: a
            # worker's warning on the user's stderr says nothing about the fit.
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                params = refit(table.iloc[idx].reset_index(drop=True))
        except (DelphiError, ValueError, FloatingPointError, np.linalg.LinAlgError):
            params = None  # a resample can be degenerate (e.g. one distinct N); count it
        if params is not None and not all(np.isfinite(v) for v in params.values()):
            params = None
        out.append(params)
    return out


def bootstrap(
    refit: Refit,
    table: pd.DataFrame,
    n: int,
    seed: int,
    *,
    strata: str | None = None,
    resample: str = "cells",
    workers: int | None = None,
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Refit `n` resamples; return the parameter draws and a diagnostics dict.

    `refit` must be picklable (a module-level function or a functools.partial of one).
    """
    if n < 1:
        raise DelphiError(f"bootstrap: n = {n}, expected >= 1")
    if seed is not None and seed < 0:
        raise DelphiError(f"bootstrap: seed = {seed}, expected an integer >= 0")
    if resample not in RESAMPLE_MODES:
        raise DelphiError(f"bootstrap: resample {resample!r}, expected one of {', '.join(RESAMPLE_MODES)}")
    check_bootstrap_memory(n, len(table))
    indices = resample_indices(table, n, seed, strata, resample)
    if workers is None:
        workers = usable_cpus()
    # never more processes than CPUs (--workers 10000 forked ~4,000 on 2 cores), nor than the refits need
    workers = max(1, min(workers, usable_cpus(), n // MIN_REFITS_PER_WORKER))
    if workers == 1:
        results = _run_chunk(refit, table, indices)
    else:
        chunks = [indices[i::workers] for i in range(workers)]
        # fork is cheapest, but forking a process that has imported jax (multithreaded) can
        # deadlock: spawn then.
        ctx = multiprocessing.get_context("spawn" if "jax" in sys.modules else "fork")
        # SIGTERM/SIGHUP raise here (exit 143/129) and Ctrl-C raises KeyboardInterrupt (130): either
        # way the workers are terminated before the exception leaves, so none outlives the parent.
        with stop_signals_raise("bootstrap workers stopped"):
            pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),)
            )
            try:
                # Submitting starts the workers; a stop signal that lands while a spawned worker is
                # still being handed its start-up data makes that worker print an EOFError
                # traceback, so stop signals wait until every worker has its data.
                with held():
                    futures = [pool.submit(_run_chunk, refit, table, chunk) for chunk in chunks]
                parts = [future.result() for future in futures]
            except BaseException:
                _terminate(pool)
                raise
            pool.shutdown(wait=True)
        # Undo the round-robin split so draw i is resample i whatever the worker count.
        results = [None] * n
        for w, part in enumerate(parts):
            for j, params in enumerate(part):
                results[w + j * workers] = params
    good = [r for r in results if r is not None]
    if not good:
        raise DelphiError(f"bootstrap: all {n} refits failed")
    samples = {k: [float(r[k]) for r in good] for k in good[0]}
    clustered = "run_id" in table and bool(table["run_id"].duplicated().any())
    info = {
        "bootstrap_n": n,
        "bootstrap_failed": n - len(good),
        "bootstrap_unit": RESAMPLE_UNITS[resample] if _hierarchical(table) else "run_id" if clustered else "row",
        "bootstrap_strata": strata,
        "bootstrap_workers": workers,
        "interval": "bootstrap percentile, 90%",
    }
    return samples, info
