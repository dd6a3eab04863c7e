"""The calibration file: writing it with its provenance, reading it, and checking it against its source data.

The committed file (delphi/fits/data/beyond_calibration.json, SCHEMA_VERSION) is fitted on every public
source, with its provenance, the per-source leave-one-source-out table behind method choice and the
largest calibrated factor per method. `load_checked_calibration` checks its schema, its numbers and the
sha256 of the data it was made from before any fit uses it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from delphi import __version__
from delphi.errors import DelphiError
from delphi.fits.beyond import ENSEMBLES
from delphi.fits.calibration_model import MODEL, SHIFT_AGREEMENT, MethodCalibration, calibrate, loso

SCHEMA_VERSION = 1
KIND = "delphi_beyond_calibration"
DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "beyond_calibration.json"

# A calibration's relative "inputs" are paths in this checkout (benchmarks/backtest_beyond.py writes them so).
REPO_ROOT = DEFAULT_PATH.parents[3]
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# The numbers calibrate_point reads from every method's entry, and the least each may be.
_ENTRY_NUMBERS = {"shift0": None, "shift1": None, "sd0": 0.0, "sd1": 0.0, "q50": 0.0, "q90": 0.0, "max_factor": 1.0}


def calibration_document(
    rows: pd.DataFrame,
    features: dict[str, dict[str, float]],
    *,
    command: str,
    inputs: dict[str, str],
    shift: str = "agree",
    created: str | None = None,
) -> dict[str, Any]:
    """The calibration file: fitted on every source in `rows`, with the LOSO table behind method choice."""
    scored = loso(rows, lambda r: calibrate(r, shift))
    per_source = []
    for (source, method), g in scored.groupby(["source", "method"], sort=True):
        g = g[g["cal_rel_error"].notna()]
        if g.empty:
            continue
        per_source.append(
            {
                "source": source,
                "method": method,
                "n": len(g),
                "mean_abs_rel_error": float(g["cal_rel_error"].abs().mean()),
                "mean_abs_rel_error_uncalibrated": float(g["rel_error"].abs().mean()),
                "coverage_50": float(g["cal_covered_50"].astype(float).mean()),
                "coverage_90": float(g["cal_covered_90"].astype(float).mean()),
            }
        )
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "model": MODEL,
        "shift_rule": shift,
        "shift_agreement": SHIFT_AGREEMENT,
        "ensembles": {
            name: {
                "members": list(members),
                "prediction": "geometric mean of the members' predictions",
                "selected_on_public_data": True,
            }
            for name, members in ENSEMBLES.items()
        },
        "created": created,
        "delphi_version": __version__,
        "command": command,
        "inputs": inputs,
        "sources": features,
        "methods": {m: c.to_json() for m, c in calibrate(rows, shift).items()},
        "loso": per_source,
    }


def load_calibration(path: str | Path | None = None) -> dict[str, Any]:
    """The calibration file (default: the committed one), its schema checked; adds "path" and "sha256"."""
    path = Path(path) if path is not None else DEFAULT_PATH
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except FileNotFoundError:
        raise DelphiError(f"{path}: calibration file not found") from None
    except (OSError, ValueError) as e:
        raise DelphiError(f"{path}: not a readable JSON calibration file ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise DelphiError(
            f"{path}: key 'kind' = {data.get('kind') if isinstance(data, dict) else None!r}, expected {KIND!r}"
        )
    if data.get("schema_version") != SCHEMA_VERSION:
        raise DelphiError(
            f"{path}: key 'schema_version' = {data.get('schema_version')!r}, this delphi reads {SCHEMA_VERSION}"
        )
    for key in ("methods", "sources", "loso"):
        if key not in data:
            raise DelphiError(f"{path}: missing key {key!r}")
    data["methods_parsed"] = {
        m: MethodCalibration.from_json(c, f"{path}: methods.{m}") for m, c in data["methods"].items()
    }
    data["path"] = str(path)
    data["sha256"] = hashlib.sha256(raw).hexdigest()
    return data


def calibration_provenance(calibration: dict[str, Any]) -> dict[str, Any]:
    """What a fit or study JSON records about the calibration it applied."""
    return {
        "applied": True,
        "path": shown_path(calibration),
        "sha256": calibration["sha256"],
        "schema_version": calibration["schema_version"],
        "model": calibration["model"],
        "sources": sorted(calibration["sources"]),
        "command": calibration.get("command"),
    }


def shown_path(calibration: dict[str, Any]) -> str:
    """The calibration's file as output shows it (the committed one by its place in the repository)."""
    path = Path(calibration["path"])
    return "delphi/fits/data/beyond_calibration.json (committed)" if path.resolve() == DEFAULT_PATH else str(path)


def check_calibration_source(calibration: dict[str, Any], root: Path = REPO_ROOT) -> dict[str, Any]:
    """The data a calibration was made from, against the sha256 it records ("inputs": path -> sha256;
    a relative path is one in this checkout, `root`). DelphiError naming the file when the record is
    missing or not a sha256, or when that data is here with other bytes: the calibration does not
    describe it. Data that is not here cannot be checked; the answer says so ("verified": False)."""
    where = calibration.get("path", "calibration")
    inputs = calibration.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        raise DelphiError(
            f"{where}: key 'inputs' = {inputs!r}, expected the sha256 of the data the calibration was "
            f"made from ({{path: sha256}})"
        )
    checked = []
    for name, recorded in inputs.items():
        if not isinstance(recorded, str) or not SHA256_HEX.fullmatch(recorded):
            raise DelphiError(f"{where}: key 'inputs' records {recorded!r} for {name}, not a sha256 (64 hex digits)")
        path = Path(name) if Path(name).is_absolute() else root / name
        try:
            actual = hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:
            checked.append({"path": name, "sha256": recorded, "verified": False, "note": "not found here; not checked"})
            continue
        except OSError as e:
            raise DelphiError(
                f"{where}: cannot read its source data {path} to check its sha256 ({e.strerror or e})"
            ) from None
        if actual != recorded:
            raise DelphiError(
                f"{where}: source hash mismatch: made from {name} with sha256 {recorded[:12]}..., but {path} "
                f"has sha256 {actual[:12]}...; the calibration does not describe this data"
            )
        checked.append({"path": name, "sha256": recorded, "verified": True})
    return {"inputs": checked, "verified": all(c["verified"] for c in checked)}


def load_checked_calibration(path: str | Path | None = None, root: Path = REPO_ROOT) -> dict[str, Any]:
    """`load_calibration` (kind and schema_version checked), every method entry's numbers checked
    (finite; sds and quantiles >= 0, max_factor >= 1) and its source hash checked
    (`check_calibration_source`, kept as "source_check"): any failure is a DelphiError naming the
    file, before any fit."""
    calibration = load_calibration(path)
    where = calibration["path"]
    for method, entry in calibration["methods_parsed"].items():
        for name, least in _ENTRY_NUMBERS.items():
            value = getattr(entry, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or (least is not None and value < least)
            ):
                need = "a finite number" + ("" if least is None else f" >= {least:g}")
                raise DelphiError(f"{where}: methods.{method}.{name} = {value!r}, expected {need}")
    calibration["source_check"] = check_calibration_source(calibration, root)
    return calibration
