"""Corpus sources: which documents a token store is built from, in which order.

A *document* is one file (or, for a single text file, one ~64 KiB chunk of it
cut at a line boundary), identified by a stable id: its path relative to the
source root, prefixed by the root's name for the built-in sources
("stdlib/os.py", "site-packages/numpy/linalg/linalg.py"). Documents are read in
sorted id order, so the same files always give the same stream.

Built-in sources:
  stdlib       the running interpreter's standard library: .py files plus
               prose text files (.txt .rst .md), without site-packages,
               __pycache__, lib-dynload and the build config directory
  environment  stdlib + every .py file of the environment's site-packages

Any other source is a directory (every text file below it), a glob pattern
(every matching text file) or a single text file. A file is *text* when it has
no NUL byte and decodes as UTF-8; anything else (images, archives, test data in
legacy encodings) is skipped.
"""

from __future__ import annotations

import glob as globlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from delphi.errors import DelphiError, quoted

BUILTIN_SOURCES = ("stdlib", "environment")
STDLIB_TEXT_SUFFIXES = (".py", ".txt", ".rst", ".md")
SITE_PACKAGES_SUFFIXES = (".py",)
# Directories never read: byte-code caches, compiled extensions, VCS metadata.
SKIP_DIR_NAMES = frozenset({"__pycache__", "site-packages", "dist-packages", "lib-dynload", ".git", ".hg", ".svn"})
# Files an installer writes into site-packages for an editable install (setuptools' import finder
# for `pip install -e`): install artefacts, not corpus text, and whether one exists depends on the
# setuptools version pip built with, so the same packages gave two `environment` stores (paper/editions/v7).
SITE_PACKAGES_SKIP_PREFIXES = ("__editable__",)
SINGLE_FILE_CHUNK_BYTES = 64 * 1024  # a lone text file is split into documents of about this size
# A NUL byte separates documents in the stream: text files never contain it.
DOCUMENT_SEPARATOR = b"\x00"


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


def _documents_under(root: Path, prefix: str, suffixes: tuple[str, ...] | None) -> list[Document]:
    docs = []
    for path in _walk_files(root, suffixes):
        rel = path.relative_to(root).as_posix()
        docs.append(Document(id=f"{prefix}/{rel}" if prefix else rel, path=path))
    return docs


def _chunk_file(path: Path, chunk_bytes: int = SINGLE_FILE_CHUNK_BYTES) -> list[Document]:
    """Cut one file into documents of ~chunk_bytes, each ending after a newline."""
    data = path.read_bytes()
    docs, start, k = [], 0, 0
    while start < len(data):
        end = min(start + chunk_bytes, len(data))
        if end < len(data):
            newline = data.find(b"\n", end)
            end = len(data) if newline < 0 else newline + 1
        docs.append(Document(id=f"{path.name}#{k:06d}", path=path, offset=start, length=end - start))
        start, k = end, k + 1
    return docs


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


def list_documents(source: str) -> list[Document]:
    """The candidate documents of `source`, sorted by id (binary files are filtered when read)."""
    if not source:
        raise DelphiError("source: empty, expected 'stdlib', 'environment', a directory, a glob or a text file")
    if source == "stdlib":
        docs = _documents_under(stdlib_root(), "stdlib", STDLIB_TEXT_SUFFIXES)
    elif source == "environment":
        docs = _documents_under(stdlib_root(), "stdlib", STDLIB_TEXT_SUFFIXES)
        roots = site_packages_roots()
        for root in roots:
            # With purelib != platlib both are named "site-packages"; keep ids unique.
            prefix = "site-packages" if len(roots) == 1 else f"site-packages{roots.index(root)}"
            docs += [d for d in _documents_under(root, prefix, SITE_PACKAGES_SUFFIXES)
                     if not d.path.name.startswith(SITE_PACKAGES_SKIP_PREFIXES)]
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            docs = _documents_under(path, "", None)
        elif path.is_file():
            docs = _chunk_file(path)
        elif globlib.has_magic(source):
            matches = sorted(Path(p) for p in globlib.glob(os.path.expanduser(source), recursive=True))
            files = [p for p in matches if p.is_file() and "__pycache__" not in p.parts]
            if files:
                common = Path(os.path.commonpath([str(p.parent.resolve()) for p in files]))
                docs = [Document(id=p.resolve().relative_to(common).as_posix(), path=p) for p in files]
            else:
                docs = []
        else:
            raise DelphiError(
                f"source: {quoted(source)} does not exist (expected 'stdlib', 'environment', a directory, a glob or a text file)"
            )
    docs.sort(key=lambda d: d.id)
    if not docs:
        raise DelphiError(f"source: {quoted(source)} holds no files")
    return docs
