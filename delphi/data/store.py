"""Token stores: a corpus turned into train.bin / val.bin plus meta.json.

    prepare_store(source, out_dir) -> meta      build a store from a source
    resolve_store("stdlib" | "environment" | PATH) -> Path

Layout of a store directory:
    train.bin   the train documents' bytes, each followed by a NUL separator (uint8)
    val.bin     the same for the validation documents
    meta.json   source, document counts, bytes, sha256 of the streams, split rule, tokenizer
    documents.tsv   one line per document: id, split, bytes (provenance)

Split rule (deterministic, by document, independent of the file order and of
the other documents): a document goes to validation when the first 8 bytes of
sha256(document id) read as a big-endian integer, divided by 2**64, fall below
VAL_FRACTION. If that picks no document, the one with the smallest hash is
validation; if it picks every document, the one with the largest hash is
train. Because stdlib ids are "stdlib/<relpath>" in both built-in sources, a
stdlib file lands in the same split in "stdlib" and "environment".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from delphi import __version__
from delphi.data.sources import (
    BUILTIN_SOURCES,
    DOCUMENT_SEPARATOR,
    Document,
    describe_source,
    is_text,
    list_documents,
)
from delphi.data.tokenizer import ByteTokenizer
from delphi.errors import DelphiError, quoted
from delphi.io import atomic_write_bytes, atomic_write_json, atomic_write_text

VAL_FRACTION = 0.02  # ~2% of documents: ~40 stdlib files, enough variety for a stable val loss
STORE_FORMAT = 1
META_FILE = "meta.json"
SPLIT_RULE = (
    f"document -> val if int.from_bytes(sha256(document_id)[:8], 'big') / 2**64 < {VAL_FRACTION} "
    "(else train; at least one document in each split); documents in sorted id order, "
    "each followed by one NUL byte"
)


def document_hash_fraction(doc_id: str) -> float:
    """Where a document falls in [0, 1): the split is a threshold on this."""
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_documents(doc_ids: list[str], val_fraction: float = VAL_FRACTION) -> set[str]:
    """The ids that belong to the validation split (see the module docstring)."""
    if len(doc_ids) < 2:
        raise DelphiError(f"source: {len(doc_ids)} text document(s), need at least 2 to split train/validation")
    fractions = {d: document_hash_fraction(d) for d in doc_ids}
    val = {d for d, f in fractions.items() if f < val_fraction}
    if not val:
        val = {min(doc_ids, key=fractions.__getitem__)}
    if len(val) == len(doc_ids):
        val.discard(max(doc_ids, key=fractions.__getitem__))
    return val


def _read_text_documents(docs: list[Document]) -> list[tuple[Document, bytes]]:
    texts = []
    for doc in docs:
        try:
            data = doc.read()
        except OSError:
            continue  # unreadable (permissions, vanished): not part of the corpus
        if data and is_text(data):
            texts.append((doc, data))
    return texts


def package_of(document_id: str) -> str:
    """The package a document belongs to: its id's first two path components."""
    return "/".join(document_id.split("/")[:2])


def package_differences(before: dict[str, int], after: dict[str, int], limit: int = 8) -> str:
    """The packages whose bytes differ between two stores' `bytes_by_package`, largest first."""
    changed = sorted(((after.get(k, 0) - before.get(k, 0), k) for k in set(before) | set(after)
                      if before.get(k) != after.get(k)), key=lambda d: -abs(d[0]))
    shown = ", ".join(f"{k} {delta:+,d} bytes" for delta, k in changed[:limit])
    return shown + (f" and {len(changed) - limit} more" if len(changed) > limit else "") if changed else "none"


def same_source(a: object, b: str) -> bool:
    """Whether two `--source` values name the same corpus: the same built-in name, or the same
    path however spelled."""
    if not isinstance(a, str):
        return False
    if a == b:
        return True
    if a in BUILTIN_SOURCES or b in BUILTIN_SOURCES:
        return False
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def check_store_replaceable(out: Path, source: str, *, force: bool = False) -> None:
    """A directory `prepare_store` may write into: new, empty, or a token store of the same
    source (or any store with `force`); never a non-empty directory that is not a store."""
    if out.exists() and not out.is_dir():
        raise DelphiError(f"--out: {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / META_FILE).exists():
        raise DelphiError(f"--out: {out} is a non-empty directory that is not a token store")
    if not (out / META_FILE).exists() or force:
        return
    from delphi.io import read_json

    meta = read_json(out / META_FILE, what="token store meta")
    built_from = meta.get("source") if isinstance(meta, dict) else None
    if not same_source(built_from, source):
        raise DelphiError(f"--out {out}: holds a token store built from {str(built_from)[:200]!r}, not {source!r}; "
                          "runs trained on it would silently change corpus: choose another directory, or pass --force")


def prepare_store(source: str, out_dir: str | os.PathLike, *, force: bool = False) -> dict:
    """Build a token store from `source` into `out_dir` and return its meta.

    Every check (source exists, has text, splits into two non-empty parts, the
    output is not some unrelated directory, a store there was built from the same
    source unless `force`) happens before anything is written. The store is written
    into a temporary sibling directory and renamed into place at the end, so an
    interrupted rebuild (Ctrl-C, SIGTERM, a full disk) leaves the old store intact.
    """
    started = time.perf_counter()
    out = Path(out_dir).expanduser()
    check_store_replaceable(out, source, force=force)
    docs = _read_text_documents(list_documents(source))
    if not docs:
        raise DelphiError(f"source: {quoted(source)} holds no text files (binary or non-UTF-8 files are skipped)")
    val_ids = split_documents([d.id for d, _ in docs])
    tokenizer = ByteTokenizer()

    train_parts: list[bytes] = []
    val_parts: list[bytes] = []
    listing: list[str] = []
    by_package: dict[str, int] = {}
    for doc, data in docs:
        split = "val" if doc.id in val_ids else "train"
        (val_parts if split == "val" else train_parts).extend((data, DOCUMENT_SEPARATOR))
        listing.append(f"{doc.id}\t{split}\t{len(data)}")
        by_package[package_of(doc.id)] = by_package.get(package_of(doc.id), 0) + len(data)
    train = b"".join(train_parts)
    val = b"".join(val_parts)
    del train_parts, val_parts

    stream_hash = hashlib.sha256(train)
    train_sha = stream_hash.hexdigest()
    stream_hash.update(val)
    meta = {
        "format": STORE_FORMAT,
        "source": source,
        "source_info": describe_source(source),
        "files": len(docs),
        "documents_train": len(docs) - len(val_ids),
        "documents_val": len(val_ids),
        "bytes": sum(len(data) for _, data in docs),
        "n_train": len(train),
        "n_val": len(val),
        "sha256": stream_hash.hexdigest(),  # of train.bin followed by val.bin
        "train_sha256": train_sha,
        "val_sha256": hashlib.sha256(val).hexdigest(),
        "split_rule": SPLIT_RULE,
        "val_fraction": VAL_FRACTION,
        "document_separator": DOCUMENT_SEPARATOR[0],
        "tokenizer": tokenizer.meta(),
        # Bytes per package ("site-packages/numpy", "stdlib/json"): two stores of one source built
        # on two machines can be told apart by package (`package_differences`), not only by hash.
        "bytes_by_package": by_package,
        "python": platform.python_version(),
        "interpreter": sys.executable,
        "delphi_version": __version__,
    }

    from delphi.signals import stop_signals_raise

    with stop_signals_raise("no token store was left half-built"):
        _write_store_aside(out, meta, train, val, listing, started)
    return meta


# What prepare_store writes into a store directory; anything else found there is the user's and is
# carried over into the rebuilt store.
STORE_FILES = ("train.bin", "val.bin", "documents.tsv", META_FILE)


def _write_store_aside(out: Path, meta: dict, train: bytes, val: bytes, listing: list[str], started: float) -> None:
    """Write the store into a temporary sibling of `out`, then swap it in with renames (signals held
    meanwhile): an interrupted or failed build leaves an existing store as it was, and a new `out`
    appears only complete."""
    from delphi.io import NEW_DIR_MODE, current_umask
    from delphi.signals import held

    if out.is_symlink():
        out = out.resolve()  # rebuild where the link points; the link stays
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".building", dir=parent))
    except OSError as e:
        raise DelphiError(f"--out {out}: cannot build the store beside it in {parent} ({e.strerror})") from None
    try:
        mode = (out.stat().st_mode & 0o7777) if out.is_dir() else (NEW_DIR_MODE & ~current_umask())
        tmp.chmod(mode)  # mkdtemp's 0700 would hide the store from other accounts
        atomic_write_bytes(tmp / "train.bin", train)
        atomic_write_bytes(tmp / "val.bin", val)
        atomic_write_text(tmp / "documents.tsv", "id\tsplit\tbytes\n" + "\n".join(listing) + "\n")
        meta["prepare_s"] = round(time.perf_counter() - started, 3)
        atomic_write_json(tmp / META_FILE, meta)
        with held():
            _swap_in(tmp, out)
    except BaseException:
        _remove_build(tmp)
        raise


def _remove_build(tmp: Path) -> None:
    """Remove an unfinished build directory: only what prepare_store wrote there (its files and
    their temporary names), never a file of the user's that a failed swap could not move back."""
    if not tmp.is_dir():
        return
    for p in tmp.iterdir():
        if p.name in STORE_FILES or any(p.name.startswith(f".{name}.") for name in STORE_FILES):
            p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        tmp.rmdir()


def _swap_in(new: Path, out: Path) -> None:
    """Replace directory `out` by `new` (same parent) with renames; the user's own files in `out`
    move along into the new store. On a failed rename everything is put back as it was."""
    if not out.exists():
        os.rename(new, out)
        return
    extras = [p.name for p in out.iterdir() if p.name not in STORE_FILES]
    moved: list[str] = []
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.rmdir(old)  # a free name beside `out` for the old store
    try:
        for name in extras:
            os.rename(out / name, new / name)
            moved.append(name)
        os.rename(out, old)
        try:
            os.rename(new, out)
        except OSError:
            os.rename(old, out)
            raise
    except OSError as e:
        for name in moved:
            with contextlib.suppress(OSError):
                os.rename(new / name, out / name)
        raise DelphiError(f"--out {out}: cannot swap the rebuilt store in ({e.strerror}); the old store is unchanged") from None
    shutil.rmtree(old, ignore_errors=True)


def cache_dir() -> Path:
    return Path(os.environ.get("DELPHI_CACHE", "~/.cache/delphi")).expanduser()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def is_store(path: Path) -> bool:
    return (path / META_FILE).is_file() and (path / "train.bin").is_file() and (path / "val.bin").is_file()


def resolve_store(store: str) -> Path:
    """Directory of the token store named by `store`.

    A built-in source name is prepared once into $DELPHI_CACHE/stores/<name>/
    (default ~/.cache/delphi): under an exclusive lock, into a temporary
    directory renamed into place, so concurrent runs prepare it once and never
    see a half-built store. Anything else must be a prepared store directory.
    Delete the cached directory to rebuild it (e.g. after installing packages).
    """
    if store in BUILTIN_SOURCES:
        stores = cache_dir() / "stores"
        target = stores / store
        if is_store(target):
            return target
        with _file_lock(stores / f".{store}.lock"):
            if is_store(target):  # another process built it while we waited
                return target
            tmp = Path(tempfile.mkdtemp(prefix=f".{store}.", suffix=".tmp", dir=stores))
            from delphi.io import NEW_DIR_MODE, current_umask

            tmp.chmod(NEW_DIR_MODE & ~current_umask())  # mkdtemp's 0700 would hide the store from other accounts
            try:
                prepare_store(store, tmp)
                if target.exists():  # a broken leftover (no meta.json)
                    shutil.rmtree(target)
                os.rename(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return target
    path = Path(store).expanduser()
    if not path.exists():
        raise DelphiError(
            f"data.store: {quoted(store)} is neither a built-in source ({', '.join(BUILTIN_SOURCES)}) nor an existing directory"
        )
    if not is_store(path):
        raise DelphiError(
            f"data.store: {path} is not a token store (no meta.json/train.bin/val.bin); "
            f"build one with `delphi data prepare --source SRC --out {path}`"
        )
    return path
