"""Corpus sources: which documents a token store is built from, in which order.

A *document* is one file (or, for a single text file, one ~64 KiB chunk of it
cut at a line boundary), identified by a stable id: its path relative to the
source root, prefixed by the root's name for the built-in sources
("stdlib/os.py", "site-packages/numpy/linalg/linalg.py").

Built-in sources:
  stdlib       the running interpreter's standard library: .py files plus
               prose text files (.txt .rst .md), without site-packages,
               __pycache__, lib-dynload and the build config directory
  environment  stdlib + every .py file of the environment's site-packages

Any other source is a directory (every file below it), a glob pattern (every
matching file) or a single file. A file is *text* when it has no NUL byte and
decodes as UTF-8; anything else (images, archives, test data in legacy
encodings) is skipped. A record shard (JSONL, optionally gzip or zstd, Parquet,
Arrow: delphi.data.shards, by its name) is read as many documents, one per
record, with ids "<file id>#<line or row>"; a directory that
`datasets.save_to_disk` wrote is read through its .arrow files. Files are read in
sorted id order and a file's documents in file order (for text files alone: every
document in sorted id order), so the same files always give the same stream.
"""

from __future__ import annotations

import glob as globlib
import os
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from delphi.data.shards import (
    DATASETS_METADATA_FILES,
    DEFAULT_TEXT_FIELD,
    datasets_data_files,
    read_records,
    shard_format,
)
from delphi.errors import DelphiError, quoted

BUILTIN_SOURCES = ("stdlib", "environment")
STDLIB_TEXT_SUFFIXES = (".py", ".txt", ".rst", ".md")
SITE_PACKAGES_SUFFIXES = (".py",)
# Directories never read: byte-code caches, compiled extensions, VCS metadata.
SKIP_DIR_NAMES = frozenset({"__pycache__", "site-packages", "dist-packages", "lib-dynload", ".git", ".hg", ".svn"})
# Files an installer writes into site-packages for an editable install (setuptools' import finder
# for `pip install -e`): install artefacts, not corpus text, and whether one exists depends on the
# setuptools version pip built with, so the same packages would give two `environment` stores.
SITE_PACKAGES_SKIP_PREFIXES = ("__editable__",)
SINGLE_FILE_CHUNK_BYTES = 64 * 1024  # a lone text file is split into documents of about this size
# A NUL byte separates documents in the stream: text files never contain it.
DOCUMENT_SEPARATOR = b"\x00"
READ_BLOCK_BYTES = 1 << 20  # a lone text file is read this much at a time


@dataclass(frozen=True)
class Document:
    id: str  # stable name, used for ordering and for the train/val split
    path: Path
    offset: int = 0  # byte range inside `path` (whole file when length is None)
    length: int | None = None

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            if self.length is None:
                return f.read()
            f.seek(self.offset)
            return f.read(self.length)


def is_text(data: bytes) -> bool:
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def site_packages_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots: list[Path] = []
    for key in ("purelib", "platlib"):
        root = Path(paths[key]).resolve()
        if root.is_dir() and root not in roots:
            roots.append(root)
    return roots


def _walk_files(root: Path, suffixes: tuple[str, ...] | None) -> Iterator[Path]:
    """Every regular file below `root` (no symlinked directories, no skipped dirs)."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIR_NAMES and not d.startswith("config-")]
        for name in filenames:
            path = Path(dirpath) / name
            if suffixes is not None and path.suffix not in suffixes:
                continue
            if path.is_file():
                yield path


def _chunks(path: Path, chunk_bytes: int = SINGLE_FILE_CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of one file cut into documents of ~chunk_bytes, each ending after the first
    newline at or past chunk_bytes (or at the end of the file), read a block at a time: memory
    holds one block and one document, whatever the file's size."""
    block = max(chunk_bytes, READ_BLOCK_BYTES)
    with open(path, "rb") as f:
        buf, pos, offset, eof = bytearray(), 0, 0, False

        def fill() -> bool:  # one more block; False at the end of the file
            data = f.read(block)
            buf.extend(data)
            return bool(data)

        while True:
            while len(buf) - pos <= chunk_bytes and not eof:
                eof = not fill()
            if pos == len(buf):
                return
            if len(buf) - pos <= chunk_bytes:  # the rest of the file: the last document
                yield offset, bytes(buf[pos:])
                return
            searched = pos + chunk_bytes
            newline = buf.find(b"\n", searched)
            while newline < 0 and not eof:
                searched = len(buf)
                eof = not fill()
                newline = buf.find(b"\n", searched)
            end = len(buf) if newline < 0 else newline + 1
            yield offset, bytes(buf[pos:end])
            offset += end - pos
            pos = end
            if pos >= block:  # drop what was handed out
                del buf[:pos]
                pos = 0


def chunk_id(path: Path, k: int) -> str:
    return f"{path.name}#{k:06d}"


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: a text document, a lone text file cut into documents, or a shard
    of records (delphi.data.shards)."""

    id: str  # stable name: the order of files, and the start of their documents' ids
    path: Path
    format: str = "text"  # "text", or a shard format: "jsonl", "parquet", "arrow"
    compression: str | None = None  # a JSONL shard's: "gzip", "zstd"
    chunked: bool = False  # a lone text file, cut into ~SINGLE_FILE_CHUNK_BYTES documents

    @property
    def is_shard(self) -> bool:
        return self.format != "text"


def _source_file(file_id: str, path: Path, *, lone: bool = False) -> SourceFile:
    fmt = shard_format(path)
    if fmt is None:
        return SourceFile(file_id, path, chunked=lone)
    return SourceFile(file_id, path, fmt[0], fmt[1])


def _files_under(root: Path, prefix: str, suffixes: tuple[str, ...] | None) -> list[SourceFile]:
    """Every file below `root`; with `suffixes` None (a user's directory) shards are read as
    records and the bookkeeping files of a `datasets.save_to_disk` directory are left out."""
    files = []
    saved: dict[Path, set[str]] = {}  # directory -> the .arrow files its state.json lists
    for path in _walk_files(root, suffixes):
        rel = path.relative_to(root).as_posix()
        file_id = f"{prefix}/{rel}" if prefix else rel
        if suffixes is not None:
            files.append(SourceFile(file_id, path))
            continue
        if path.name in DATASETS_METADATA_FILES and _is_datasets_dir(path.parent, saved):
            continue
        files.append(_source_file(file_id, path))
    return files


def _is_datasets_dir(directory: Path, seen: dict[Path, set[str]]) -> bool:
    """`directory` was written by `datasets.save_to_disk` (a Dataset: state.json lists its .arrow
    files; a DatasetDict: dataset_dict.json above such directories)."""
    if directory not in seen:
        listed = datasets_data_files(directory)
        seen[directory] = set(listed) if listed is not None else set()
        if listed is None and (directory / "dataset_dict.json").is_file():
            seen[directory] = {"dataset_dict.json"}
    return bool(seen[directory])


def describe_source(source: str) -> dict[str, object]:
    """Where a source's files come from (recorded in meta.json)."""
    if source == "stdlib":
        return {"kind": "stdlib", "roots": [str(stdlib_root())]}
    if source == "environment":
        return {"kind": "environment", "roots": [str(stdlib_root())] + [str(r) for r in site_packages_roots()]}
    path = Path(source).expanduser()
    if path.is_dir():
        return {"kind": "directory", "roots": [str(path.resolve())]}
    if path.is_file():
        return {"kind": "file", "roots": [str(path.resolve())]}
    return {"kind": "glob", "roots": [source]}


def source_roots(source: str) -> list[Path]:
    """The directories a source reads everything below (none for a file or a glob)."""
    if source in BUILTIN_SOURCES:
        return [Path(r) for r in describe_source(source)["roots"]]  # type: ignore[union-attr]
    path = Path(source).expanduser()
    return [path.resolve()] if path.is_dir() else []


def list_files(source: str) -> list[SourceFile]:
    """The files of `source`, sorted by id (binary files are filtered when read)."""
    if not source:
        raise DelphiError("source: empty, expected 'stdlib', 'environment', a directory, a glob or a file")
    if source == "stdlib":
        files = _files_under(stdlib_root(), "stdlib", STDLIB_TEXT_SUFFIXES)
    elif source == "environment":
        files = _files_under(stdlib_root(), "stdlib", STDLIB_TEXT_SUFFIXES)
        roots = site_packages_roots()
        for root in roots:
            # With purelib != platlib both are named "site-packages"; keep ids unique.
            prefix = "site-packages" if len(roots) == 1 else f"site-packages{roots.index(root)}"
            files += [
                f
                for f in _files_under(root, prefix, SITE_PACKAGES_SUFFIXES)
                if not f.path.name.startswith(SITE_PACKAGES_SKIP_PREFIXES)
            ]
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            files = _files_under(path, "", None)
        elif path.is_file():
            files = [_source_file(path.name, path, lone=True)]
        elif globlib.has_magic(source):
            matches = sorted(Path(p) for p in globlib.glob(os.path.expanduser(source), recursive=True))
            found = [p for p in matches if p.is_file() and "__pycache__" not in p.parts]
            if found:
                common = Path(os.path.commonpath([str(p.parent.resolve()) for p in found]))
                files = [_source_file(p.resolve().relative_to(common).as_posix(), p) for p in found]
            else:
                files = []
        else:
            raise DelphiError(
                f"source: {quoted(source)} does not exist (expected 'stdlib', 'environment', a directory, a glob or a file)"
            )
    files.sort(key=lambda f: f.id)
    if not files:
        raise DelphiError(f"source: {quoted(source)} holds no files")
    return files


def list_documents(source: str) -> list[Document]:
    """The candidate text documents of `source`, in order (a lone file's chunks found by reading
    it once; record shards are not listed: their documents are only read, by iter_documents)."""
    docs = []
    for f in list_files(source):
        if f.chunked:
            docs += [
                Document(chunk_id(f.path, k), f.path, offset, len(data))
                for k, (offset, data) in enumerate(_chunks(f.path))
            ]
        elif not f.is_shard:
            docs.append(Document(f.id, f.path))
    return docs


@dataclass(frozen=True)
class SourceDocument:
    id: str  # the split is a function of it
    data: bytes  # the text, UTF-8
    file_id: str  # the file it came from (bytes_by_package)


def iter_documents(
    files: list[SourceFile], text_field: str = DEFAULT_TEXT_FIELD, progress: Callable[[int], None] | None = None
) -> Iterator[SourceDocument]:
    """Every text document of `files`, in order: the files in their (sorted) order, a file's
    documents in file order. Text files that are not text (a NUL byte, not UTF-8), unreadable or
    empty are skipped, as are records whose text is empty, holds a NUL or is not encodable.
    `progress` is told how many bytes of the files (on disk) were read since it was last told."""
    tell = progress or (lambda _: None)
    for f in files:
        try:
            size = f.path.stat().st_size
        except OSError:
            continue  # vanished: not part of the corpus
        if f.is_shard:
            reported = [0]

            def advance(position: int, reported: list[int] = reported) -> None:
                tell(max(position - reported[0], 0))
                reported[0] = max(reported[0], position)

            for doc_id, text in read_records(f.path, f.id, f.format, f.compression, text_field, advance):
                try:
                    data = text.encode("utf-8")
                except UnicodeEncodeError:
                    continue  # a lone surrogate: not text
                if data and DOCUMENT_SEPARATOR not in data:
                    yield SourceDocument(doc_id, data, f.id)
            advance(size)
        elif f.chunked:
            try:
                for k, (_, data) in enumerate(_chunks(f.path)):
                    tell(len(data))
                    if data and is_text(data):
                        yield SourceDocument(chunk_id(f.path, k), data, f.id)
            except OSError:
                continue
        else:
            try:
                data = Document(f.id, f.path).read()
            except OSError:
                continue  # unreadable (permissions, vanished): not part of the corpus
            tell(size)
            if data and is_text(data):
                yield SourceDocument(f.id, data, f.id)
