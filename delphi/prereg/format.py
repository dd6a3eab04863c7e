"""The preregistration file format moved to `delphi.prereg_format`, in the base layer: the trainer's
command (`delphi train --prereg`) and the plot command read a preregistration, and both sit below
prereg (docs/design.md §2.2). Every name is importable from here as before."""

from __future__ import annotations

from delphi.prereg_format import (  # noqa: F401
    SCHEMA_VERSION,
    SEAL_ALGORITHM,
    CANONICAL,
    REQUIRED_KEYS,
    canonical_bytes,
    compute_seal,
    seal,
    dump,
    write_new,
    read,
    seal_status,
    outcome_path,
    Band,
    NAN_BAND,
    Prereg,
    predicted_loss_curve,
    load_prereg,
)
