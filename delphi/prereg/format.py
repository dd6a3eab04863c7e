"""The preregistration file format moved to `delphi.prereg_format`, in the base layer: the trainer's
command (`delphi train --prereg`) and the plot command read a preregistration, and both sit below
prereg (docs/design.md §2.2). Every name is importable from here as before."""

from __future__ import annotations

from delphi.prereg_format import (  # noqa: F401
    CANONICAL,
    NAN_BAND,
    REQUIRED_KEYS,
    SCHEMA_VERSION,
    SEAL_ALGORITHM,
    Band,
    Prereg,
    canonical_bytes,
    compute_seal,
    dump,
    load_prereg,
    outcome_path,
    predicted_loss_curve,
    read,
    seal,
    seal_status,
    write_new,
)
