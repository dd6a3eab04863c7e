"""The path policy: which paths a command may read, and which it may write or replace.

- A command replaces an existing file only if Delphi wrote it and the file says which command
  did (`delphi.written_by`); anything else is exit 2 naming the file unless the command's `--force`.
- A command never writes over one of its own inputs, nor over a file read beside one (TABLE's
  TABLE.family.json, any FILE.delphi.json), `--force` or not.
- Only regular files are written or replaced: an existing FIFO, device, socket or symbolic link
  at an output path is refused (exit 2), `--force` or not; so is `--out NAME/` for a file when
  NAME/ does not exist. A sidecar an output writes follows the same rules as the output.
- A write the system refuses (a full disk, a quota, a read-only mount) is a `WriteFailed` (exit 2)
  naming the file; the file keeps its previous content (`delphi.io`).
- Files get the user's umask, as a plain `open()` would give them (`delphi.io`).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from delphi.errors import DelphiError, quoted
from delphi.written_by import SIDECAR_SUFFIX, marker_format, sidecar_path, written_by


def file_kind(path: str | os.PathLike, *, follow_symlinks: bool = False) -> str | None:
    """What an existing `path` is when it is not a regular file ("a FIFO", "a character device",
    "a symbolic link (to T)", ...); None when it is a regular file or does not exist."""
    path = Path(path)
    try:
        mode = (os.stat if follow_symlinks else os.lstat)(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (a named pipe or a process substitution)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def refuse_non_regular(path: str | os.PathLike, *, flag: str | None = "--out", shown: Any = None) -> None:
    """Refuse (DelphiError, exit 2), `--force` or not, to write over an existing `path` that is not
    a regular file: replacing a FIFO, a device (/dev/null, as root) or a socket with a file breaks
    whatever uses it, and replacing a symbolic link drops the link, not the file it names. Opens
    nothing (a FIFO would block)."""
    kind = file_kind(path)
    if kind is None:
        return
    where = f"{flag} {shown if shown is not None else path}" if flag else str(path)
    if shown is not None and Path(str(shown)) != Path(path):
        where += f" ({path})"
    if kind == "a directory":
        raise DelphiError(f"{where}: is a directory; expected a file name")
    advice = (
        "give the path of the file it points to, or another name"
        if kind.startswith("a symbolic link")
        else "choose a regular file name"
    )
    raise DelphiError(
        f"{where}: exists and is {kind}, not a regular file; delphi writes only regular files, --force or not: {advice}"
    )


def ends_in_separator(path: str | os.PathLike) -> bool:
    """Whether `path` was given with a trailing separator (`newdir/`): it names a directory. Only
    the text says so; Path() drops the separator."""
    text = os.fspath(path)
    return text.endswith(os.sep) or bool(os.altsep and text.endswith(os.altsep))


def refuse_directory_name(path: str | os.PathLike, *, flag: str | None = None) -> None:
    """Refuse (DelphiError) a file to be written under a name that ends in a separator: `newdir/`
    must never become a file named `newdir`."""
    if not ends_in_separator(path):
        return
    text = os.fspath(path)
    where = f"{flag} {text}" if flag else text
    if Path(text).is_dir():
        raise DelphiError(f"{where}: is a directory; expected a file name")
    raise DelphiError(
        f"{where}: ends in {text[-1]!r}, so it names a directory, and {Path(text)} does not exist; "
        f"expected a file name: drop the {text[-1]!r}, or create {Path(text)} and name a file in it"
    )


def check_replaceable(path: str | os.PathLike, command: str, *, force: bool = False, flag: str = "--out") -> None:
    """Refuse (DelphiError, exit 2) to replace an existing `path` that `command` did not write,
    unless `force`. Creates nothing."""
    path = Path(path)
    refuse_non_regular(path, flag=flag)  # --force or not
    if force or not path.exists() or path.is_dir():
        return
    writer = written_by(path)
    if writer == command:
        return
    said = f"it was written by `delphi {writer}`" if writer is not None else "it does not say that delphi wrote it"
    raise DelphiError(
        f"{flag} {path}: exists and {said}; `delphi {command}` replaces only its own files: "
        "choose another name, or pass --force to replace it"
    )


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists (where a write would have to create things)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _check_writable_dir(directory: Path, flag: str, shown: Path) -> None:
    """Probe by creating (and removing) a temporary file: os.access says yes to root on a
    read-only mount, and a probe is what the atomic write itself will need."""
    if not directory.is_dir():
        raise DelphiError(f"{flag} {shown}: {directory} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".delphi-write-probe.", dir=directory)
    except OSError as e:
        raise DelphiError(f"{flag} {shown}: directory {directory} is not writable ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _inside(path: Path, directory: Path) -> bool:
    try:
        return path.resolve().is_relative_to(directory.resolve())
    except OSError:
        return False


# Files Delphi reads beside an input FILE: FILE.family.json (the FLOPs family `delphi fit` and
# `delphi plot` read beside a results table; delphi.fits.data.FAMILY_SUFFIX) and FILE.delphi.json
# (which command wrote FILE). Writing over one changes what the input means to every later command.
INPUT_SIDECAR_SUFFIXES = (".family.json", SIDECAR_SUFFIX)


NAME_MAX_FALLBACK = 255  # bytes per file name where the file system does not say (ext4, xfs, apfs: 255)


def _with_sidecars(inputs: Any) -> list[tuple[Path, str]]:
    """(path, the input it stands for) for every input and each file read beside it."""
    out = []
    for p in inputs:
        if p is None or str(p) == "":
            continue
        out.append((Path(p), str(p)))
        out.extend((Path(str(p) + suffix), str(p)) for suffix in INPUT_SIDECAR_SUFFIXES)
    return out


def _name_max(path: Path) -> int:
    for candidate in (path, *path.parents):
        try:
            return int(os.pathconf(str(candidate) or ".", "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return NAME_MAX_FALLBACK


def _check_name_lengths(path: Path, flag: str, *, extra: int = 0) -> None:
    """Refuse (DelphiError) a path with a name the file system cannot hold (ENAMETOOLONG), before
    anything else touches it. `extra`: bytes a sidecar adds to the last name."""
    limit = _name_max(path.parent if str(path.parent) else Path("."))
    parts = path.parts
    for i, part in enumerate(parts):
        size = len(os.fsencode(part)) + (extra if i == len(parts) - 1 else 0)
        if part != os.sep and size > limit:
            sidecar = f" with its {SIDECAR_SUFFIX} sidecar" if extra and i == len(parts) - 1 else ""
            raise DelphiError(
                f"{flag} {quoted(str(path), 80)}: the name {quoted(part, 40)} is {size} bytes long{sidecar}; "
                f"the file system allows at most {limit} per name: choose a shorter name"
            )


def check_output_file(
    path: str | os.PathLike | None,
    *,
    inputs: tuple = (),
    protected: tuple = (),
    flag: str = "--out",
    command: str | None = None,
    force: bool = False,
) -> Path:
    """Refuse, before any work, an output file that cannot be written or must not be.

    Errors (DelphiError, exit 2): the empty path; a name too long for the file system; an
    existing directory, or a path ending in a separator (`newdir/` names a directory, not a
    file); an existing path that is not a regular file (FIFO, device, socket, symbolic link),
    `--force` or not; a path whose directory cannot be created or written; one of the
    command's own `inputs` or a file read beside one (TABLE.family.json, FILE.delphi.json: the
    input would be lost or change meaning), `--force` or not; one of the `protected` files, or a
    file inside a `protected` directory (a ladder's manifest, its configs/ and runs/); with
    `command`, an existing file that command did not write, unless `force`
    (`check_replaceable`). A file whose format keeps its marker in a sidecar (FILE.delphi.json,
    a CSV) has that sidecar checked by the same rules. Creates nothing.
    """
    if path is None or str(path).strip() == "":
        raise DelphiError(f"{flag}: empty path; expected a file name")
    out = Path(path)
    try:
        return _check_output_file(str(path), out, inputs, protected, flag, command, force)
    except BrokenPipeError:
        raise
    except OSError as e:  # whatever the checks themselves meet (EACCES on a parent, ELOOP...)
        raise DelphiError(f"{flag} {quoted(str(path), 120)}: {e.strerror or e}") from None


def _check_output_file(
    text: str, out: Path, inputs: tuple, protected: tuple, flag: str, command: str | None, force: bool
) -> Path:
    sidecar = marker_format(out) == "sidecar" and command is not None
    _check_name_lengths(out, flag, extra=len(SIDECAR_SUFFIX) if sidecar else 0)
    refuse_directory_name(text, flag=flag)
    written = [out, *([sidecar_path(out)] if sidecar else [])]
    for file in written:
        refuse_non_regular(file, flag=flag, shown=text)
        for p, original in _with_sidecars(inputs):
            if _same_file(file, p):
                what = (
                    f"is an input of this command ({original})"
                    if p == Path(original)
                    else f"is read beside {original}, an input of this command"
                )
                also = "" if file == out else f" (its sidecar {file.name})"
                raise DelphiError(
                    f"{flag} {text}{also}: {what}; it would be overwritten, --force or not: choose another name"
                )
    for p in protected:
        if p is not None and (_same_file(out, Path(p)) or (Path(p).is_dir() and _inside(out, Path(p)))):
            raise DelphiError(f"{flag} {text}: would overwrite {p}, which delphi maintains; choose another file")
    _check_writable_dir(_nearest_existing(out.parent), flag, out)
    if command is not None:
        check_replaceable(out, command, force=force, flag=flag)
    return out


def check_input_file(path: str | os.PathLike, what: str = "file", *, not_found: str | None = None) -> Path:
    """`path` as a Path when it names a regular file (or a link to one) that can be read; else a
    DelphiError naming it: the empty path, `-` (standard input is not read: a result records the
    file it came from), not found, a directory, a FIFO / process substitution / device / socket
    ("not a regular file"), a name too long, no permission. Reads nothing."""
    text = str(path)
    if text in ("", "."):
        raise DelphiError(f"{what}: empty path")
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        if text == "-":
            raise DelphiError(f"-: standard input is not read; give the {what} as a file path") from None
        raise DelphiError(f"{p}: {not_found or f'{what} not found'}") from None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise DelphiError(
                f"{quoted(text, 80)}: file name too long (at most {_name_max(Path('.'))} bytes per name); "
                f"expected a {what}"
            ) from None
        raise DelphiError(f"{p}: cannot read ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise DelphiError(f"{p}: is a directory, expected a {what}")
    if not stat.S_ISREG(mode):
        raise DelphiError(f"{p}: not a regular file but {file_kind(p, follow_symlinks=True)}; expected a {what}")
    return p


def check_not_an_input(paths: Any, inputs: tuple = (), *, flag: str = "--out") -> None:
    """Refuse (DelphiError, exit 2) when any of the files a command will write (`paths`, e.g.
    those inside its --out directory) is one of its `inputs`, a file read beside one, or lies
    inside an input directory."""
    for written in paths:
        for p, original in _with_sidecars(inputs):
            if _same_file(Path(written), p) or (
                p == Path(original) and Path(written).is_dir() and _inside(p, Path(written))
            ):
                raise DelphiError(
                    f"{flag}: would write {written}, which is an input of this command ({original}); "
                    "choose another directory"
                )


def check_output_dir(path: str | os.PathLike | None, *, inputs: tuple = (), flag: str = "--out") -> Path:
    """Refuse, before any work, an output directory that cannot be created or written.

    Errors (DelphiError, exit 2): the empty path; a name too long for the file system; an
    existing file (or FIFO, device...); an input of the command; a directory (or the closest
    existing ancestor) that is not writable. Creates nothing.
    """
    if path is None or str(path).strip() == "":
        raise DelphiError(f"{flag}: empty path; expected a directory")
    out = Path(path)
    try:
        _check_name_lengths(out, flag)
        if out.exists() and not out.is_dir():
            kind = file_kind(out, follow_symlinks=True)
            raise DelphiError(f"{flag} {path}: exists and is not a directory" + (f" ({kind})" if kind else ""))
        for p in inputs:
            if p is not None and str(p) != "" and _same_file(out, Path(p)):
                raise DelphiError(f"{flag} {path}: is an input of this command ({p})")
        _check_writable_dir(_nearest_existing(out), flag, out)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise DelphiError(f"{flag} {quoted(str(path), 120)}: {e.strerror or e}") from None
    return out


def check_owned_dir(
    path: str | os.PathLike, owner_files: tuple[str, ...], command: str, *, force: bool = False, flag: str = "--out"
) -> None:
    """Refuse (DelphiError, exit 2) to write into an existing non-empty directory that holds none
    of `owner_files`, the files that mark a directory `command` made (a study's study.json, a run
    dir's status.json), unless `force`: whatever is there is the user's. Creates nothing."""
    directory = Path(path)
    if force or not directory.is_dir() or not any(directory.iterdir()):
        return
    if any((directory / name).exists() for name in owner_files):
        return
    raise DelphiError(
        f"{flag} {path}: a non-empty directory that `delphi {command}` did not make (no "
        f"{' or '.join(owner_files)}); choose a new or empty directory, or pass --force"
    )
