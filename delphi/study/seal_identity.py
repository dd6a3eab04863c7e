"""Whether a seal found at one of a study's seal paths is this study's own: sealed on this study's
ladder, results, primary fit and run config (by sha256), at its tolerance and seeds. A study keeps
its own seal and never adopts or replaces another's."""

from __future__ import annotations

from pathlib import Path

from delphi.errors import DelphiError
from delphi.hashes import sha256_file
from delphi.prereg_format import read, seal_status
from delphi.study.state import Study


def foreign_seal(study: Study, path: Path, config: Path, seeds: list[int] | None) -> str | None:
    """Why the file at `path` is not this study's seal of the run `config` at `seeds` (None: it is).
    A study keeps a seal it finds only if the seal names this study's own ladder manifest, results
    table, primary fit and run config by their sha256, and this spec's tolerance and seeds: anything else
    was sealed by another study (or another version of this one) and its verdict would not be this
    study's."""
    try:
        doc = read(path)
    except DelphiError as e:
        return f"it is not a preregistration ({e})"
    if not seal_status(doc)["ok"]:
        return "its seal is broken: it was edited after sealing"
    try:
        fit = study.fit_path(study.primary_fit)
    except DelphiError:
        fit = None  # primary_fit: auto before the fit stage: no fit of this study yet
    provenance = doc.get("provenance") or {}
    for key, own in (
        ("manifest_sha256", study.ladder_dir / "manifest.csv"),
        ("results_sha256", study.results),
        ("fit_sha256", fit),
        ("hero_config_sha256", config),
    ):
        sealed = provenance.get(key)
        if sealed is None:
            continue
        if own is None or not own.is_file():
            return (
                f"it seals provenance.{key} {str(sealed)[:12]}, and this study has no "
                f"{own if own is not None else 'primary fit'} yet: it was sealed by another study"
            )
        if (mine := sha256_file(own)) != sealed:
            return f"its provenance.{key} {str(sealed)[:12]} is not that of this study's {own} ({mine[:12]})"
    tolerance = (doc.get("decision") or {}).get("tolerance_rel")
    if tolerance != study.spec.hero.tolerance:
        return (
            f"its decision.tolerance_rel {tolerance!r} is not this study's hero.tolerance {study.spec.hero.tolerance!r}"
        )
    sealed_seeds = (doc.get("target") or {}).get("seeds") or None
    if sealed_seeds != seeds:
        return f"it seals the mean of seeds {sealed_seeds}, this study's run is at seeds {seeds}"
    return None


def sealed_seeds(study: Study, probe: bool) -> list[int] | None:
    """The seeds whose mean a seal of this study predicts: hero.seeds, except a probe under
    probe_correction (evidence for the hero, sealed as one run)."""
    if probe and study.spec.hero.probe_correction:
        return None
    return list(study.spec.hero.seeds) or None


def foreign_seal_message(path: Path, problem: str) -> str:
    return (
        f"{path}: a file is already at this study's seal path, and it is not this study's seal: {problem}. "
        "Nothing was trained or sealed; choose another `preregistration:` path (a seal is never adopted or "
        "replaced), or remove that file if it is yours to discard"
    )
