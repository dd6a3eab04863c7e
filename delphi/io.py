"""Reading and writing files safely: atomic writes with the user's umask, and reads of a user's
file that fail with a DelphiError naming the file.

An output says which command wrote it (`delphi.written_by`); which paths may be written at all is
the path policy (`delphi.path_policy`).
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from delphi.errors import DelphiError
from delphi.hashes import sha256_bytes
from delphi.path_policy import check_input_file, refuse_directory_name, refuse_non_regular
from delphi.written_by import WRITTEN_BY_KEY, embed_marker, marker_format, marker_value, sidecar_path
from delphi.yaml_strict import load_yaml_text


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else by setting
    and restoring it (a window another thread could see; only on systems without /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# What open(path, "w") creates before the umask: mkstemp's 0600 would make every output private.
NEW_FILE_MODE = 0o666


NEW_DIR_MODE = 0o777  # what mkdir() creates before the umask


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, written_by: str | None = None) -> None:
    """Write `data` to a temporary file beside `path`, then rename it into place.

    A reader (or a crash) never sees a half-written file. The file gets the user's umask.
    With `written_by` (a command, e.g. "plot isoflop") the file carries that command's marker
    (module docstring): embedded in a PNG or SVG, else in a sidecar written after the file.

    Errors: an existing `path` that is not a regular file (a FIFO, device, socket, symbolic link or
    directory) is a DelphiError, whatever the caller checked before; a write the system refuses
    (ENOSPC, EDQUOT, EROFS, ENAMETOOLONG...) is a `WriteFailed` naming `path`. Either way `path`
    keeps its previous content and no temporary file is left.
    """
    refuse_directory_name(path)
    path = Path(path)
    if written_by is not None:
        data = embed_marker(path, data, written_by)
    try:
        refuse_non_regular(path, flag=None)
        path.parent.mkdir(parents=True, exist_ok=True)
        # The temporary name starts with (at most 100 characters of) the file's: a name near the
        # file system's limit must not fail only because of the temporary one.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, NEW_FILE_MODE & ~current_umask())
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except BrokenPipeError:
        raise
    except OSError as e:
        raise WriteFailed.of(path, e) from None
    if written_by is not None and marker_format(path) == "sidecar":
        sidecar = {WRITTEN_BY_KEY: marker_value(written_by), "file": path.name, "sha256": sha256_bytes(data)}
        atomic_write_bytes(sidecar_path(path), (json.dumps(sidecar, indent=2, sort_keys=True) + "\n").encode())


class WriteFailed(DelphiError, OSError):
    """A write the system refused (a full disk, a quota, a read-only mount, a name too long): a
    DelphiError (exit 2, one line naming the file) that is still the OSError it was (`errno`)."""

    @classmethod
    def of(cls, path: Path, error: OSError) -> "WriteFailed":
        reason = error.strerror or str(error)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            advice = "free some space and run the command again"
        elif error.errno == errno.ENAMETOOLONG:
            advice = "choose a shorter name"
        else:
            advice = "nothing was replaced"
        kept = "it keeps its previous content" if os.path.lexists(path) else "nothing was written"
        failed = cls(f"{path}: cannot write ({reason}); {kept}; {advice}")
        failed.errno, failed.strerror, failed.filename = error.errno, error.strerror, str(path)
        return failed

    def __str__(self) -> str:  # the message alone, not OSError's "[Errno N] ..."
        return str(self.args[0]) if self.args else ""


def atomic_write_text(path: str | os.PathLike, text: str, *, written_by: str | None = None) -> None:
    atomic_write_bytes(path, text.encode(), written_by=written_by)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, written_by: str | None = None) -> None:
    if written_by is not None:
        if not isinstance(obj, dict):
            raise TypeError(f"{path}: only a JSON object can say which command wrote it")
        obj = {**obj, WRITTEN_BY_KEY: marker_value(written_by)}
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def atomic_write_yaml(path: str | os.PathLike, obj: Any, *, written_by: str | None = None) -> None:
    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False), written_by=written_by)


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays show up in results; JSON wants plain Python.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_text(path: str | os.PathLike, *, what: str = "file") -> str:
    """The UTF-8 text of a user-supplied file; every way it can be unreadable is a DelphiError
    naming the file (not found, a directory, a FIFO or device (`check_input_file`), no
    permission, binary or other non-UTF-8 bytes)."""
    path = check_input_file(path, what)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DelphiError(f"{path}: cannot read ({e.strerror})") from None
    return decode_utf8(data, path, what)


def decode_utf8(data: bytes, path: str | os.PathLike, what: str = "file") -> str:
    """`data` as UTF-8 text; a byte that is not is a DelphiError naming its line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DelphiError(
            f"{path}: not a {what}: byte 0x{data[e.start]:02x} at line {line}, column {column} "
            f"(offset {e.start}) is not UTF-8 text"
        ) from None


def read_yaml(path: str | os.PathLike) -> Any:
    """Read a YAML file, turning a missing or unreadable file or a syntax error into a DelphiError."""
    return load_yaml_text(read_text(path, what="YAML file"), path)


def read_json(path: str | os.PathLike, *, what: str = "JSON file") -> Any:
    """Read a JSON file; a missing or unreadable file or a syntax error is a DelphiError naming it."""
    text = read_text(path, what=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DelphiError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
