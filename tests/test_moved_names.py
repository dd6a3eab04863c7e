"""Names moved to their concept's module (issues 32 and 43) stay importable from where they were, as
the same objects: other branches, scripts under paper/ and benchmarks/, and old notebooks import them
there."""

from __future__ import annotations

import importlib

import pytest

# (old module, new module, names moved from the one to the other)
MOVED: list[tuple[str, str, tuple[str, ...]]] = [
    # probe_holdouts, the probes' correction backtested, lives in delphi.fits.backtest (issue 43: the
    # backtest imports the probes, never the other way round)
    ("delphi.fits.backtest", "delphi.fits.probes", ("ProbeTrend", "probe_trend")),
    ("delphi.prereg.create", "delphi.fits.probes", ("CARRY_ASSUMPTION", "correct_by_probes", "correction_text")),
    (
        "delphi.prereg.create",
        "delphi.prereg.predict",
        (
            "final_from_prediction",
            "law_scatter_nats",
            "seed_noise_nats",
            "run_noise_nats",
            "predictive",
            "model_family",
            "fit_family",
            "hero_params",
            "fit_convention",
            "predict_hero",
            "predict_final",
            "score_probes",
            "probe_noise_rel",
            "hero_prediction",
            "beyond_ladder_runs",
            "load_tables",
            "run_predicted_vs_actual",
        ),
    ),
]


@pytest.mark.parametrize("old, new, names", MOVED, ids=lambda x: x if isinstance(x, str) else "")
def test_moved_names_import_from_their_old_module(old: str, new: str, names: tuple[str, ...]) -> None:
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(old_module, name) is getattr(new_module, name), f"{old}.{name}"
        exec(f"from {old} import {name}", {})  # the form other code uses


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    for old in ("delphi.fits.backtest", "delphi.fits.curves"):
        with pytest.raises(AttributeError):
            _ = importlib.import_module(old).no_such_name
