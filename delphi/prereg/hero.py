"""The hero as a lab that trains elsewhere knows it: its N and D (and, if known, its exact FLOPs C), or a
compute budget the fit sizes by its own allocation. A Delphi train config is the other way to give it
(`delphi prereg create --hero HERO.yaml`); this is the one for a hero with no Delphi config.

`hero_from_numbers` turns the command line's numbers into a `HeroSpec` (DelphiError, exit 2, naming
the flag, for a missing or non-positive N or D); the spec is what the prediction, the gates and the
sealed file read (`predict_hero`, `hero_facts`, `HeroSpec.summary`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from delphi.errors import DelphiError, quoted
from delphi.fits.allocation import FLOPS_PER_PARAM_TOKEN, flops_of


@dataclass(frozen=True)
class HeroSpec:
    """A hero given by numbers. `params` N (counted as the fit's table counts its params), `tokens` D,
    `flops` C (training FLOPs); `given` says how the hero was given and `flops_how` where C comes from."""

    params: float
    tokens: float
    flops: float
    given: str
    flops_how: str

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params

    def facts(self) -> dict[str, float]:
        """What the gates compare (`gates.hero_facts`): no steps, batch or depth without a config."""
        return {"tokens_per_param": self.tokens_per_param, "tokens": float(self.tokens), "flops": float(self.flops)}

    def summary(self, family: str | None) -> dict[str, Any]:
        """The sealed file's `hero` block (besides `config: null`): N, D, C as used and how each was given."""
        return {
            "params": float(self.params),
            "tokens": float(self.tokens),
            "flops": float(self.flops),
            "family": family,
            "given": self.given,
            "flops_how": self.flops_how,
        }


def positive_number(text: Any, flag: str, what: str) -> float:
    """A command-line number that must be a finite positive count (DelphiError naming the flag)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise DelphiError(f"{flag} {quoted(text)}: the hero's {what} must be a positive number") from None
    if not math.isfinite(value) or value <= 0:
        raise DelphiError(f"{flag} {text}: the hero's {what} must be a positive finite number, got {value:g}")
    return value


def hero_from_numbers(
    fit: Any,
    *,
    params: str | None = None,
    tokens: str | None = None,
    flops: str | None = None,
    compute: str | None = None,
) -> HeroSpec:
    """The hero from `--hero-params N --hero-tokens D [--hero-flops C]` or `--hero-compute C`.

    N and D go together; C, when not given, is the fit's exact FLOPs family at (N, D) where the fit
    has one, else 6ND. `--hero-compute C` sizes N* and D* by the fit's own allocation at C (a law in
    N and D allocates C under its family or 6ND; the isoFLOP law's N*(C), D*(C) are fitted); a law
    with no allocation (the frontier) cannot size a hero."""
    if compute is not None:
        for flag, value in (("--hero-params", params), ("--hero-tokens", tokens), ("--hero-flops", flops)):
            if value is not None:
                raise DelphiError(
                    f"{flag} and --hero-compute: give the hero by N and D, or by a compute budget the fit sizes, not both"
                )
        c = positive_number(compute, "--hero-compute", "compute C (FLOPs)")
        pred = fit.predict(compute=c)
        n, d = pred.get("params"), pred.get("tokens")
        if n is None or d is None or not (math.isfinite(float(n)) and math.isfinite(float(d))) or n <= 0 or d <= 0:
            raise DelphiError(
                f"--hero-compute {compute}: the {fit.kind} fit ({fit.method}) has no allocation N*(C), D*(C) to size "
                "the hero; give --hero-params N --hero-tokens D"
            )
        return HeroSpec(
            float(n),
            float(d),
            c,
            f"--hero-compute {c:.4g}: N* and D* from the fit's allocation ({pred.get('allocation')})",
            "given (--hero-compute)",
        )
    if params is None and tokens is None:
        raise DelphiError(
            "prereg create: give the hero: --hero HERO.yaml, --hero-params N --hero-tokens D, or --hero-compute C"
            + (" (--hero-flops goes with --hero-params and --hero-tokens)" if flops is not None else "")
        )
    if params is None:
        raise DelphiError("--hero-params: missing; a hero given by its tokens (--hero-tokens) needs its N too")
    if tokens is None:
        raise DelphiError("--hero-tokens: missing; a hero given by its N (--hero-params) needs its D (tokens) too")
    n = positive_number(params, "--hero-params", "N (parameters)")
    d = positive_number(tokens, "--hero-tokens", "D (tokens)")
    if flops is not None:
        return HeroSpec(
            n,
            d,
            positive_number(flops, "--hero-flops", "C (FLOPs)"),
            "--hero-params, --hero-tokens",
            "given (--hero-flops)",
        )
    family = getattr(fit, "family", None)
    if family is not None:
        return HeroSpec(
            n,
            d,
            float(flops_of(family, n, d)),
            "--hero-params, --hero-tokens",
            f"the fit's FLOPs family at N and D ({family.source})",
        )
    return HeroSpec(
        n,
        d,
        FLOPS_PER_PARAM_TOKEN * n * d,
        "--hero-params, --hero-tokens",
        f"{FLOPS_PER_PARAM_TOKEN:g}ND (the fit has no FLOPs family; give --hero-flops for the exact count)",
    )
