"""Probes: runs beyond the ladder that test a law where it extrapolates, and the correction by
the law's error trend at them (a diagnostic: the primary path, law -> prediction -> seal, needs none
of it; a study uses it when its spec names probes or `hero.probe_correction`).

- `ProbeTrend` / `probe_trend`: a law's relative error at the probes, carried to another compute
  by a rule (`PROBE_CARRIES`); `NOISE_SCOPES`: whose seed spread is one run's noise there.
- `correct_by_probes` / `correction_text`: a prediction corrected by that trend, and how the
  paper and the report say so.

The correction backtested on a table's own budgets (`delphi fit backtest --probes`) is a backtest:
`delphi.fits.backtest.probe_holdouts`, which imports this module (imports run one way).

Where the probes' errors come from (`delphi.prereg.predict.score_probes`), and their gate
(`delphi.prereg.gates.gate_probes`), stay with the preregistration that reads run directories.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from delphi.errors import DelphiError, quoted
from delphi.fits.intervals import Z_50 as Z50
from delphi.fits.intervals import Z_90, predictive_interval
from delphi.fits.intervals import Z_90 as Z90

# How a law's error at the probes is carried beyond them (`ProbeTrend.carry`), and how the text says it.
# "linear": least squares linear in log C through every probe; "local_slope": the line through the
# two furthest probes (compared on the public sweeps: paper/editions/v6/alternative_rules_public.csv).
PROBE_CARRIES = {"linear": "fitted linear in log10 C", "local_slope": "along the line through the two furthest probes"}

# Whose seed spread stands for one run's seed noise at the hero and the probes (`run_noise_nats`).
# A ladder's within-cell seed sd falls with compute, so the pool over every budget is set by the
# smallest and overstates the noise of runs beyond the top (docs/notebook.md).
NOISE_SCOPES = {
    "pooled": "the within-cell seed sd pooled over every budget",
    "top_budget": "the within-cell seed sd at the top isoFLOP budget, the measured scale nearest the runs beyond the ladder",
}


@dataclass(frozen=True)
class ProbeTrend:
    """A law's relative error (actual / predicted - 1) at runs beyond its fit (probes), carried to
    another compute linearly in x = log10(C / top budget), by `carry` (PROBE_CARRIES). Why: a law
    whose error grows with distance passes every probe and still misses further out."""

    top_budget: float
    names: tuple[str, ...]  # sorted by x
    x: tuple[float, ...]
    errors: tuple[float, ...]
    carry: str = "linear"

    def x_of(self, compute: float) -> float:
        return math.log10(compute / self.top_budget)

    def used(self) -> tuple[int, ...]:
        """The probes the carry rests on: every probe for the line; for the local slope the furthest
        and the furthest at a smaller compute."""
        if self.carry == "local_slope":
            last = len(self.x) - 1
            return int(np.flatnonzero(np.array(self.x) < self.x[last])[-1]), last
        return tuple(range(len(self.x)))

    def weights(self, compute: float) -> np.ndarray:
        """The carried error at `compute` is this weighted sum of the probes' errors (both rules are
        linear in the errors, so one run's noise in each probe gives the carried error's sd too)."""
        x, at = np.array(self.x), self.x_of(compute)
        if self.carry == "local_slope":
            before, last = self.used()
            u = (at - x[last]) / (x[last] - x[before])
            w = np.zeros(len(x))
            w[last], w[before] = 1 + u, -u
            return w
        design = np.stack([np.ones_like(x), x], axis=1)
        return np.array([1.0, at]) @ np.linalg.pinv(design)

    def at(self, compute: float) -> float:
        """The trend's error carried to `compute`."""
        return float(self.weights(compute) @ np.array(self.errors))

    @property
    def intercept(self) -> float:
        """The carried error at the top budget (x = 0)."""
        return self.at(self.top_budget)

    @property
    def slope(self) -> float:
        """The carried error's change per decade of compute."""
        return self.at(10 * self.top_budget) - self.intercept

    def sd_at(self, compute: float, noise_rel: float) -> float:
        """The sd of the carried error when each probe's error has sd `noise_rel` (one run's noise)."""
        return float(noise_rel * np.linalg.norm(self.weights(compute)))

    def correct(
        self, loss: float, interval: Sequence[float] | None, compute: float, noise_rel: float, z: float = Z_90
    ) -> tuple[float, tuple[float, float] | None]:
        """(loss x (1 + the carried error), `interval` moved with it and widened in quadrature by
        z x the carried error's sd): a law's prediction at `compute`, corrected."""
        factor = 1 + self.at(compute)
        moved = None if interval is None else [float(v) * factor for v in interval]
        return loss * factor, predictive_interval(
            loss * factor, moved, self.sd_at(compute, noise_rel) * loss * factor, z
        )

    def reach(self, compute: float) -> tuple[float, float]:
        """(how far `compute` lies beyond the furthest probe, the span of the probes the carry rests
        on), both in log10 C."""
        used = [self.x[i] for i in self.used()]
        return self.x_of(compute) - max(self.x), max(used) - min(used)

    def residuals(self) -> dict[str, float]:
        """Each probe's error minus the trend's at its compute (zero for the local slope's two)."""
        return {n: e - self.at(self.top_budget * 10**x) for n, x, e in zip(self.names, self.x, self.errors)}

    def untested(self, tolerance: float, compute: float | None = None) -> list[str]:
        """Why a correction carried to `compute` is not backed by the probes (empty: it is): it needs
        three probes; the trend fitted without the furthest must predict it within `tolerance`;
        every probe the carry rests on (`used`) must lie within `tolerance` of the trend; and
        `compute` may lie beyond the furthest probe (in log C) by at most their span. The local
        slope answers for its own two probes only: it is chosen where the errors bend, so earlier
        probes off its line are its premise, not a failure; the leave-last-out test checks it."""
        tested = self.leave_last_out()
        if tested is None:
            return [
                "a correction by the probes needs >= 3 finished probes at distinct computes (two to fit "
                "the trend, one to test it)"
            ]
        problems = (
            [f"{tested[0]} {tested[1]:+.2%} from the trend fitted without it"] if abs(tested[1]) > tolerance else []
        )
        residuals = self.residuals()
        problems += [
            f"{self.names[i]} {residuals[self.names[i]]:+.2%} from the trend"
            for i in self.used()
            if abs(residuals[self.names[i]]) > tolerance
        ]
        if compute is not None:
            beyond, span = self.reach(compute)
            if beyond > span * (1 + 1e-9):  # one span out is allowed, whatever the rounding of its logs
                problems.append(
                    f"{10**beyond:.3g}x beyond the furthest probe, more than the probes' span ({10**span:.3g}x)"
                )
        return problems

    def leave_last_out(self) -> tuple[str, float] | None:
        """(the furthest probe, the error of its corrected prediction when the trend is fitted on the
        other probes, by the same carry); None with fewer than two others at distinct computes."""
        last = int(np.argmax(self.x))
        rest = {
            n: {"compute": self.top_budget * 10**x, "rel_error": e}
            for i, (n, x, e) in enumerate(zip(self.names, self.x, self.errors))
            if i != last
        }
        trend = probe_trend(rest, self.top_budget, self.carry)
        if trend is None:
            return None
        return self.names[last], (1 + self.errors[last]) / (1 + trend.at(self.top_budget * 10 ** self.x[last])) - 1


def probe_trend(probes: dict[str, dict], top_budget: float, carry: str = "linear") -> ProbeTrend | None:
    """`ProbeTrend` of the finished probes (name -> {"compute", "rel_error"}); None with fewer than
    two at distinct computes."""
    if carry not in PROBE_CARRIES:
        raise DelphiError(f"probe carry: {quoted(carry)}, expected one of {list(PROBE_CARRIES)}")
    points = sorted(
        (math.log10(float(r["compute"]) / top_budget), float(r["rel_error"]), name)
        for name, r in probes.items()
        if not r.get("error") and r.get("compute")
    )
    if len({x for x, _, _ in points}) < 2:
        return None
    return ProbeTrend(
        float(top_budget), tuple(p[2] for p in points), tuple(p[0] for p in points), tuple(p[1] for p in points), carry
    )


# --------------------------------------------------------------------------- the correction of a prediction


# How a sealed assumption says the law's error continues beyond the probes, per carry (PROBE_CARRIES).
CARRY_ASSUMPTION = {"linear": "linearly in log10 C", "local_slope": PROBE_CARRIES["local_slope"]}


def correct_by_probes(final: dict, trend, hero_compute: float, noise_rel: float) -> dict[str, Any]:
    """`final` x (1 + the probes' error trend carried to the hero), its intervals moved with it and
    widened, in quadrature, by z x the carried error's sd when each probe is one run of relative sd
    `noise_rel` (`ProbeTrend.correct`). Why: a law's error that grows with distance is carried to the
    hero from the probes where it was measured (docs/notebook.md)."""
    carried, sd = trend.at(hero_compute), trend.sd_at(hero_compute, noise_rel)
    out = dict(final) | {"loss": float(final["loss"]) * (1 + carried)}
    for key, z in (("loss_50", Z50), ("loss_90", Z90)):
        interval = trend.correct(float(final["loss"]), final.get(key), hero_compute, noise_rel, z)[1]
        out[key] = None if interval is None else list(interval)
    out["uncorrected"] = {k: final.get(k) for k in ("loss", "loss_50", "loss_90", "source")}
    rule = (
        "least squares linear in log10(C / top budget)"
        if trend.carry == "linear"
        else f"{PROBE_CARRIES[trend.carry]} in log10(C / top budget)"
    )
    out["probe_correction"] = {
        "rule": f"primary law x (1 + its relative error at the probes, {rule}, carried to the hero's exact FLOPs)",
        "carry": trend.carry,
        "carried_rel": carried,
        "carried_sd_rel": sd,
        "noise_rel": noise_rel,
        "slope_per_decade": trend.slope,
        "intercept": trend.intercept,
        "top_budget": trend.top_budget,
        "probes": {n: {"log10_multiple": x, "rel_error": e} for n, x, e in zip(trend.names, trend.x, trend.errors)},
    }
    out["source"] = f"{final['source']}; x (1 {carried:+.2%}), the probes' error trend carried to the hero"
    out["interval"] = (
        f"{final.get('interval') or 'the fit interval'}; moved by the correction and widened in quadrature "
        f"by z x {sd:.2%} of the loss: the carried error's sd for probes of {noise_rel:.2%} noise each"
    )
    return out


def correction_text(final: dict, actual: float | None, *, primary_law: str) -> dict[str, str]:
    """How the sealed number came from the primary law: as it is, or corrected by the law's error
    trend at the probes (`correct_by_probes`), and what the law alone would
    have scored."""
    correction = final.get("probe_correction")
    if correction is None:
        return {
            "prediction_rule": f"made the law they confirmed, {primary_law}, the primary one",
            "correction_sentence": f"The sealed number is {primary_law}'s own prediction.",
            "law_alone_clause": "",
        }
    law, sealed = float(final["uncorrected"]["loss"]), float(final["loss"])
    errors = ", ".join(
        f"{p['rel_error']:+.2%} at {10 ** p['log10_multiple']:.0f}x"
        for p in sorted(correction["probes"].values(), key=lambda p: p["log10_multiple"])
    )
    outcome = (
        ""
        if actual is None
        else (
            f" Against the law alone the hero's error would have been {float(actual) / law - 1:+.2%}; "
            f"against the sealed number it is {float(actual) / sealed - 1:+.2%}."
        )
    )
    # The abstract states what the ladder's law alone would have scored.
    law_alone = (
        ""
        if actual is None
        else (
            f" Without the probes' correction, the ladder's law alone ({law:.4f}) would have "
            f"missed the hero by {float(actual) / law - 1:+.2%}."
        )
    )
    return {
        "prediction_rule": f"corrected the primary law, {primary_law}, by its error trend at them",
        "law_alone_clause": law_alone,
        "correction_sentence": (
            f"The sealed number is not the law's own: the law predicted {law:.4f} at the hero. Its relative error at the "
            f"probes ({errors}), {PROBE_CARRIES[correction.get('carry', 'linear')]} ({correction['slope_per_decade']:+.1%} per decade), carried to "
            f"the hero gives {correction['carried_rel']:+.2%} with an sd of {correction['carried_sd_rel']:.2%} (each probe "
            f"one run of {correction['noise_rel']:.2%} noise), so the preregistration sealed {sealed:.4f} = {law:.4f} x "
            f"(1 {correction['carried_rel']:+.2%}), its interval widened by that sd in quadrature.{outcome}"
        ),
    }
