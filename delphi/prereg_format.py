"""The preregistration file: a YAML document sealed with a sha256.

Layout (schema_version 1). Every key except `seal` is sealed:

    schema_version: 1
    id, created (UTC, ISO 8601 with microseconds), author
    toolkit: {version, git_commit, git_dirty}
    provenance: {manifest_sha256, results_sha256, fit_sha256, fit_kind, ...}
    hero: {config (the full TrainConfig), params, tokens, flops}
    prediction:
      final: {loss, loss_50, loss_90, bpb, bpb_50, bpb_90, source}
      trajectory: {points: [{step, tokens, loss, lo50, hi50, lo90, hi90}], ...}
    decision: {tolerance_rel, rule}
    rationale: free text;  assumptions: [free text]
    seal: {algorithm: sha256, canonical: ..., digest}

The seal is the sha256 of the canonical serialisation of everything but `seal`:
JSON with sorted keys, separators (",", ":"), ASCII only, floats in Python's
shortest round-trip repr. PyYAML writes floats with the same repr, so the YAML
round trip is exact and one changed digit changes the digest.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml

from delphi.errors import DelphiError, quoted
from delphi.io import atomic_write_text, read_yaml

SCHEMA_VERSION = 1
SEAL_ALGORITHM = "sha256"
CANONICAL = "json(sort_keys, separators=(',', ':'), ensure_ascii) of every key but 'seal'"
REQUIRED_KEYS = ("schema_version", "id", "created", "hero", "prediction", "decision")


def canonical_bytes(doc: dict) -> bytes:
    body = {k: v for k, v in doc.items() if k != "seal"}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise DelphiError(f"preregistration: not serialisable canonically ({e})") from None
    return text.encode("ascii")


def compute_seal(doc: dict) -> str:
    return hashlib.sha256(canonical_bytes(doc)).hexdigest()


def seal(doc: dict) -> dict:
    """Return `doc` with its `seal` block (re)computed; the seal goes last in the file."""
    body = {k: v for k, v in doc.items() if k != "seal"}
    return body | {"seal": {"algorithm": SEAL_ALGORITHM, "canonical": CANONICAL, "digest": compute_seal(body)}}


def dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=False, width=100)


def write_new(path: str | Path, doc: dict) -> None:
    """Write a sealed document; refuse to overwrite (a preregistration is written once)."""
    path = Path(path)
    if path.exists():
        raise DelphiError(f"{path}: already exists; a preregistration is never overwritten (choose a new name)")
    text = dump(doc)
    if compute_seal(yaml.safe_load(text)) != doc["seal"]["digest"]:
        raise RuntimeError("YAML round trip changed the sealed content")  # a bug, not bad input
    atomic_write_text(path, text)


def read(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DelphiError(f"{path}: preregistration file not found")
    doc = read_yaml(path)
    if not isinstance(doc, dict):
        raise DelphiError(f"{path}: expected a mapping at the top level")
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        raise DelphiError(f"{path}: missing key {quoted(missing[0])}; not a Delphi preregistration")
    if doc["schema_version"] != SCHEMA_VERSION:
        raise DelphiError(
            f"{path}: schema_version {quoted(doc['schema_version'])}, this toolkit reads {SCHEMA_VERSION}"
        )
    return doc


def seal_status(doc: dict) -> dict:
    """{'ok': bool, 'recorded': digest in the file, 'computed': digest of its content}."""
    recorded = (doc.get("seal") or {}).get("digest")
    computed = compute_seal(doc)
    return {"ok": recorded == computed, "recorded": recorded, "computed": computed}


def outcome_path(prereg_path: str | Path) -> Path:
    """NAME.yaml -> NAME.outcome.json, beside it (never inside the sealed file)."""
    p = Path(prereg_path)
    return p.with_name(p.name.removesuffix(".yaml").removesuffix(".yml") + ".outcome.json")


class Band(NamedTuple):
    """A predicted eval loss: median and 90% band (NaN outside the predicted range).

    Formats like its median, so a progress line can print f"{band:.4f}".
    """

    median: float
    lo90: float
    hi90: float

    def __format__(self, spec: str) -> str:
        return format(self.median, spec)


NAN_BAND = Band(math.nan, math.nan, math.nan)


@dataclass(frozen=True)
class Prereg:
    """A loaded preregistration: the trajectory as arrays for quick lookups."""

    path: Path
    doc: dict
    tokens: tuple[float, ...]
    loss: tuple[float, ...]
    lo90: tuple[float, ...]
    hi90: tuple[float, ...]
    lo50: tuple[float, ...]
    hi50: tuple[float, ...]

    @property
    def id(self) -> str:
        return self.doc["id"]

    @property
    def final(self) -> dict:
        return self.doc["prediction"]["final"]

    @property
    def tolerance_rel(self) -> float:
        return float(self.doc["decision"]["tolerance_rel"])

    def predicted_loss_at(self, tokens: float) -> Band:
        """(median, lo90, hi90) at `tokens`, interpolated in log tokens; NaNs outside the trajectory
        (before its first eval point), so a caller's progress line never breaks."""
        bands = self.bands_at(tokens)
        return NAN_BAND if bands is None else Band(bands["loss"], bands["lo90"], bands["hi90"])

    def bands_at(self, tokens: float) -> dict[str, float] | None:
        xs = self.tokens
        if not xs or tokens < xs[0] * (1 - 1e-9) or tokens > xs[-1] * (1 + 1e-9):
            return None
        i = min(max(bisect.bisect_left(xs, tokens), 1), len(xs) - 1) if len(xs) > 1 else 0
        if len(xs) == 1:
            w, i0, i1 = 0.0, 0, 0
        else:
            i0, i1 = i - 1, i
            w = (math.log(tokens) - math.log(xs[i0])) / (math.log(xs[i1]) - math.log(xs[i0]))
            w = min(max(w, 0.0), 1.0)
        return {
            name: (1 - w) * getattr(self, name)[i0] + w * getattr(self, name)[i1]
            for name in ("loss", "lo50", "hi50", "lo90", "hi90")
        }


def predicted_loss_curve(path: str | Path) -> "Callable[[float], Band]":
    """tokens -> predicted eval loss band of a preregistration: what the trainer's progress line
    shows beside the actual loss (`delphi train --prereg FILE`). Read, and any error raised, before
    training starts."""
    path = Path(path)
    if not path.is_file():
        raise DelphiError(f"--prereg: {path}: file not found")
    return load_prereg(path).predicted_loss_at


def load_prereg(path: str | Path) -> Prereg:
    """Read a preregistration for lookups (the trainer's progress line, `prereg check`)."""
    doc = read(path)
    try:
        points = doc["prediction"]["trajectory"]["points"]
        cols = {k: tuple(float(p[k]) for p in points) for k in ("tokens", "loss", "lo50", "hi50", "lo90", "hi90")}
    except (KeyError, TypeError, ValueError) as e:
        raise DelphiError(f"{path}: prediction.trajectory.points: malformed ({e})") from None
    return Prereg(path=Path(path), doc=doc, **cols)
