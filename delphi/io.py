"""Small file helpers shared by every part: atomic writes and content hashes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it into place.

    A reader (or a crash) never sees a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def atomic_write_yaml(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays show up in results; JSON wants plain Python.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


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
    naming the file (not found, a directory, no permission, binary or other non-UTF-8 bytes)."""
    from delphi.errors import DelphiError

    path = Path(path)
    if str(path) in ("", "."):
        raise DelphiError(f"{what}: empty path")
    if path.is_dir():
        raise DelphiError(f"{path}: is a directory, expected a {what}")
    if not path.is_file():
        raise DelphiError(f"{path}: {what} not found")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DelphiError(f"{path}: cannot read ({e.strerror})") from None
    return decode_utf8(data, path, what)


def decode_utf8(data: bytes, path: str | os.PathLike, what: str = "file") -> str:
    """`data` as UTF-8 text; a byte that is not is a DelphiError naming its line and column."""
    from delphi.errors import DelphiError

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
    from delphi.errors import DelphiError

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
    itself, or that nests too deeply is a DelphiError naming `where`, before anything is built."""
    from delphi.errors import DelphiError

    loader = yaml.SafeLoader(text)
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
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
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
    from delphi.errors import DelphiError

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
    from delphi.errors import DelphiError

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


def check_output_file(
    path: str | os.PathLike | None, *, inputs: tuple = (), protected: tuple = (), flag: str = "--out"
) -> Path:
    """Refuse, before any work, an output file that cannot be written or must not be.

    Errors (DelphiError, exit 2): the empty path; an existing directory; a path whose
    directory cannot be created or written; one of the command's own `inputs` (the input
    would be lost); or one of the `protected` files, or a file inside a `protected`
    directory (a ladder's manifest, its configs/ and runs/).
    Creates nothing.
    """
    from delphi.errors import DelphiError

    if path is None or str(path).strip() == "":
        raise DelphiError(f"{flag}: empty path; expected a file name")
    out = Path(path)
    if out.is_dir() or str(path).endswith(os.sep):
        raise DelphiError(f"{flag} {path}: is a directory; expected a file name")
    for p in inputs:
        if p is not None and str(p) != "" and _same_file(out, Path(p)):
            raise DelphiError(f"{flag} {path}: is an input of this command ({p}); it would be overwritten")
    for p in protected:
        if p is not None and (_same_file(out, Path(p)) or (Path(p).is_dir() and _inside(out, Path(p)))):
            raise DelphiError(f"{flag} {path}: would overwrite {p}, which delphi maintains; choose another file")
    _check_writable_dir(_nearest_existing(out.parent), flag, out)
    return out


def check_output_dir(path: str | os.PathLike | None, *, inputs: tuple = (), flag: str = "--out") -> Path:
    """Refuse, before any work, an output directory that cannot be created or written.

    Errors (DelphiError, exit 2): the empty path; an existing file; an input of the
    command; a directory (or the closest existing ancestor) that is not writable.
    Creates nothing.
    """
    from delphi.errors import DelphiError

    if path is None or str(path).strip() == "":
        raise DelphiError(f"{flag}: empty path; expected a directory")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise DelphiError(f"{flag} {path}: exists and is not a directory")
    for p in inputs:
        if p is not None and str(p) != "" and _same_file(out, Path(p)):
            raise DelphiError(f"{flag} {path}: is an input of this command ({p})")
    _check_writable_dir(_nearest_existing(out), flag, out)
    return out
