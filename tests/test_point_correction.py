"""A design's measured bias sealed as a correction (issue 43: hero.point_correction)."""

from __future__ import annotations

import math

import pytest

from delphi.errors import DelphiError
from delphi.fits.intervals import Z_90, PointCorrection, correct_by_design
from delphi.prereg.competing import competing_predictions
from delphi.study.spec import GatesSpec, HeroSpec, StudySpec, load_study

FINAL = {
    "loss": 2.0,
    "loss_50": [1.98, 2.02],
    "loss_90": [1.95, 2.06],
    "source": "isoflop fit",
    "calibrated": {"applied": False},
}


def test_the_point_moves_and_the_interval_moves_and_widens_by_the_bias_uncertainty() -> None:
    out = correct_by_design(FINAL, PointCorrection(rel=-0.01, sd_rel=0.004, source="seeds 0-9"))
    assert out["loss"] == pytest.approx(1.98)
    lo, hi = out["loss_90"]
    # The law's own half-widths (0.05 below, 0.06 above, scaled by 0.99) and z x 0.4% of the point, in quadrature.
    assert 1.98 - lo == pytest.approx(math.hypot(0.05 * 0.99, Z_90 * 0.004 * 1.98))
    assert hi - 1.98 == pytest.approx(math.hypot(0.06 * 0.99, Z_90 * 0.004 * 1.98))
    assert out["uncorrected"]["loss"] == 2.0 and out["uncorrected"]["loss_90"] == [1.95, 2.06]
    assert out["point_correction"]["source"] == "seeds 0-9" and "-1.00%" in out["source"]
    # With no uncertainty in the bias the interval only moves.
    still = correct_by_design(FINAL, PointCorrection(rel=0.02, sd_rel=0.0, source="s"))
    assert still["loss_50"] == pytest.approx([1.98 * 1.02, 2.02 * 1.02])


def test_the_law_alone_is_sealed_beside_and_the_ensembles_use_it(tmp_path) -> None:
    corrected = correct_by_design(FINAL, PointCorrection(rel=-0.05, sd_rel=0.0, source="s"))
    competing = competing_predictions({}, "isoflop", corrected, hero=None, results=tmp_path / "none.csv")
    assert competing["isoflop alone"]["loss"] == 2.0 and competing["isoflop alone"]["loss_90"] == [1.95, 2.06]


def test_bad_corrections_name_the_key() -> None:
    for correction, key in (
        (PointCorrection(0.7, 0.0, "s"), "hero.point_correction.rel"),
        (PointCorrection(-0.01, -0.1, "s"), "hero.point_correction.sd_rel"),
        (PointCorrection(-0.01, 0.0, " "), "hero.point_correction.source"),
    ):
        with pytest.raises(DelphiError, match=key):
            StudySpec(hero=HeroSpec(point_correction=correction)).validate("s.yaml")
    with pytest.raises(DelphiError, match="choose one"):
        StudySpec(
            gates=GatesSpec(probes=("p",)),
            hero=HeroSpec(probe_correction=True, point_correction=PointCorrection(-0.01, 0.0, "s")),
        ).validate("s.yaml")


def test_a_study_file_without_a_source_is_refused(tmp_path) -> None:
    (tmp_path / "ladder_default.yaml").write_text("")
    (tmp_path / "s.yaml").write_text("hero:\n  point_correction:\n    rel: -0.01\n    sd_rel: 0.004\n")
    with pytest.raises(DelphiError, match="source"):
        load_study(tmp_path / "s.yaml")


def test_the_default_study_seals_its_measured_bias_with_a_source() -> None:
    correction = load_study(None)[0].hero.point_correction
    assert correction is not None and correction.rel < 0 and correction.sd_rel > 0
    assert "summary.csv" in correction.source


def test_gate_interval_width_judges_the_sealed_interval_of_a_corrected_seal() -> None:
    """The public calibration shifts the isoFLOP law up where this design's law leans high: with a
    measured design bias sealed, the gate judges the interval that is sealed, not the calibrated one."""
    from delphi.fits.calibration import gate_uses_calibration
    from delphi.prereg.gates import gate_interval_width

    calibrated = {"applied": True, "loss": 2.05, "loss_90": [1.9, 2.2], "method": "isoflop", "factor": 3.0}
    law = FINAL | {"calibrated": calibrated}
    assert gate_uses_calibration(law)
    wide = gate_interval_width(law, tolerance_rel=0.025, factor=1.5)
    assert not wide.passed and wide.detail.startswith("calibrated")
    corrected = correct_by_design(law, PointCorrection(rel=-0.01, sd_rel=0.004, source="s"))
    assert not gate_uses_calibration(corrected)
    gate = gate_interval_width(corrected, tolerance_rel=0.025, factor=1.5)
    assert gate.passed and gate.detail.startswith("sealed (corrected") and gate.value < 0.0375
