"""Small file helpers shared by every part: atomic writes, content hashes, and the output policy.

The output policy (one place, every command that writes):

- A command replaces an existing file only if Delphi wrote it and the file says which command
  did (`written_by`); anything else is exit 2 naming the file unless the command's `--force`.
- A command never writes over one of its own inputs, nor over a file read beside one (TABLE's
  TABLE.family.json, any FILE.delphi.json), `--force` or not.
- Only regular files are written or replaced: an existing FIFO, device, socket or symbolic link
  at an output path is refused (exit 2), `--force` or not; so is `--out NAME/` for a file when
  NAME/ does not exist. A sidecar an output writes follows the same rules as the output.
- A write the system refuses (a full disk, a quota, a read-only mount) is a `WriteFailed` (exit 2)
  naming the file; the file keeps its previous content.
- Files get the user's umask, as a plain `open()` would give them.

How a file says which command wrote it, per format (`written_by` reads it back):

    .json           a top-level key "written_by": {"command", "delphi"} (JSON objects only)
    .yaml .yml      a first-line comment "# written by delphi COMMAND (delphi VERSION)"
    .md             a first-line HTML comment, or the generated header `prereg index` has always written
    .png            a tEXt chunk "delphi:written-by" (invisible to viewers, kept by copies)
    .svg            an XML comment after the XML declaration
    anything else   a sidecar FILE.delphi.json naming the command and the sha256 of FILE
                    (a CSV has no comment syntax every reader skips); a file whose content no
                    longer matches its sidecar's hash counts as the user's.

In-band markers travel with the file (a copy of a Delphi output is still one) and are invisible
to every reader of the format; the sidecar is the fallback where a format has no such place.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any

import yaml

from delphi.errors import DelphiError, quoted


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
        data = _embed_marker(path, data, written_by)
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
    if written_by is not None and _marker_format(path) == "sidecar":
        sidecar = {WRITTEN_BY_KEY: _marker_value(written_by), "file": path.name, "sha256": sha256_bytes(data)}
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
        obj = {**obj, WRITTEN_BY_KEY: _marker_value(written_by)}
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


# ---- which command wrote a file (the output policy's marker; module docstring) -----------------

WRITTEN_BY_KEY = "written_by"
SIDECAR_SUFFIX = ".delphi.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_MARKER_KEYWORD = b"delphi:written-by"
# How many leading lines (text formats) or bytes (SVG) may hold the marker.
MARKER_LINES = 5
MARKER_SVG_BYTES = 4096
# "written by delphi fit isoflop (delphi 0.1)", "Generated by `delphi prereg index DIR`": a
# command is one word or a group and a subcommand.
_MARKER_RE = re.compile(r"(?:written|generated) by `?delphi ([a-z][a-z-]*(?: [a-z][a-z-]*)?)", re.IGNORECASE)


def sidecar_path(path: str | os.PathLike) -> Path:
    """FILE -> FILE.delphi.json: where a file with no place for a marker says who wrote it."""
    return Path(str(path) + SIDECAR_SUFFIX)


def _marker_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".md":
        return "markdown"
    if suffix in (".png", ".svg"):
        return suffix[1:]
    return "sidecar"


def _marker_value(command: str) -> dict[str, str]:
    from delphi import __version__

    return {"command": command, "delphi": __version__}


def _marker_line(command: str) -> str:
    from delphi import __version__

    return f"written by delphi {command} (delphi {__version__})"


def _embed_marker(path: Path, data: bytes, command: str) -> bytes:
    """`data` with `command`'s marker in it, for the formats that carry it in-band."""
    kind = _marker_format(path)
    if kind == "yaml":
        return f"# {_marker_line(command)}; replaced by that command, else only with --force\n".encode() + data
    if kind == "markdown":
        if _command_in_text(data.decode("utf-8", "replace")) == command:
            return data  # a generated header that already says so (`prereg index`)
        return f"<!-- {_marker_line(command)} -->\n".encode() + data
    if kind == "svg":
        comment = f"<!-- {_marker_line(command)} -->\n".encode()
        if data.startswith(b"<?xml"):
            end = data.index(b"?>") + 2
            return data[:end] + b"\n" + comment.rstrip(b"\n") + data[end:]
        return comment + data
    if kind == "png":
        if not data.startswith(PNG_SIGNATURE):
            raise ValueError(f"{path}: not PNG data")
        ihdr_end = len(PNG_SIGNATURE) + 12 + struct.unpack(">I", data[8:12])[0]
        body = PNG_MARKER_KEYWORD + b"\x00" + command.encode("latin-1")
        chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
        return data[:ihdr_end] + chunk + data[ihdr_end:]
    if kind == "json":
        raise TypeError(f"{path}: write JSON with atomic_write_json(..., written_by=) to mark it")
    return data  # sidecar: written after the file


def _command_in_text(text: str) -> str | None:
    for line in text.splitlines()[:MARKER_LINES]:
        if match := _MARKER_RE.search(line):
            return match.group(1)
    return None


def _png_marker(path: Path) -> str | None:
    with open(path, "rb") as f:
        if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
            return None
        while header := f.read(8):
            if len(header) < 8:
                return None
            length, kind = struct.unpack(">I", header[:4])[0], header[4:]
            if kind in (b"IDAT", b"IEND"):
                return None  # text chunks that matter come before the image data
            body = f.read(length)
            f.seek(4, os.SEEK_CUR)  # CRC
            if kind == b"tEXt" and body.startswith(PNG_MARKER_KEYWORD + b"\x00"):
                return body[len(PNG_MARKER_KEYWORD) + 1 :].decode("latin-1")
    return None


def written_by(path: str | os.PathLike) -> str | None:
    """The Delphi command that wrote `path`, as the file says (module docstring); None when it
    says nothing, is unreadable, or its sidecar's hash no longer matches its content.

    Read from the content, not the name: a sidecar if there is one, else a PNG's text chunk, a
    JSON object's key, or a marker line among the first lines of a text file (YAML, markdown,
    SVG), so a JSON written under another suffix still says who wrote it."""
    path = Path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO would block the read, a device never ends
        sidecar = sidecar_path(path)
        if sidecar.is_file():
            doc = json.loads(sidecar.read_bytes())
            marker = doc.get(WRITTEN_BY_KEY) if isinstance(doc, dict) else None
            if isinstance(marker, dict) and doc.get("sha256") == sha256_file(path):
                return marker.get("command")
        with open(path, "rb") as f:
            head = f.read(MARKER_SVG_BYTES)
        if head.startswith(PNG_SIGNATURE):
            return _png_marker(path)
        if head.lstrip().startswith(b"{"):
            doc = json.loads(path.read_bytes())
            marker = doc.get(WRITTEN_BY_KEY) if isinstance(doc, dict) else None
            return marker.get("command") if isinstance(marker, dict) else None
        return _command_in_text(head.decode("utf-8", "replace"))
    except (OSError, ValueError, AttributeError):
        return None


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


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


# A YAML document may expand to at most this many characters plus YAML_MAX_EXPANSION times its own
# length once its aliases are followed. Without aliases a document expands to its own length; a
# 675-byte "billion laughs" document expands to 39 MB, and each further level multiplies that.
YAML_MAX_EXPANDED_CHARS = 1_000_000
YAML_MAX_EXPANSION = 10


def load_yaml_text(text: str, where: str | os.PathLike = "YAML") -> Any:
    """The one YAML loader for what a user hands Delphi (train, flops, study, ladder specs, run
    configs, preregistrations): yaml.safe_load, but a document whose aliases expand it beyond
    YAML_MAX_EXPANDED_CHARS + YAML_MAX_EXPANSION x its length (an alias bomb), that refers to
    itself, that nests too deeply or that repeats a key in one mapping (`yaml_strict`) is a
    DelphiError naming `where`, before anything is built."""
    from delphi.yaml_strict import DuplicateKeyError, StrictSafeLoader

    loader = StrictSafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        limit = YAML_MAX_EXPANDED_CHARS + YAML_MAX_EXPANSION * len(text)
        size = _expanded_chars(node, limit)
        if size is None:
            raise DelphiError(f"{where}: the YAML document refers to itself (a recursive alias); expected plain data")
        if size > limit:
            raise DelphiError(
                f"{where}: the YAML document's aliases expand its {len(text):,} characters to more than {limit:,} "
                "(an alias bomb?); expected plain data"
            )
        return loader.construct_document(node)
    except DuplicateKeyError as e:
        raise DelphiError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        raise DelphiError(f"{where}: not valid YAML ({_one_line(e)[:QUOTED_ERROR_MAX_CHARS]})") from None
    except RecursionError:
        raise DelphiError(f"{where}: the YAML document nests too deeply") from None
    finally:
        loader.dispose()


QUOTED_ERROR_MAX_CHARS = 300  # of a parser's message, which quotes the offending text


def _expanded_chars(root: yaml.Node, limit: int) -> int | None:
    """Characters of `root` with every alias followed (each node counts 1 plus its scalar's length),
    counted without expanding anything; stops once past `limit`; None for a recursive document."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = (
            [c for pair in node.value for c in pair]
            if isinstance(node, yaml.MappingNode)
            else (node.value if isinstance(node, yaml.SequenceNode) else [])
        )
        if not children_done:
            if key in in_progress:
                return None
            in_progress.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in in_progress and id(child) not in sizes:
                    return None
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        total = 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else sum(sizes[id(c)] for c in children))
        sizes[key] = min(total, limit + 1)
        in_progress.discard(key)
    return sizes[id(root)]


def read_json(path: str | os.PathLike, *, what: str = "JSON file") -> Any:
    """Read a JSON file; a missing or unreadable file or a syntax error is a DelphiError naming it."""
    text = read_text(path, what=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DelphiError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


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
    sidecar = _marker_format(out) == "sidecar" and command is not None
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
