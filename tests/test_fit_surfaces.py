"""The typed fit layer: one frozen surface per law kind, the status enum, the result protocol."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import yaml

from delphi.errors import DelphiError
from delphi.fits import curves as cv
from delphi.fits.allocation import FlopsFamily, flops_of, optimal_allocation
from delphi.fits.laws import (
    ND_KINDS,
    SURFACES,
    ChinchillaSurface,
    FrontierSurface,
    IsoflopSurface,
    LawKind,
    MoeSurface,
    chinchilla_loss,
    chinchilla_optimum,
    point_prediction,
    surface_class,
)
from delphi.fits.results import FitLike, FitResult, FitStatus, fit_from_json, fit_status

CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}  # Hoffmann et al. 2022, rounded
MOE = {"E": 1.7, "G": 150.0, "gamma": 0.5, "A": 300.0, "B": 400.0, "alpha": 0.33, "beta": 0.3}
ISOFLOP = {"a": 0.5, "b": 0.5, "loss_exponent": -0.05, "log10_N0": -1.0, "log10_D0": -0.2, "log10_L0": 1.3}
FRONTIER = {"E": 1.7, "A": 40.0, "gamma": 0.08}
PARAMS = {"parametric": CHINCHILLA, "moe": MOE, "isoflop": ISOFLOP, "envelope": ISOFLOP, "frontier": FRONTIER}
# Exact FLOPs per token above 6 N at small N (attention, embeddings), as a real family's are.
FAMILY = FlopsFamily((1e6, 1e8, 1e10), (1.2e7, 7e8, 6.2e10), "nonembedding", "test family")


def test_every_kind_has_one_surface_and_plain_strings_find_it():
    assert set(SURFACES) == set(LawKind)
    for kind in LawKind:
        assert SURFACES[kind.value] is SURFACES[kind] and SURFACES[kind].kind == kind
    assert ND_KINDS == ("parametric", "moe")
    with pytest.raises(DelphiError, match="unknown fit kind 'curve_law'"):
        surface_class("curve_law")


@pytest.mark.parametrize("kind", [k.value for k in LawKind])
def test_surfaces_are_frozen_and_built_from_the_params_dict(kind):
    surface = SURFACES[kind].from_params({**PARAMS[kind], "unused": 1.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        surface.E = 0.0
    with pytest.raises(KeyError):
        SURFACES[kind].from_params({})


def test_chinchilla_surface_is_the_closed_form_and_the_exact_allocation():
    surface = ChinchillaSurface.from_params(CHINCHILLA)
    n, d = np.array([1e8, 1e9]), np.array([2e9, 3e10])
    np.testing.assert_array_equal(surface.loss(n, d), chinchilla_loss(CHINCHILLA, n, d))
    compute = np.array([1e20, 1e22])
    closed = surface.optimum(compute)
    np.testing.assert_array_equal(closed.params, chinchilla_optimum(CHINCHILLA, compute)["params"])
    exact = surface.optimum(compute, FAMILY)
    reference = optimal_allocation(lambda n, d: chinchilla_loss(CHINCHILLA, n, d), compute, FAMILY)
    np.testing.assert_array_equal(exact.loss, reference["loss"])
    # the exact optimum costs the budget under the family's FLOPs, not under 6 N D
    np.testing.assert_allclose(flops_of(FAMILY, exact.params, exact.tokens), compute, rtol=1e-9)
    assert not np.allclose(exact.params, closed.params, rtol=1e-3)
    assert surface.derived() == pytest.approx({"a": 0.28 / 0.62, "b": 0.34 / 0.62})


def test_chinchilla_surface_without_a_term_has_no_optimum():
    surface = ChinchillaSurface.from_params({**CHINCHILLA, "B": 0.0})
    for family in (None, FAMILY):
        assert np.isnan(surface.optimum(1e21, family).loss)


def test_moe_surface_is_the_dense_law_at_its_expert_term():
    surface = MoeSurface.from_params(MOE, term="experts")
    dense = surface.at(8.0)
    assert dense.A == pytest.approx(MOE["G"] * 8.0 ** -MOE["gamma"] + MOE["A"])
    assert surface.optimum(1e21, FAMILY, experts=8.0) == dense.optimum(1e21, FAMILY)
    assert surface.loss(1e8, 1e10, experts=8.0) == dense.loss(1e8, 1e10)
    # one X per run: the residuals of a ladder with several granularities in one call
    x = np.array([1.0, 4.0, 16.0])
    per_run = surface.loss(np.full(3, 1e8), np.full(3, 1e10), experts=x)
    assert list(per_run) == [surface.loss(1e8, 1e10, experts=v) for v in x]
    assert per_run[0] > per_run[1] > per_run[2]  # finer experts, lower loss (G > 0)
    with pytest.raises(DelphiError, match="experts"):
        surface.optimum(1e21, granularity=8.0)


@pytest.mark.parametrize("surface_type", [IsoflopSurface, FrontierSurface])
def test_laws_in_compute_alone_have_no_loss_at_n_and_d(surface_type):
    surface = surface_type.from_params(PARAMS[surface_type.kind])
    with pytest.raises(DelphiError, match="compute only"):
        surface.loss(1e8, 1e10)
    opt = surface.optimum(np.array([1e20, 1e22]), FAMILY)  # a family changes nothing: fitted in C
    assert np.all(np.diff(opt.loss) < 0)
    if surface_type is FrontierSurface:
        assert opt.params is None and opt.tokens is None
    else:
        np.testing.assert_allclose(opt.params, 10 ** ISOFLOP["log10_N0"] * np.array([1e20, 1e22]) ** ISOFLOP["a"])


@pytest.mark.parametrize("kind", [k.value for k in LawKind])
def test_fit_result_predicts_through_its_surface(kind):
    family = FAMILY if kind in ND_KINDS else None
    fit = FitResult(
        kind=kind,
        method="test",
        params=PARAMS[kind],
        family=family,
        extra={"term": "granularity"} if kind == "moe" else {},
    )
    assert fit.kind == LawKind(kind) and fit.law_in_nd == (kind in ND_KINDS)
    terms = {"granularity": 4.0} if kind == "moe" else {}
    pred = fit.predict(compute=1e21, **terms)
    opt = fit.surface.optimum(1e21, family, **terms)
    assert pred["loss"] == float(opt.loss)
    assert pred == fit.predict(compute=1e21, **terms) and pred["allocation"] == (
        "exact" if family else "6ND" if kind in ND_KINDS else "fitted in C"
    )
    assert point_prediction(kind, PARAMS[kind], family=family, compute=1e21, **terms)["loss"] == opt.loss


def test_status_is_a_str_enum_and_the_json_stays_plain(tmp_path):
    assert fit_status(False, ["E"]) is FitStatus.NOT_CONVERGED
    assert fit_status(True, ["E"]) is FitStatus.AT_BOUND and fit_status(True, []) is FitStatus.OK
    fit = FitResult(
        kind="parametric", method="vpnls", params=CHINCHILLA, status="at_bound", diagnostics={"at_bound": ["E"]}
    )
    assert fit.status is FitStatus.AT_BOUND and fit.status == "at_bound" and f"{fit.status}" == "at_bound"
    data = fit.to_json()
    assert type(data["status"]) is str and type(data["kind"]) is str
    yaml.safe_dump(data)  # the preregistration is YAML: no enum object may reach it
    back = fit_from_json(json.loads(json.dumps(data)))
    assert back.status is FitStatus.AT_BOUND and back.kind is LawKind.PARAMETRIC
    with pytest.raises(DelphiError, match="fit status 'stuck'"):
        FitResult(kind="parametric", method="vpnls", params=CHINCHILLA, status="stuck")


def test_a_kind_this_version_does_not_know_loads_but_does_not_predict():
    fit = fit_from_json({"kind": "hyperbolic", "method": "new", "params": {"E": 1.0}})
    assert fit.kind == "hyperbolic" and not fit.law_in_nd and fit.derived == {} and fit.allocation == "fitted in C"
    with pytest.raises(DelphiError, match="unknown fit kind 'hyperbolic'"):
        fit.predict(compute=1e21)


# ----------------------------------------------------------------------------- the result protocol
def _curve_law(**params: float) -> cv.CurveLawFit:
    theta = {"E": 1.8, "A": 50.0, "alpha": 0.3, "B": 30.0, "beta": 0.25, "C": 0.001, **params}
    samples = np.array([[theta[k] * (1 + 0.01 * i) for k in cv.PARAM_NAMES] for i in range(-5, 6)])
    return cv.CurveLawFit(
        params=theta,
        samples=samples,
        residual_sd=0.003,
        momentum_decay=cv.TISSUE_MOMENTUM_DECAY,
        min_progress=cv.DEFAULT_MIN_PROGRESS,
        n_points=40,
        n_runs=4,
        run_params=[1e6, 3e6, 1e7, 3e7],
        bootstrap="runs",
        seed=0,
    )


def _check_fit_like(fit: FitLike) -> None:
    assert isinstance(fit, FitLike)
    assert isinstance(fit.summary(), str) and fit.summary()
    data = fit.to_json()
    assert json.loads(json.dumps(data)) == data and data["kind"] == fit.kind
    assert isinstance(fit.status, FitStatus)
    assert fit.params and all(isinstance(v, float) for v in fit.params.values())
    for name, (lo, hi) in fit.intervals.items():
        assert name in fit.params and lo <= hi
    assert isinstance(fit.diagnostics.at_bound, tuple)
    assert (fit.status == FitStatus.AT_BOUND) == bool(fit.diagnostics.at_bound)


def test_fit_result_and_curve_law_conform_to_one_result_protocol():
    fit = FitResult(
        kind="parametric", method="vpnls", params=CHINCHILLA, intervals={"E": (1.6, 1.8)}, diagnostics={"at_bound": []}
    )
    _check_fit_like(fit)
    curve = _curve_law()
    _check_fit_like(curve)
    assert curve.status is FitStatus.OK and curve.intervals["E"][0] < 1.8 < curve.intervals["E"][1]
    assert curve.to_json()["intervals"]["E"] == list(curve.intervals["E"])
    assert not isinstance(object(), FitLike)


def test_curve_law_on_a_bound_says_so():
    at_zero = _curve_law(E=0.0)
    assert at_zero.status is FitStatus.AT_BOUND and at_zero.diagnostics.at_bound == ("E",)
    on_edge = _curve_law(beta=cv.EXPONENT_BOUNDS[1])
    assert on_edge.at_bound == ["beta"]
    # one model size: the N term is not searched, so its placeholders are not "on a bound"
    single = dataclasses.replace(_curve_law(A=0.0), run_params=[1e6, 1e6])
    assert single.status is FitStatus.OK
    no_draws = dataclasses.replace(_curve_law(), samples=np.zeros((0, 6)))
    assert no_draws.intervals == {} and no_draws.to_json()["intervals"]["E"] is None
