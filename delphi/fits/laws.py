"""The fitted laws as pure functions of their parameters, and compute-optimal allocation.

A fit stores only its parameters (a dict); everything a user asks of it (loss
at N, D; N*, D*, L* at compute C) is one of these functions, so a bootstrap
interval on a prediction is the same function applied to every bootstrap draw.

Each kind has a frozen surface built from that dict (`SURFACES[kind].from_params(p)`):
`loss(N, D, **terms)` for the laws in (N, D), `optimum(C, family, **terms)` for every
law (N*, D*, L*; exact-FLOP aware through `allocation.optimal_allocation`) and
`derived()`. The registry is the one place that looks at a kind: a new law is one
surface class and one entry in SURFACES.

Kinds and their parameters:
    parametric  L(N, D) = E + A N^-alpha + B D^-beta                 (Hoffmann et al. 2022)
    moe         L(N, D, X) = E + (G X^-gamma + A) N^-alpha + B D^-beta (Krajewski et al. 2024)
    isoflop     N* = 10^log10_N0 C^a, D* = 10^log10_D0 C^b, L* = 10^log10_L0 C^loss_exponent
    envelope    same parameters as isoflop, from the lower envelope (Approach 1)
    frontier    L*(C) = E + A C^-gamma
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np

from delphi.errors import DelphiError, quoted
from delphi.fits.allocation import FLOPS_PER_PARAM_TOKEN, FlopsFamily, optimal_allocation

if TYPE_CHECKING:
    from jaxtyping import Float


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
    loss = p["E"] + a_coef * n_opt**-alpha + p["B"] * d_opt**-beta
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
        opt = optimal_allocation(lambda n, d: e + a * n**-alpha + b * d**-beta, flat_c[sl], family)  # noqa: B023  (called at once, inside the loop)
        ok = ((a > 0) & (b > 0) & (alpha > 0) & (beta > 0))[:, 0]
        for k in parts:
            parts[k].append(np.where(ok, opt[k], np.nan))
    return {k: np.concatenate(v).reshape((n_draws,) + c.shape) for k, v in parts.items()}


def moe_coefficient(p: dict[str, float], x: Any) -> np.ndarray:
    """The effective A of the MoE law at expert term X (granularity or expert count)."""
    return p["G"] * np.asarray(x, float) ** -p["gamma"] + p["A"]


# --------------------------------------------------------------------------- surfaces
#
# One frozen surface per law kind: built from a fit's parameter dict, it answers loss(N, D)
# (laws in N and D) and optimum(C) (every law). The registry SURFACES is the only place a
# kind string is looked at; a new law is one class here plus one entry there.


class LawKind(StrEnum):
    """The kinds of fitted law. A str enum: "moe" == LawKind.MOE, and the JSON stays a string."""

    PARAMETRIC = "parametric"
    MOE = "moe"
    ISOFLOP = "isoflop"
    ENVELOPE = "envelope"
    FRONTIER = "frontier"


DEFAULT_TERM = "granularity"  # the MoE law's expert term when a fit does not say (moe.TERMS)


@dataclass(frozen=True)
class Optimum:
    """The compute-optimal point at C: N*, D* (None for a law in C alone) and L*."""

    params: Any  # N*, array shaped like C, or None
    tokens: Any  # D*, array shaped like C, or None
    loss: Any  # L*, array shaped like C

    def as_prediction(self) -> dict[str, Any]:
        """The {"loss", "params", "tokens"} dict of FitResult.predict (key order kept)."""
        return {"loss": self.loss, "params": self.params, "tokens": self.tokens}


@dataclass(frozen=True)
class Surface:
    """Base of the law surfaces: a frozen set of fitted parameters and what they predict."""

    kind: ClassVar[LawKind]
    in_nd: ClassVar[bool] = False  # a law in (N, D); the others predict from compute only
    has_expert_term: ClassVar[bool] = False  # reads an expert term X (keyword: the fit's "term")
    param_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_params(cls, p: Mapping[str, Any], term: str = DEFAULT_TERM) -> Self:
        """The surface of one parameter set. `term` names the MoE law's expert term (others ignore it).
        Values are kept as given (no float()): a numpy draw must keep numpy's overflow to inf."""
        return cls(**{name: p[name] for name in cls.param_names})

    def loss(
        self, params: Float[np.ndarray, "..."] | float, tokens: Float[np.ndarray, "..."] | float, **terms: Any
    ) -> np.ndarray:
        """Loss at N, D (plus the MoE law's expert term)."""
        raise DelphiError(f"predict: a {self.kind} fit predicts from compute only (--compute C)")

    def optimum(
        self, compute: Float[np.ndarray, "..."] | float, family: FlopsFamily | None = None, **terms: Any
    ) -> Optimum:
        """N*, D*, L* at compute C; for laws in (N, D), C = family(N) D when a family is given, else 6 N D."""
        raise NotImplementedError

    def derived(self) -> dict[str, float]:
        """Quantities implied by the parameters, bootstrapped alongside them."""
        return {}

    def predict_point(
        self,
        *,
        compute: Any = None,
        params: Any = None,
        tokens: Any = None,
        family: FlopsFamily | None = None,
        **terms: Any,
    ) -> dict[str, Any]:
        """One prediction: the optimum at compute=C, or the loss at params=N, tokens=D."""
        if compute is None and (params is None or tokens is None):
            raise DelphiError("predict: give compute=C, or params=N and tokens=D")
        if compute is not None:
            return self.optimum(compute, family, **terms).as_prediction()
        return {
            "loss": self.loss(params, tokens, **terms),
            "params": np.asarray(params, float),
            "tokens": np.asarray(tokens, float),
        }

    @classmethod
    def optimum_draws(
        cls, draws: Mapping[str, np.ndarray], compute: Any, family: FlopsFamily, term: str = DEFAULT_TERM, **terms: Any
    ) -> dict[str, np.ndarray]:
        """The exact-FLOP optimum of every bootstrap draw in one vectorised allocation: arrays of
        shape (draws, *C.shape). Laws in (N, D) only; a law in C allocates no compute."""
        raise NotImplementedError(f"{cls.kind} fits allocate no compute")


@dataclass(frozen=True)
class ChinchillaSurface(Surface):
    """L(N, D) = E + A N^-alpha + B D^-beta (Hoffmann et al. 2022)."""

    kind: ClassVar[LawKind] = LawKind.PARAMETRIC
    in_nd: ClassVar[bool] = True
    param_names: ClassVar[tuple[str, ...]] = ("E", "A", "B", "alpha", "beta")

    E: Any
    A: Any
    B: Any
    alpha: Any
    beta: Any

    def as_params(self) -> dict[str, Any]:
        return {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta}

    @property
    def has_interior_optimum(self) -> bool:
        """False when a term is absent: loss then falls monotonically along one axis."""
        return not (self.A <= 0 or self.B <= 0 or self.alpha <= 0 or self.beta <= 0)

    def loss(
        self, params: Float[np.ndarray, "..."] | float, tokens: Float[np.ndarray, "..."] | float, **terms: Any
    ) -> np.ndarray:
        return chinchilla_loss(self.as_params(), params, tokens)

    def optimum(
        self, compute: Float[np.ndarray, "..."] | float, family: FlopsFamily | None = None, **terms: Any
    ) -> Optimum:
        if family is None:
            opt = chinchilla_optimum(self.as_params(), compute)
        elif not self.has_interior_optimum:
            nan = np.full_like(np.asarray(compute, float), np.nan)
            opt = {"params": nan, "tokens": nan, "loss": nan}  # no interior optimum, as in the closed form
        else:
            p = self.as_params()
            opt = optimal_allocation(lambda n, d: chinchilla_loss(p, n, d), compute, family)
        return Optimum(params=opt["params"], tokens=opt["tokens"], loss=opt["loss"])

    def derived(self) -> dict[str, float]:
        # N* ~ C^a and D* ~ C^b under C = 6 N D (Hoffmann et al. 2022, eq. 4)
        if self.alpha + self.beta > 0:
            return {"a": self.beta / (self.alpha + self.beta), "b": self.alpha / (self.alpha + self.beta)}
        return {}

    @classmethod
    def optimum_draws(
        cls,
        draws: Mapping[str, np.ndarray],
        compute: Any,
        family: FlopsFamily | None,
        term: str = DEFAULT_TERM,
        **terms: Any,
    ) -> dict[str, np.ndarray]:
        return chinchilla_optimum_draws({k: np.asarray(v, float) for k, v in draws.items()}, compute, family)


@dataclass(frozen=True)
class MoeSurface(Surface):
    """L(N, D, X) = E + (G X^-gamma + A) N^-alpha + B D^-beta (Krajewski et al. 2024); X is `term`."""

    kind: ClassVar[LawKind] = LawKind.MOE
    in_nd: ClassVar[bool] = True
    has_expert_term: ClassVar[bool] = True
    param_names: ClassVar[tuple[str, ...]] = ("E", "G", "gamma", "A", "B", "alpha", "beta")

    E: Any
    G: Any
    gamma: Any
    A: Any
    B: Any
    alpha: Any
    beta: Any
    term: str = DEFAULT_TERM  # "granularity" or "experts": the keyword X is passed as

    @classmethod
    def from_params(cls, p: Mapping[str, Any], term: str = DEFAULT_TERM) -> Self:
        return cls(**{name: p[name] for name in cls.param_names}, term=term)

    def expert_term(self, terms: Mapping[str, Any]) -> Any:
        x = terms.get(self.term)
        if x is None:
            raise DelphiError(f"predict: this MoE law needs {self.term}=... (--{self.term})")
        return x

    def at(self, x: Any) -> ChinchillaSurface:
        """The dense law at expert term X: A_eff = G X^-gamma + A (one X; an array of X raises TypeError)."""
        a_eff = float(moe_coefficient({"G": self.G, "gamma": self.gamma, "A": self.A}, x))
        return ChinchillaSurface(E=self.E, A=a_eff, B=self.B, alpha=self.alpha, beta=self.beta)

    def loss(
        self, params: Float[np.ndarray, "..."] | float, tokens: Float[np.ndarray, "..."] | float, **terms: Any
    ) -> np.ndarray:
        a_eff = moe_coefficient({"G": self.G, "gamma": self.gamma, "A": self.A}, self.expert_term(terms))
        a_eff = float(a_eff) if np.ndim(a_eff) == 0 else a_eff  # one X per run allowed: X may be an array
        return chinchilla_loss(
            {"E": self.E, "A": a_eff, "B": self.B, "alpha": self.alpha, "beta": self.beta}, params, tokens
        )

    def optimum(
        self, compute: Float[np.ndarray, "..."] | float, family: FlopsFamily | None = None, **terms: Any
    ) -> Optimum:
        return self.at(self.expert_term(terms)).optimum(compute, family)

    def derived(self) -> dict[str, float]:
        return ChinchillaSurface(E=self.E, A=self.A, B=self.B, alpha=self.alpha, beta=self.beta).derived()

    @classmethod
    def optimum_draws(
        cls,
        draws: Mapping[str, np.ndarray],
        compute: Any,
        family: FlopsFamily | None,
        term: str = DEFAULT_TERM,
        **terms: Any,
    ) -> dict[str, np.ndarray]:
        x = terms.get(term)
        if x is None:
            raise DelphiError(f"predict: this MoE law needs {term}=... (--{term})")
        p = {k: np.asarray(v, float) for k, v in draws.items()}
        a_eff = p["G"] * float(x) ** -p["gamma"] + p["A"]
        return chinchilla_optimum_draws(p, compute, family, A=a_eff)


@dataclass(frozen=True)
class IsoflopSurface(Surface):
    """N* = 10^log10_N0 C^a, D* = 10^log10_D0 C^b, L* = 10^log10_L0 C^loss_exponent (Approach 2)."""

    kind: ClassVar[LawKind] = LawKind.ISOFLOP
    param_names: ClassVar[tuple[str, ...]] = ("a", "b", "loss_exponent", "log10_N0", "log10_D0", "log10_L0")

    a: Any
    b: Any
    loss_exponent: Any
    log10_N0: Any
    log10_D0: Any
    log10_L0: Any

    def optimum(
        self, compute: Float[np.ndarray, "..."] | float, family: FlopsFamily | None = None, **terms: Any
    ) -> Optimum:
        """The fitted power laws at C; `family` is not used (the law was fitted in C)."""
        c = np.asarray(compute, float)
        q = {
            k: np.float64(getattr(self, k)) for k in self.param_names
        }  # numpy powers: a wild draw overflows to inf, not an exception
        with np.errstate(over="ignore", invalid="ignore"):
            loss = 10.0 ** q["log10_L0"] * c ** q["loss_exponent"]
            params = 10.0 ** q["log10_N0"] * c ** q["a"]
            tokens = 10.0 ** q["log10_D0"] * c ** q["b"]
        return Optimum(params=params, tokens=tokens, loss=loss)


def off_optimum_penalty(curvature: Mapping[str, float], compute: Any, params: Any, params_opt: Any) -> np.ndarray:
    """K(C) (ln N - ln N*)^2 (nats): what a run of N pays at compute C over the compute-optimal N*,
    K(C) = 10^log10_K0 C^exponent the isoFLOP parabolas' curvature law (`isoflop.curvature_law`)."""
    k = 10.0 ** curvature["log10_K0"] * np.asarray(compute, float) ** curvature["exponent"]
    return k * np.log(np.asarray(params, float) / np.asarray(params_opt, float)) ** 2


@dataclass(frozen=True)
class EnvelopeSurface(IsoflopSurface):
    """The isoflop power laws fitted to the lower envelope (Approach 1)."""

    kind: ClassVar[LawKind] = LawKind.ENVELOPE


@dataclass(frozen=True)
class FrontierSurface(Surface):
    """L*(C) = E + A C^-gamma: the loss frontier alone, no N* or D*."""

    kind: ClassVar[LawKind] = LawKind.FRONTIER
    param_names: ClassVar[tuple[str, ...]] = ("E", "A", "gamma")

    E: Any
    A: Any
    gamma: Any

    def optimum(
        self, compute: Float[np.ndarray, "..."] | float, family: FlopsFamily | None = None, **terms: Any
    ) -> Optimum:
        c = np.asarray(compute, float)
        with np.errstate(over="ignore", invalid="ignore"):
            loss = self.E + self.A * c ** -np.float64(self.gamma)
        return Optimum(params=None, tokens=None, loss=loss)


SURFACES: dict[str, type[Surface]] = {
    LawKind.PARAMETRIC: ChinchillaSurface,
    LawKind.MOE: MoeSurface,
    LawKind.ISOFLOP: IsoflopSurface,
    LawKind.ENVELOPE: EnvelopeSurface,
    LawKind.FRONTIER: FrontierSurface,
}
ND_KINDS = tuple(kind.value for kind, surface in SURFACES.items() if surface.in_nd)  # laws in (N, D)


def surface_class(kind: str) -> type[Surface]:
    """The surface of a kind; DelphiError for a kind this version does not know."""
    try:
        return SURFACES[kind]
    except (KeyError, TypeError):
        raise DelphiError(f"predict: unknown fit kind {quoted(kind)}") from None


def point_prediction(
    kind: str, p: dict[str, float], term: str = DEFAULT_TERM, family: FlopsFamily | None = None, **query: Any
) -> dict[str, Any]:
    """One prediction from one parameter set. `query`: compute=C, or params=N and tokens=D
    (plus granularity=/experts= for the MoE law, whichever term it was fitted with).

    For laws in (N, D), compute=C is allocated under the family's exact FLOPs per token when
    `family` is given (C = family(N) D), else under C = 6 N D (closed form)."""
    compute, n, d = query.get("compute"), query.get("params"), query.get("tokens")
    if compute is None and (n is None or d is None):
        raise DelphiError("predict: give compute=C, or params=N and tokens=D")
    return surface_class(kind).from_params(p, term).predict_point(family=family, **query)


def derived_quantities(kind: str, p: dict[str, float]) -> dict[str, float]:
    """Quantities implied by the parameters, bootstrapped alongside them ({} for an unknown kind)."""
    surface = SURFACES.get(kind)
    return {} if surface is None else surface.from_params(p).derived()
