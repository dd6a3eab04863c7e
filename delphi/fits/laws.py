"""The fitted laws as pure functions of their parameters, and compute-optimal allocation.

A fit stores only its parameters (a dict); everything a user asks of it (loss
at N, D; N*, D*, L* at compute C) is one of these functions, so a bootstrap
interval on a prediction is the same function applied to every bootstrap draw.

Kinds and their parameters:
    parametric  L(N, D) = E + A N^-alpha + B D^-beta                 (Hoffmann et al. 2022)
    moe         L(N, D, X) = E + (G X^-gamma + A) N^-alpha + B D^-beta (Krajewski et al. 2024)
    isoflop     N* = 10^log10_N0 C^a, D* = 10^log10_D0 C^b, L* = 10^log10_L0 C^loss_exponent
    envelope    same parameters as isoflop, from the lower envelope (Approach 1)
    frontier    L*(C) = E + A C^-gamma
"""

from __future__ import annotations

from typing import Any

import numpy as np

from delphi.errors import DelphiError
from delphi.fits.allocation import FLOPS_PER_PARAM_TOKEN, FlopsFamily, optimal_allocation


def chinchilla_loss(p: dict[str, float], params: Any, tokens: Any) -> np.ndarray:
    n, d = np.asarray(params, float), np.asarray(tokens, float)
    return p["E"] + p["A"] * n ** -p["alpha"] + p["B"] * d ** -p["beta"]


def chinchilla_optimum(p: dict[str, float], compute: Any, A: float | None = None) -> dict[str, np.ndarray]:
    """Minimise E + A N^-alpha + B D^-beta subject to C = 6 N D (Hoffmann et al. 2022, eq. 4).

    N* = G (C/6)^(beta/(alpha+beta)), G = (alpha A / (beta B))^(1/(alpha+beta)), D* = C/(6 N*).
    """
    c = np.asarray(compute, float)
    a_coef = p["A"] if A is None else A
    alpha, beta = p["alpha"], p["beta"]
    if a_coef <= 0 or p["B"] <= 0 or alpha <= 0 or beta <= 0:
        # A term is absent: loss falls monotonically along one axis, there is no interior optimum.
        nan = np.full_like(c, np.nan)
        return {"params": nan, "tokens": nan, "loss": nan}
    g = (alpha * a_coef / (beta * p["B"])) ** (1.0 / (alpha + beta))
    n_opt = g * (c / FLOPS_PER_PARAM_TOKEN) ** (beta / (alpha + beta))
    d_opt = c / (FLOPS_PER_PARAM_TOKEN * n_opt)
    loss = p["E"] + a_coef * n_opt ** -alpha + p["B"] * d_opt ** -beta
    return {"params": n_opt, "tokens": d_opt, "loss": loss}


ALLOCATION_CHUNK_ROWS = 2048  # (draw, compute) pairs allocated per vectorised call: ~4 MB per grid pass


def chinchilla_optimum_draws(
    draws: dict[str, np.ndarray], compute: Any, family: FlopsFamily | None, A: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """`chinchilla_optimum` / exact allocation for many parameter sets at once: arrays of shape
    (draws, *compute.shape). One vectorised allocation call instead of one per draw."""
    c = np.asarray(compute, float)
    p = {k: np.asarray(v, float) for k, v in draws.items()}
    a_coef = p["A"] if A is None else np.asarray(A, float)
    n_draws = len(p["alpha"])
    if family is None:
        out = {k: [] for k in ("params", "tokens", "loss")}
        for i in range(n_draws):
            one = chinchilla_optimum({k: float(v[i]) for k, v in p.items()}, c, A=float(a_coef[i]))
            for k in out:
                out[k].append(one[k])
        return {k: np.array(v, float) for k, v in out.items()}
    flat_c = np.broadcast_to(c.ravel()[None, :], (n_draws, c.size)).ravel()
    per_row = {k: np.repeat(v, c.size)[:, None] for k, v in p.items()}
    a_row = np.repeat(a_coef, c.size)[:, None]
    parts: dict[str, list[np.ndarray]] = {"params": [], "tokens": [], "loss": []}
    for lo in range(0, len(flat_c), ALLOCATION_CHUNK_ROWS):  # bounded memory: rows x search grid
        sl = slice(lo, lo + ALLOCATION_CHUNK_ROWS)
        e, a, b = per_row["E"][sl], a_row[sl], per_row["B"][sl]
        alpha, beta = per_row["alpha"][sl], per_row["beta"][sl]
        opt = optimal_allocation(lambda n, d: e + a * n ** -alpha + b * d ** -beta, flat_c[sl], family)
        ok = ((a > 0) & (b > 0) & (alpha > 0) & (beta > 0))[:, 0]
        for k in parts:
            parts[k].append(np.where(ok, opt[k], np.nan))
    return {k: np.concatenate(v).reshape((n_draws,) + c.shape) for k, v in parts.items()}


def moe_coefficient(p: dict[str, float], x: Any) -> np.ndarray:
    """The effective A of the MoE law at expert term X (granularity or expert count)."""
    return p["G"] * np.asarray(x, float) ** -p["gamma"] + p["A"]


def point_prediction(
    kind: str, p: dict[str, float], term: str = "granularity", family: FlopsFamily | None = None, **query: Any
) -> dict[str, Any]:
    """One prediction from one parameter set. `query`: compute=C, or params=N and tokens=D
    (plus granularity=/experts= for the MoE law, whichever term it was fitted with).

    For laws in (N, D), compute=C is allocated under the family's exact FLOPs per token when
    `family` is given (C = family(N) D), else under C = 6 N D (closed form)."""
    compute, n, d = query.get("compute"), query.get("params"), query.get("tokens")
    if compute is None and (n is None or d is None):
        raise DelphiError("predict: give compute=C, or params=N and tokens=D")
    if kind in ("parametric", "moe"):
        if kind == "moe":
            x = query.get(term)
            if x is None:
                raise DelphiError(f"predict: this MoE law needs {term}=... (--{term})")
            a_eff = float(moe_coefficient(p, x))
        else:
            a_eff = p["A"]
        if compute is not None:
            if family is None:
                opt = chinchilla_optimum(p, compute, A=a_eff)
            elif a_eff <= 0 or p["B"] <= 0 or p["alpha"] <= 0 or p["beta"] <= 0:
                nan = np.full_like(np.asarray(compute, float), np.nan)
                opt = {"params": nan, "tokens": nan, "loss": nan}  # no interior optimum, as in the closed form
            else:
                q = dict(p, A=a_eff)
                opt = optimal_allocation(lambda n, d: chinchilla_loss(q, n, d), compute, family)
            return {"loss": opt["loss"], "params": opt["params"], "tokens": opt["tokens"]}
        q = dict(p, A=a_eff)
        return {"loss": chinchilla_loss(q, n, d), "params": np.asarray(n, float), "tokens": np.asarray(d, float)}
    if kind in ("isoflop", "envelope"):
        if compute is None:
            raise DelphiError(f"predict: a {kind} fit predicts from compute only (--compute C)")
        c = np.asarray(compute, float)
        q = {k: np.float64(v) for k, v in p.items()}  # numpy powers: a wild bootstrap draw overflows to inf, not an exception
        with np.errstate(over="ignore", invalid="ignore"):
            return {
                "loss": 10.0 ** q["log10_L0"] * c ** q["loss_exponent"],
                "params": 10.0 ** q["log10_N0"] * c ** q["a"],
                "tokens": 10.0 ** q["log10_D0"] * c ** q["b"],
            }
    if kind == "frontier":
        if compute is None:
            raise DelphiError("predict: a frontier fit predicts from compute only (--compute C)")
        c = np.asarray(compute, float)
        with np.errstate(over="ignore", invalid="ignore"):
            return {"loss": p["E"] + p["A"] * c ** -np.float64(p["gamma"]), "params": None, "tokens": None}
    raise DelphiError(f"predict: unknown fit kind {kind!r}")


def derived_quantities(kind: str, p: dict[str, float]) -> dict[str, float]:
    """Quantities implied by the parameters, bootstrapped alongside them."""
    if kind in ("parametric", "moe") and p["alpha"] + p["beta"] > 0:
        return {"a": p["beta"] / (p["alpha"] + p["beta"]), "b": p["alpha"] / (p["alpha"] + p["beta"])}
    return {}
