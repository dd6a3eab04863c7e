"""Checkpoints: every array of the training state in one .npz plus a JSON manifest.

Layout: run_dir/checkpoints/step_00000200/{arrays.npz, manifest.json}. A
checkpoint is written into a temporary directory and renamed into place, so a
kill never leaves a half-written `step_*` directory; the manifest carries the
sha256 of arrays.npz, so a file truncated or corrupted later (disk full, a bad
copy) is detected on restore and the previous checkpoint is used instead.

Sharded arrays are gathered to the host on save, so the files do not depend on the mesh and a
run can be restored onto any device count its config allows. The state is flattened with
`jax.tree.leaves`; restoring unflattens the leaves
into the structure of a freshly initialised state, after checking that every
shape and dtype matches. PRNG key arrays are stored as their raw key data.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from delphi.io import sha256_bytes, sha256_file

CHECKPOINT_PREFIX = "step_"
ARRAYS_FILE = "arrays.npz"
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class Restored:
    state: Any
    step: int
    extra: dict  # what the trainer stored beside the arrays (e.g. wall time so far)
    path: Path


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{CHECKPOINT_PREFIX}{step:08d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint directory, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith(CHECKPOINT_PREFIX) and path.name[len(CHECKPOINT_PREFIX) :].isdigit():
            found.append((int(path.name[len(CHECKPOINT_PREFIX) :]), path))
    return sorted(found)


def _to_numpy(leaf: Any) -> np.ndarray:
    """The full array on the host: a sharded array is gathered (from every process on a multi-host
    mesh), so a checkpoint does not depend on the mesh it was written from."""
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        from jax.experimental import multihost_utils

        leaf = multihost_utils.process_allgather(leaf, tiled=True)
    return np.asarray(leaf)


def save_checkpoint(run_dir: Path, step: int, state: Any, *, extra: dict | None = None, keep: int = 2) -> Path:
    """Write the checkpoint of `step` atomically and delete all but the newest `keep`."""
    leaves = [_to_numpy(leaf) for leaf in jax.tree.leaves(state)]
    buffer = io.BytesIO()
    np.savez(buffer, **{f"leaf_{i:05d}": leaf for i, leaf in enumerate(leaves)})
    data = buffer.getvalue()
    manifest = {
        "step": step,
        "n_leaves": len(leaves),
        "shapes": [list(leaf.shape) for leaf in leaves],
        "dtypes": [str(leaf.dtype) for leaf in leaves],
        "sha256": sha256_bytes(data),
        "bytes": len(data),
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "extra": extra or {},
    }
    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        for name, payload in ((ARRAYS_FILE, data), (MANIFEST_FILE, (json.dumps(manifest, indent=1) + "\n").encode())):
            with open(tmp / name, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
        if final.exists():  # re-saving a step (e.g. interrupted right after a scheduled save)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


class CorruptCheckpoint(Exception):
    pass


def _load(path: Path, template: Any) -> tuple[Any, dict]:
    manifest_path = path / MANIFEST_FILE
    arrays_path = path / ARRAYS_FILE
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"unreadable manifest ({e})") from None
    if not arrays_path.is_file():
        raise CorruptCheckpoint(f"{ARRAYS_FILE} missing")
    digest = sha256_file(arrays_path)
    if digest != manifest.get("sha256"):
        raise CorruptCheckpoint(f"sha256 mismatch ({digest[:12]} != {str(manifest.get('sha256'))[:12]})")
    template_leaves, treedef = jax.tree.flatten(template)
    with np.load(arrays_path) as npz:
        leaves = [npz[f"leaf_{i:05d}"] for i in range(manifest["n_leaves"])]
    if len(leaves) != len(template_leaves):
        raise CorruptCheckpoint(f"{len(leaves)} arrays, the model has {len(template_leaves)}")
    restored = []
    for i, (leaf, ref) in enumerate(zip(leaves, template_leaves)):
        is_key = isinstance(ref, jax.Array) and jax.dtypes.issubdtype(ref.dtype, jax.dtypes.prng_key)
        ref_np = _to_numpy(ref) if is_key else ref
        if tuple(leaf.shape) != tuple(ref_np.shape) or leaf.dtype != ref_np.dtype:
            raise CorruptCheckpoint(f"array {i} is {leaf.dtype}{list(leaf.shape)}, expected {ref_np.dtype}{list(ref_np.shape)}")
        restored.append(jax.random.wrap_key_data(leaf, impl=jax.random.key_impl(ref)) if is_key else leaf)
    return jax.tree.unflatten(treedef, restored), manifest


def restore_latest(run_dir: Path, template: Any) -> Restored | None:
    """Newest checkpoint that verifies, falling back (with a warning) past corrupt ones."""
    for step, path in reversed(list_checkpoints(run_dir)):
        try:
            state, manifest = _load(path, template)
        except CorruptCheckpoint as e:
            warnings.warn(f"checkpoint {path} is corrupt: {e}; falling back to the previous one", stacklevel=2)
            continue
        return Restored(state=state, step=int(manifest["step"]), extra=manifest.get("extra", {}), path=path)
    return None
