"""Checkpoints: the training state through Orbax, sharded, plus a manifest that commits it.

Layout: run_dir/checkpoints/step_00000200/
    state/          an Orbax PyTree checkpoint (OCDBT + zarr3): every process writes the shards
                    it owns into state/ocdbt.process_<i>/, replicated arrays are written once
    manifest.json   written by process 0 after every process has finished: step, extra state
                    (wall_s), shapes and dtypes of the leaves, and the size and sha256 of every
                    file under state/

The manifest is the commit marker. A step directory without one (a kill during the save) or
whose files no longer match it (truncated, corrupted by a bad copy or a full disk) is corrupt,
and the restore falls back to the previous checkpoint. A step directory is written under a
temporary name by Orbax and renamed into place, so a kill never leaves a half-written `state/`.

Restoring reads each array straight into the shardings of the mesh the run resumes on (each
process reads only the shards it holds), so a checkpoint written on one mesh or process count
restores onto any other the config allows. Multi-host runs need the run directory on a
filesystem every process sees (Orbax's own requirement: process 0 finalizes the directory).

The state is flattened with `jax.tree.leaves` into {"leaf_00000": ...}; restoring unflattens
into the structure of a freshly initialised state after checking every shape and dtype. PRNG key
arrays are stored as their raw key data.

The former npz format (every array gathered onto one host) is gone: it could not hold a model
larger than one host's memory, and the Orbax path restores onto any mesh as it did.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import jax
import numpy as np

from delphi.errors import SYSTEM_ERRNOS, DelphiError, quoted
from delphi.hashes import sha256_file
from delphi.io import atomic_write_json
from delphi.train.rundir import CHECKPOINTS_DIR

CHECKPOINT_PREFIX = "step_"
STATE_DIR = "state"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "orbax-pytree-1"
PROCESS_DIR_PREFIX = "ocdbt.process_"  # Orbax's per-process OCDBT directory inside state/
WRITER_THREADS_JOIN_S = 10.0  # how long a refused write waits for Orbax's writer threads to end


@dataclass(frozen=True)
class Restored:
    state: Any
    step: int
    extra: dict
    path: Path


@dataclass(frozen=True)
class Restoration:
    """What `restore_latest` found: the newest good checkpoint (or None) and the corrupt ones past it."""

    restored: Restored | None
    corrupt: list[tuple[Path, str]] = field(default_factory=list)

    def message(self, run_dir: Path) -> str | None:
        """One line for stderr when a corrupt checkpoint was skipped, else None."""
        if not self.corrupt:
            return None
        skipped = "; ".join(f"{path.name}: {why}" for path, why in self.corrupt)
        if self.restored is None:
            return f"{run_dir}: every checkpoint is corrupt ({skipped}); restarting from step 0"
        return f"{run_dir}: skipped corrupt checkpoint(s) ({skipped}); resuming from step {self.restored.step} ({self.restored.path})"


class CorruptCheckpoint(Exception):
    pass


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / f"{CHECKPOINT_PREFIX}{step:08d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every step directory, oldest first (complete or not: see `restore_latest`)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith(CHECKPOINT_PREFIX) and path.name[len(CHECKPOINT_PREFIX) :].isdigit():
            found.append((int(path.name[len(CHECKPOINT_PREFIX) :]), path))
    return sorted(found)


def is_primary() -> bool:
    """Process 0 writes the files every process shares (manifest, deletions)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """All processes of a multi-host job reach this point before any goes on (no-op on one)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _arrays(state: Any) -> dict[str, Any]:
    return {
        f"leaf_{i:05d}": jax.random.key_data(leaf) if _is_key(leaf) else leaf
        for i, leaf in enumerate(jax.tree.leaves(state))
    }


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.Checkpointer(ocp.PyTreeCheckpointHandler())


def _file_table(state_dir: Path) -> dict[str, dict]:
    return {
        str(p.relative_to(state_dir)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(state_dir.rglob("*"))
        if p.is_file()
    }


def bytes_per_process(manifest: dict) -> dict[int, int]:
    """Bytes of array data each process wrote (its Orbax OCDBT directory)."""
    out: dict[int, int] = {}
    for rel, entry in manifest["files"].items():
        top = rel.split("/", 1)[0]
        if top.startswith(PROCESS_DIR_PREFIX):
            index = int(top[len(PROCESS_DIR_PREFIX) :])
            out[index] = out.get(index, 0) + entry["bytes"]
    return out


def save_checkpoint(run_dir: Path, step: int, state: Any, *, extra: dict | None = None, keep: int | None = 2) -> Path:
    """Write the checkpoint of `step` (every process takes part) and delete all but the newest `keep`
    (None: delete none; a seed group prunes with `prune_checkpoints` once every member has saved)."""
    final = checkpoint_dir(run_dir, step)
    if is_primary():
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # re-saving a step (e.g. one found corrupt on resume)
            shutil.rmtree(final)
    barrier(f"delphi_checkpoint_clear_{step}")
    arrays = _arrays(state)
    # Orbax refuses relative paths (a run dir given as `runs/study/...` is one): hand it absolute ones.
    # Orbax's writer threads print their own tracebacks of a failed write (and of its event loop
    # closing) on stderr: held while it saves, shown unless the write was refused by the system, which
    # is then one line (`_refused_write`).
    held = io.StringIO()
    threads_before = set(threading.enumerate())
    try:
        with contextlib.redirect_stderr(held):
            _checkpointer().save(
                (final / STATE_DIR).absolute(), args=_save_args(arrays)
            )  # returns once every process is done
    except Exception as e:
        refused = _refused_write(e, final, step)
        if refused is None:
            sys.stderr.write(held.getvalue())
            raise
        with contextlib.redirect_stderr(held):  # the refused write's threads end here, their noise held
            deadline = time.monotonic() + WRITER_THREADS_JOIN_S
            for thread in set(threading.enumerate()) - threads_before:
                thread.join(max(0.0, deadline - time.monotonic()))
        quiet_foreign_threads()
        shutil.rmtree(final, ignore_errors=True)  # an incomplete checkpoint is never one to resume from
        raise refused from None
    sys.stderr.write(held.getvalue())
    if is_primary():
        manifest = {
            "format": MANIFEST_FORMAT,
            "step": step,
            "n_leaves": len(arrays),
            "shapes": [list(a.shape) for a in arrays.values()],
            "dtypes": [str(a.dtype) for a in arrays.values()],
            "processes": jax.process_count(),
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "extra": extra or {},
            "files": _file_table(final / STATE_DIR),
        }
        atomic_write_json(final / MANIFEST_FILE, manifest)
        if keep is not None:
            prune_checkpoints(run_dir, keep)
    barrier(f"delphi_checkpoint_done_{step}")
    return final


class _ForeignThreadsQuiet(io.TextIOBase):
    """A stderr that drops what threads Python did not start write to it, and passes the rest on."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if isinstance(threading.current_thread(), threading._DummyThread):
            return len(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def quiet_foreign_threads() -> None:
    """From now on, drop stderr text from threads Python did not start.

    A refused write leaves tensorstore's C++ writers finishing the abandoned write after Orbax has
    closed its event loop; each then prints an "Event loop is closed" traceback from its own thread,
    at any moment until the process ends. Those threads are invisible to `threading`, so they cannot
    be joined; what they print says nothing the one-line refusal did not."""
    if not isinstance(sys.stderr, _ForeignThreadsQuiet):
        sys.stderr = _ForeignThreadsQuiet(sys.stderr)


# How tensorstore (under orbax) reports the OS error behind a failed write: "... [os_error_code='28']".
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)'?|\[Errno (\d+)\]")


def _refused_write(error: Exception, final: Path, step: int) -> OSError | None:
    """The OSError behind a checkpoint write the system refused (a full disk, a quota, a file too
    large, a read-only mount), naming the checkpoint; None for any other failure."""
    code = error.errno if isinstance(error, OSError) else None
    if code is None and (match := _OS_ERROR_CODE.search(str(error))):
        code = int(match.group(1) or match.group(2))
    if code not in SYSTEM_ERRNOS:
        return None
    return OSError(code, f"cannot write the checkpoint of step {step}: {os.strerror(code)}", str(final))


def check_checkpoint_path(run_dir: Path) -> None:
    """A run dir the checkpoint writer can take: tensorstore (under orbax) needs its path as UTF-8
    text, and a name that is not (bytes from another encoding) failed every checkpoint. DelphiError
    before anything is written."""
    try:
        str(Path(run_dir).absolute()).encode("utf-8")
    except UnicodeEncodeError:
        raise DelphiError(
            f"{quoted(str(run_dir))}: the run dir's path is not valid UTF-8, which the checkpoint "
            "writer needs; choose a name in UTF-8"
        ) from None


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` step directories (process 0)."""
    if is_primary():
        for _, old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def _save_args(arrays: dict):
    import orbax.checkpoint as ocp

    return ocp.args.PyTreeSave(arrays)


def read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads((Path(path) / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        raise CorruptCheckpoint("no manifest.json (the save did not finish)") from None
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"unreadable manifest.json ({type(e).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CorruptCheckpoint("not an Orbax checkpoint of this delphi version")
    return manifest


def _verify_files(state_dir: Path, files: dict[str, dict]) -> None:
    for rel, entry in files.items():
        path = state_dir / rel
        if not path.is_file():
            raise CorruptCheckpoint(f"{STATE_DIR}/{rel} missing")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise CorruptCheckpoint(f"{STATE_DIR}/{rel} has {size} bytes, the manifest says {entry['bytes']}")
        if sha256_file(path) != entry["sha256"]:
            raise CorruptCheckpoint(f"{STATE_DIR}/{rel} does not match its sha256")


def _load(path: Path, template: Any, shardings: Any) -> tuple[Any, dict]:
    import orbax.checkpoint as ocp

    manifest = read_manifest(path)
    _verify_files(path / STATE_DIR, manifest.get("files", {}))
    template_leaves, treedef = jax.tree.flatten(template)
    sharding_leaves = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    if manifest["n_leaves"] != len(template_leaves):
        raise CorruptCheckpoint(f"{manifest['n_leaves']} arrays, the model has {len(template_leaves)}")
    target = {}
    for i, (ref, sharding) in enumerate(zip(template_leaves, sharding_leaves)):
        ref_data = jax.random.key_data(ref) if _is_key(ref) else ref
        shape, dtype = tuple(ref_data.shape), np.dtype(ref_data.dtype)
        if tuple(manifest["shapes"][i]) != shape or manifest["dtypes"][i] != str(dtype):
            raise CorruptCheckpoint(
                f"array {i} is {manifest['dtypes'][i]}{manifest['shapes'][i]}, expected {dtype}{list(shape)}"
            )
        target[f"leaf_{i:05d}"] = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    try:
        arrays = _checkpointer().restore(
            (path / STATE_DIR).absolute(),
            args=ocp.args.PyTreeRestore(target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)),
        )
    except Exception as e:  # whatever tensorstore says about damaged data
        raise CorruptCheckpoint(f"Orbax could not read it ({type(e).__name__})") from None
    leaves = [
        jax.random.wrap_key_data(arrays[f"leaf_{i:05d}"], impl=jax.random.key_impl(ref))
        if _is_key(ref)
        else arrays[f"leaf_{i:05d}"]
        for i, ref in enumerate(template_leaves)
    ]
    return jax.tree.unflatten(treedef, leaves), manifest


def restore_latest(run_dir: Path, template: Any, shardings: Any, *, at_most: int | None = None) -> Restoration:
    """The newest checkpoint (of a step <= `at_most`, if given) that verifies, placed with
    `shardings` (a tree like `template`), and the corrupt ones skipped on the way. Every process
    reads the same files and so takes the same decision."""
    corrupt: list[tuple[Path, str]] = []
    for step, path in reversed(list_checkpoints(run_dir)):
        if at_most is not None and step > at_most:
            continue
        try:
            state, manifest = _load(path, template, shardings)
        except CorruptCheckpoint as e:
            corrupt.append((path, str(e)))
            continue
        restored = Restored(state=state, step=int(manifest["step"]), extra=manifest.get("extra", {}), path=path)
        return Restoration(restored, corrupt)
    return Restoration(None, corrupt)


def remove_checkpoints(paths: list[Path]) -> None:
    """Process 0 deletes `paths` (corrupt checkpoints past the one resumed from); all wait for it."""
    if is_primary():
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
    barrier("delphi_checkpoint_remove")
