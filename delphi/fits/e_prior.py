"""A lab's prior on the irreducible loss E: pinned at a number, or a Gaussian with a mean and an sd.

Marin pins L_inf = 1.6 for its MoE laws (docs/design.md §6): free fits of the asymptote are too
optimistic, and on a sweep of one or two decades the data cannot tell E from the power law's
curvature. Every law with an E (frontier, asymptotic, parametric, VPNLS) takes one of these:

- pinned (`--E NUMBER`): E is that number; the other parameters are fitted with it held;
- a prior (`--E-prior MEAN,SD`): the maximum a posteriori fit of

      objective(theta) = RSS(theta) + s2 * ((E - MEAN) / SD)^2,

  with s2 = RSS_free / (n - p), the residual variance per degree of freedom of the same law fitted
  with E free (the noise level the data themselves show; for Approach 3, whose objective is a sum of
  Huber terms, H_free / (n - p) in the same way: exact where every residual is in Huber's quadratic
  zone). This is -2 log posterior x s2 / 1 under Gaussian errors of variance s2 and a Gaussian prior:
  where the data pin E, the prior barely moves it; where the data leave E free (a flat profile), the
  prior decides.

A fit with a prior records it (`FitResult.extra.E_prior`: mode, mean, sd, the scale s2) and the
law refitted with E free and, for a prior, with E pinned at MEAN - SD and MEAN + SD ("refits", their
parameters): `forecast_at_refits` evaluates any forecast under each, so every output that shows a
forecast from such a fit says how much of it the prior decides.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from delphi.errors import DelphiError, quoted

PINNED, PRIOR = "pinned", "prior"
# The refits a prior's fit records (module docstring), by name.
REFIT_FREE, REFIT_MINUS_SD, REFIT_PLUS_SD = "E_free", "E_minus_sd", "E_plus_sd"


@dataclass(frozen=True)
class EPrior:
    """E pinned at `mean` (sd None) or Gaussian(mean, sd)."""

    mean: float
    sd: float | None = None

    @property
    def pinned(self) -> bool:
        return self.sd is None

    @property
    def mode(self) -> str:
        return PINNED if self.pinned else PRIOR

    def z2(self, e: float) -> float:
        """((E - mean) / sd)^2; 0 for a pinned E (the fit holds it)."""
        return 0.0 if self.sd is None else ((float(e) - self.mean) / self.sd) ** 2

    def describe(self) -> str:
        return f"E pinned at {self.mean:.4g}" if self.pinned else f"E ~ Normal({self.mean:.4g}, sd {self.sd:.4g})"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "mean": float(self.mean), "sd": None if self.sd is None else float(self.sd)}

    @classmethod
    def from_json(cls, data: Any, where: str = "E_prior") -> "EPrior":
        if not isinstance(data, dict) or data.get("mode") not in (PINNED, PRIOR):
            raise DelphiError(f"{where}: {quoted(data)}, expected {{mode: pinned|prior, mean, sd}}")
        sd = data.get("sd") if data["mode"] == PRIOR else None
        return checked(data.get("mean"), sd, where)


def checked(mean: Any, sd: Any = None, where: str = "E prior") -> EPrior:
    """An EPrior whose mean is a finite number >= 0 and whose sd (when given) a finite number > 0."""

    def number(value: Any, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DelphiError(f"{where}: {what} = {quoted(value)}, expected a finite number")
        return float(value)

    mean = number(mean, "E")
    if mean < 0:
        raise DelphiError(f"{where}: E = {mean:g}, expected >= 0 (an irreducible loss in nats)")
    if sd is None:
        return EPrior(mean)
    sd = number(sd, "sd")
    if sd <= 0:
        raise DelphiError(f"{where}: sd = {sd:g}, expected > 0 (pin E with --E NUMBER instead)")
    return EPrior(mean, sd)


def parse_pinned(text: str, flag: str = "--E") -> EPrior | None:
    """`--E free` (None) or `--E NUMBER` (pinned)."""
    if text == "free":
        return None
    try:
        value = float(text)
    except ValueError:
        raise DelphiError(f"{flag} {quoted(text)}: expected 'free' or a number (E pinned, nats)") from None
    return checked(value, None, f"{flag} {text}")


def parse_prior(text: str, flag: str = "--E-prior") -> EPrior:
    """`--E-prior MEAN,SD`: a Gaussian prior on E."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        mean, sd = (float(p) for p in parts)
    except ValueError:
        raise DelphiError(f"{flag} {quoted(text)}: expected MEAN,SD (two numbers, nats), e.g. 1.6,0.1") from None
    return checked(mean, sd, f"{flag} {text}")


def check_below_loss(prior: EPrior, lowest_loss: float, where: str) -> None:
    """E (the pinned value or the prior's mean) must lie below every loss the law is fitted to."""
    if not prior.mean < lowest_loss:
        raise DelphiError(f"{where}: {prior.describe()}, expected E below the lowest loss fitted ({lowest_loss:.4g})")


def noise_scale(objective_free: float, n_points: int, n_params: int, where: str) -> float:
    """s2 = the free fit's objective per residual degree of freedom (module docstring)."""
    dof = n_points - n_params
    if dof <= 0:
        raise DelphiError(
            f"{where}: the law fitted with E free leaves no residual degree of freedom ({n_points} points, "
            f"{n_params} parameters) to weigh a prior against; pin E (--E NUMBER) or fit more points"
        )
    return max(float(objective_free) / dof, 1e-300)


def pinned_refits(prior: EPrior, upper: float) -> dict[str, float]:
    """The E values a prior's fit is refitted at (module docstring), inside [0, upper)."""
    if prior.pinned:
        return {}
    return {REFIT_MINUS_SD: max(prior.mean - prior.sd, 0.0), REFIT_PLUS_SD: min(prior.mean + prior.sd, upper)}


def record(prior: EPrior, scale: float | None, refits: dict[str, dict[str, float]]) -> dict[str, Any]:
    """What a fit's JSON keeps (`extra["E_prior"]`)."""
    return prior.to_json() | {
        "scale_nats2": scale,
        "refits": refits,
        "objective": (
            "RSS + s2 ((E - mean)/sd)^2, s2 = the E-free fit's residual variance per dof"
            if not prior.pinned
            else "E held at the pinned value"
        ),
    }


def prior_of(fit: Any) -> EPrior | None:
    """The E prior a fit was made with (None: E free, or a fit that has none)."""
    extra = getattr(fit, "extra", None)  # a law without extras (the curve law) has no prior
    data = None if extra is None else extra.E_prior
    return None if data is None else EPrior.from_json(data, "fit: E_prior")


def forecast_at_refits(fit: Any, forecast: Callable[[Any], float]) -> dict[str, Any] | None:
    """How much of a forecast the prior decides: `forecast(fit)` and the same forecast under each
    refit the fit records (E free; for a prior, E pinned at mean - sd and mean + sd), with each one's
    relative difference and one line saying so. None for a fit without a prior."""
    prior = prior_of(fit)
    if prior is None:
        return None
    base = float(forecast(fit))
    rows: dict[str, Any] = {}
    for name, params in ((fit.extra.E_prior or {}).get("refits") or {}).items():
        other = dataclasses.replace(fit, params=dict(params), samples=None, extra=fit.extra.without("E_prior"))
        try:
            value = float(forecast(other))
        except (DelphiError, ValueError, TypeError, ZeroDivisionError):
            continue
        if math.isfinite(value):
            rows[name] = {"E": float(params["E"]), "loss": value, "rel": value / base - 1}
    shown = {REFIT_MINUS_SD: "at E - sd", REFIT_PLUS_SD: "at E + sd", REFIT_FREE: "with E free"}
    parts = [
        f"{shown.get(name, name)} (E = {r['E']:.4g}) {r['loss']:.4f} ({r['rel']:+.2%})" for name, r in rows.items()
    ]
    text = f"{prior.describe()} (fitted E = {float(fit.params['E']):.4g}): forecast {base:.4f}; " + (
        "; ".join(parts) if parts else "no refit to compare"
    )
    return {**prior.to_json(), "E_fitted": float(fit.params["E"]), "loss": base, "refits": rows, "text": text}
