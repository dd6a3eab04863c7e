"""Compute-optimal allocation under the exact FLOP count of a model family.

The closed form of Hoffmann et al. 2022 (eq. 4) solves min L(N, D) s.t. C = 6 N D.
A real family spends flops_per_token(N) per token, which is not 6 N at small scale
(attention, embeddings and the router add FLOPs that N does not count: on the old
paper ladder C / (6 N D) ran from 5.4 at d8 to 1.36 at d96). Scoring a law at 6 N D
then prices its optimum wrongly. Here the constraint is the family's own:

    N*, D* = argmin L(N, D)  s.t.  C = family(N) * D,

solved as a bounded 1-D minimisation over log N of L(N, C / family(N)). The
family is a table (N, exact training FLOPs per token) from the ladder spec, or,
as a fallback, from a results table's own rows (`FlopsFamily.from_table`).

N is counted in one of three conventions (PARAM_CONVENTIONS); the family's N
must be counted the way the fitted law's N was.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from delphi.errors import DelphiError, quoted

if TYPE_CHECKING:  # pandas is imported where used: the CLI imports this module to build --help
    import pandas as pd
    from jaxtyping import Float

# C = 6 N D: forward 2 FLOPs per parameter per token, backward 4 (Kaplan et al. 2020, sec. 2.1).
FLOPS_PER_PARAM_TOKEN = 6.0

PARAM_CONVENTIONS = ("nonembedding", "active", "fpt6")
# Results-table column holding N under each convention (ladder tables; fpt6 is derived).
# fpt6 = flops_per_token / 6, the count of Porian et al. 2024 and Pearce & Song 2024.
CONVENTION_COLUMNS = {"nonembedding": "params_nonembedding", "active": "params_active", "fpt6": "flops_per_token"}

# The search for N*: tokens per parameter D/N from 1e-4 to 1e6 brackets every optimum of a
# law fitted to language models (Chinchilla ~20; over-trained small models ~1e3-1e4).
MIN_TOKENS_PER_PARAM = 1e-4
MAX_TOKENS_PER_PARAM = 1e6
SEARCH_GRID_POINTS = 241  # log-spaced coarse grid (0.05 apart in ln N) before the refinement
REFINE_POINTS = 21  # each zoom round evaluates this many points across the current bracket ...
REFINE_ROUNDS = 6  # ... and shrinks it 10x: ln N* to ~5e-8 before the final parabolic step


@dataclass(frozen=True)
class FlopsFamily:
    """Exact training FLOPs per token as a function of N for one model family (N in `convention`)."""

    params: tuple[float, ...]  # N grid, strictly increasing
    flops_per_token: tuple[float, ...]  # exact training FLOPs per token (3 x forward) at each N
    convention: str  # one of PARAM_CONVENTIONS
    source: str  # where it came from, e.g. "ladder spec studies/ladder_paper.yaml"

    def __post_init__(self) -> None:
        n = np.asarray(self.params, float)
        f = np.asarray(self.flops_per_token, float)
        if self.convention not in PARAM_CONVENTIONS:
            raise DelphiError(
                f"flops family ({self.source}): convention {quoted(self.convention)}, expected one of {PARAM_CONVENTIONS}"
            )
        if n.ndim != 1 or n.shape != f.shape or len(n) < 2:
            raise DelphiError(
                f"flops family ({self.source}): need >= 2 (params, flops_per_token) pairs of equal length, "
                f"got {len(n)} and {len(f)}"
            )
        if not (np.all(np.isfinite(n)) and np.all(np.isfinite(f)) and np.all(n > 0) and np.all(f > 0)):
            raise DelphiError(f"flops family ({self.source}): params and flops_per_token must be finite and > 0")
        if not np.all(np.diff(n) > 0):
            raise DelphiError(f"flops family ({self.source}): params must be strictly increasing, got {list(n)}")

    def __call__(self, params: Any) -> np.ndarray:
        """FLOPs per token at N: log-log linear interpolation, and log-log linear extrapolation
        with the slope of the end segments outside the grid."""
        log_n = np.log(np.asarray(params, float))
        xs, ys = np.log(np.asarray(self.params)), np.log(np.asarray(self.flops_per_token))
        inside = np.interp(log_n, xs, ys)
        lo_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        hi_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(log_n < xs[0], ys[0] + lo_slope * (log_n - xs[0]), inside)
        out = np.where(log_n > xs[-1], ys[-1] + hi_slope * (log_n - xs[-1]), out)
        return np.exp(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "params": [float(v) for v in self.params],
            "flops_per_token": [float(v) for v in self.flops_per_token],
            "convention": self.convention,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "flops family") -> "FlopsFamily":
        if not isinstance(d, dict):
            raise DelphiError(f"{where}: expected a JSON object with params, flops_per_token, convention, source")
        for key in ("params", "flops_per_token", "convention"):
            if key not in d:
                raise DelphiError(
                    f"{where}: missing key {quoted(key)}; expected params, flops_per_token, convention, source"
                )
        try:
            params = tuple(float(v) for v in d["params"])
            fpt = tuple(float(v) for v in d["flops_per_token"])
        except (TypeError, ValueError):
            raise DelphiError(f"{where}: params and flops_per_token must be lists of numbers") from None
        if len(params) != len(fpt) or not all(math.isfinite(v) and v > 0 for v in params + fpt):
            raise DelphiError(
                f"{where}: params and flops_per_token must be lists of equal length of positive finite numbers"
            )
        return cls(params, fpt, str(d["convention"]), str(d.get("source", where)))

    @classmethod
    def from_table(
        cls, table: pd.DataFrame, convention: str = "nonembedding", source: str = "results table"
    ) -> "FlopsFamily":
        """The family of a ladder's own rows: one (N, flops per token) point per distinct shape.

        N is read from the convention's column; flops per token from `flops_per_token`, or
        `flops / tokens` (a ladder's `flops` column is the exact count).
        """
        import pandas as pd

        if convention not in PARAM_CONVENTIONS:
            raise DelphiError(f"{source}: params convention {quoted(convention)}, expected one of {PARAM_CONVENTIONS}")
        if "flops_per_token" in table:
            fpt = pd.to_numeric(table["flops_per_token"], errors="coerce").to_numpy(float)
        elif "flops" in table and "tokens" in table:
            fpt = pd.to_numeric(table["flops"], errors="coerce").to_numpy(float) / pd.to_numeric(
                table["tokens"], errors="coerce"
            ).to_numpy(float)
        else:
            raise DelphiError(
                f"{source}: no flops_per_token (or flops and tokens) columns to build a FLOPs family from"
            )
        if convention == "fpt6":
            n = fpt / FLOPS_PER_PARAM_TOKEN
        else:
            col = CONVENTION_COLUMNS[convention]
            if col not in table:
                raise DelphiError(f"{source}: no {quoted(col)} column for params convention {quoted(convention)}")
            n = pd.to_numeric(table[col], errors="coerce").to_numpy(float)
        ok = np.isfinite(n) & np.isfinite(fpt) & (n > 0) & (fpt > 0)
        points = pd.DataFrame({"n": n[ok], "fpt": fpt[ok]}).groupby("n", sort=True)["fpt"].median()
        if len(points) < 2:
            raise DelphiError(f"{source}: {len(points)} distinct model size(s); a FLOPs family needs at least 2")
        return cls(
            tuple(points.index.to_numpy(float)),
            tuple(points.to_numpy(float)),
            convention,
            f"{source} ({len(points)} shapes)",
        )


def optimal_allocation(
    loss_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], compute: Any, family: FlopsFamily | None
) -> dict[str, Any]:
    """N*, D*, L* minimising loss_fn(N, D) s.t. compute = family(N) * D (exact), or 6 N D when
    family is None. Returns {"params", "tokens", "loss", "allocation": "exact"|"6ND"}.

    `loss_fn` is called with N and D of shape (len(compute.ravel()), k): a grid of N for every
    compute at once (so per-compute parameters of shape (len, 1) broadcast: many bootstrap draws
    are allocated in one call). The minimiser is found on a log-spaced grid of N spanning D/N in
    [MIN_TOKENS_PER_PARAM, MAX_TOKENS_PER_PARAM], then refined by zooming into the bracket
    around the best grid point (REFINE_ROUNDS rounds of REFINE_POINTS points, vectorised over
    compute) and a last parabolic step. An optimum on the edge of that range (no interior
    minimum) gives NaN.
    """
    c = np.asarray(compute, float)
    flat = np.atleast_1d(c).ravel()
    fpt = family if family is not None else (lambda n: FLOPS_PER_PARAM_TOKEN * np.asarray(n, float))
    valid = np.isfinite(flat) & (flat > 0)
    safe_c = np.where(valid, flat, 1.0)[:, None]

    def objective(log_n: np.ndarray) -> np.ndarray:
        n = np.exp(log_n)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            value = np.asarray(loss_fn(n, safe_c / fpt(n)), float)
        return np.where(np.isfinite(value), value, np.inf)

    # 6 N D = C with D = r N gives N = sqrt(C / (6 r)): the search range in N for D/N in [min, max].
    lo = 0.5 * np.log(safe_c / (FLOPS_PER_PARAM_TOKEN * MAX_TOKENS_PER_PARAM))
    hi = 0.5 * np.log(safe_c / (FLOPS_PER_PARAM_TOKEN * MIN_TOKENS_PER_PARAM))
    grid = lo + (hi - lo) * np.linspace(0.0, 1.0, SEARCH_GRID_POINTS)[None, :]
    values = objective(grid)
    k = np.argmin(values, axis=1)
    rows = np.arange(len(flat))
    interior = valid & np.isfinite(values[rows, k]) & (k > 0) & (k < SEARCH_GRID_POINTS - 1)
    step = (hi - lo)[:, 0] / (SEARCH_GRID_POINTS - 1)
    centre = grid[rows, k]
    offsets = np.linspace(-1.0, 1.0, REFINE_POINTS)[None, :]
    for _ in range(REFINE_ROUNDS):
        zoom = centre[:, None] + step[:, None] * offsets
        z_values = objective(zoom)
        j = np.argmin(z_values, axis=1)
        centre = zoom[rows, j]
        step = step * 2.0 / (REFINE_POINTS - 1)
    # a parabola through the best point and its neighbours: the last digits
    f0, fm, fp = objective(centre[:, None]), objective((centre - step)[:, None]), objective((centre + step)[:, None])
    f0, fm, fp = f0[:, 0], fm[:, 0], fp[:, 0]
    curvature = fp + fm - 2 * f0
    with np.errstate(invalid="ignore", divide="ignore"):
        shift = np.where(curvature > 0, 0.5 * step * (fm - fp) / curvature, 0.0)
    shift = np.clip(np.nan_to_num(shift), -step, step)
    refined = centre + shift
    better = objective(refined[:, None])[:, 0] <= f0
    log_n = np.where(better, refined, centre)

    n_opt = np.where(interior, np.exp(log_n), np.nan)
    n_safe = np.where(interior, n_opt, 1.0)
    d_opt = np.where(interior, flat / fpt(n_safe), np.nan)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        loss = np.where(
            interior, np.asarray(loss_fn(n_safe[:, None], np.where(interior, d_opt, 1.0)[:, None]), float)[:, 0], np.nan
        )
    shape = c.shape
    return {
        "params": n_opt.reshape(shape),
        "tokens": d_opt.reshape(shape),
        "loss": loss.reshape(shape),
        "allocation": "exact" if family is not None else "6ND",
    }


def flops_of(
    family: FlopsFamily | None, params: Float[np.ndarray, "..."] | float, tokens: Float[np.ndarray, "..."] | float
) -> np.ndarray:
    """Training FLOPs of (N, D) under the family (or 6 N D without one)."""
    n, d = np.asarray(params, float), np.asarray(tokens, float)
    return (family(n) if family is not None else FLOPS_PER_PARAM_TOKEN * n) * d
