"""Token stores, one concept over ~760 lines: a corpus turned into train.bin / val.bin plus meta.json.

    prepare_store(source, out_dir) -> meta      build a store from a source (streamed)
    resolve_store("stdlib" | "environment" | PATH) -> Path
    check_store_for_config(cfg) -> Path         the store a run trains on, checked before its first step

Layout of a store directory:
    train.bin   the train documents' tokens, each document followed by the separator: the bytes and
                a NUL byte (uint8) for the byte tokenizer; for BPE the ids (uint16 below 65,536
                tokens, else uint32) and the end-of-document token
    val.bin     the same for the validation documents
    meta.json   source, document counts, bytes of text per split, sha256 of the streams, split
                rule, tokenizer (kind, vocab_size, dtype; for BPE the sha256 of its JSON)
    documents.tsv   one line per document: id, split, bytes (provenance)
    tokenizer.json  (BPE) the tokenizer, as the `tokenizers` package reads it
    token_bytes.npy (BPE) bytes of text per token id: loss per token -> bits per byte

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
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delphi import __version__
from delphi.data.bpe import TOKENIZER_FILE, BpeTokenizer, check_tokenizer_arg, texts_of
from delphi.data.shards import DEFAULT_TEXT_FIELD, check_readers
from delphi.data.sources import (
    BUILTIN_SOURCES,
    DOCUMENT_SEPARATOR,
    SourceDocument,
    SourceFile,
    describe_source,
    iter_documents,
    list_files,
    source_roots,
)
from delphi.data.tokenizer import ByteTokenizer
from delphi.errors import DelphiError, quoted
from delphi.io import NEW_DIR_MODE, atomic_write_bytes, atomic_write_json, atomic_write_text, current_umask, read_json
from delphi.signals import held, stop_signals_raise

if TYPE_CHECKING:  # numpy is imported where it is used: a byte store is prepared without it (a smaller process)
    import numpy as np

VAL_FRACTION = 0.02  # ~2% of documents: ~40 stdlib files, enough variety for a stable val loss
STORE_FORMAT = 1
META_FILE = "meta.json"
STORE_DTYPES = {"uint8": 1, "uint16": 2, "uint32": 4}  # token dtype -> bytes: bytes; BPE below 65,536 tokens; larger
TOKEN_BYTES_FILE = "token_bytes.npy"  # a BPE store's bytes of text per token id (uint32, numpy's .npy)
# A trained vocabulary learns from at most this much of the train split's text: BPE merges settle
# long before a lab-sized corpus is read through (GPT-2's vocabulary came from ~40 GB of WebText).
BPE_TRAIN_BYTES = 1 << 30
ENCODE_BATCH_BYTES = 1 << 20  # documents encoded together (one call of the tokenizers package)
WRITE_BUFFER_BYTES = 1 << 20
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


def package_of(document_id: str) -> str:
    """The package a document belongs to: its id's first two path components."""
    return "/".join(document_id.split("/")[:2])


def package_differences(before: dict[str, int], after: dict[str, int], limit: int = 8) -> str:
    """The packages whose bytes differ between two stores' `bytes_by_package`, largest first."""
    changed = sorted(
        ((after.get(k, 0) - before.get(k, 0), k) for k in set(before) | set(after) if before.get(k) != after.get(k)),
        key=lambda d: -abs(d[0]),
    )
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

    meta = read_json(out / META_FILE, what="token store meta")
    built_from = meta.get("source") if isinstance(meta, dict) else None
    if not same_source(built_from, source):
        raise DelphiError(
            f"--out {out}: holds a token store built from {str(built_from)[:200]!r}, not {source!r}; "
            "runs trained on it would silently change corpus: choose another directory, or pass --force"
        )


@dataclass(frozen=True)
class PrepareOptions:
    """How `prepare_store` reads a source and tokenizes it."""

    text_field: str = DEFAULT_TEXT_FIELD  # the field (JSONL) or column (Parquet, Arrow) of a record's text
    tokenizer: str = "byte"  # "byte", "bpe" (trained here, vocab_size tokens) or a tokenizer.json path
    vocab_size: int | None = None  # --tokenizer bpe: the vocabulary to train
    tokenizer_train_bytes: int = BPE_TRAIN_BYTES  # --tokenizer bpe: train on at most this much text
    progress: bool = False  # a tqdm bar on stderr (a terminal): bytes read, documents per second


def prepare_store(
    source: str, out_dir: str | os.PathLike, *, force: bool = False, options: PrepareOptions = PrepareOptions()
) -> dict:
    """Build a token store from `source` into `out_dir` and return its meta.

    The checks that need no reading (the source exists, the output is not some unrelated
    directory nor inside the source, a store there was built from the same source unless
    `force`, a tokenizer file is one) come before anything is written. The source is then
    streamed: documents are read, tokenized and appended to train.bin / val.bin one at a time
    (memory holds a document, or one encoding batch, never the corpus), inside a temporary sibling
    directory that is renamed into place at the end, so an interrupted or failed build (Ctrl-C,
    SIGTERM, a bad record, a full disk) leaves an existing store intact. A split that comes out
    empty (a handful of documents) is redone in a second pass with the fallback of the split rule.
    """
    started = time.perf_counter()
    out = Path(out_dir).expanduser()
    check_store_replaceable(out, source, force=force)
    check_tokenizer_arg(options.tokenizer, options.vocab_size)
    files = list_files(source)
    check_out_outside_source(out, source, files)
    check_readers([(f.path, f.format, f.compression) for f in files if f.is_shard])
    loaded = None if options.tokenizer in ("byte", "bpe") else BpeTokenizer.load(options.tokenizer)
    with stop_signals_raise("no token store was left half-built"):
        tmp = _new_build_dir(out)
        try:
            if options.tokenizer == "byte":
                tokenizer: ByteTokenizer | BpeTokenizer = ByteTokenizer()
            else:
                tokenizer = loaded if loaded is not None else _train_tokenizer(files, options)
            split = _write_splits(tmp, source, files, tokenizer, options, override=None)
            if split.override is not None:
                split = _write_splits(tmp, source, files, tokenizer, options, override=split.override)
            meta = _store_meta(source, files, tokenizer, split, options)
            if isinstance(tokenizer, BpeTokenizer):
                import numpy as np

                atomic_write_text(tmp / TOKENIZER_FILE, tokenizer.json_text)
                buffer = io.BytesIO()
                np.save(buffer, tokenizer.token_bytes(), allow_pickle=False)
                atomic_write_bytes(tmp / TOKEN_BYTES_FILE, buffer.getvalue())
            meta["prepare_s"] = round(time.perf_counter() - started, 3)
            # atomic_write_text, not _json: the last write before the swap (tests hold it to interrupt the build)
            atomic_write_text(tmp / META_FILE, json.dumps(meta, indent=2, sort_keys=True) + "\n")

            with held():
                _swap_in(tmp, _real_out(out))
        except BaseException:
            _remove_build(tmp)
            raise
    return meta


def check_out_outside_source(out: Path, source: str, files: list[SourceFile]) -> None:
    """A store inside its own source would be read as corpus by the next build (its documents.tsv
    and meta.json are text), so every rebuild would change it: refused."""
    target = _real_out(out).resolve()
    for root in source_roots(source):
        if target == root or target.is_relative_to(root):
            raise DelphiError(
                f"--out {out}: is inside --source {source}, so the next build would read this store "
                "(its meta.json and documents.tsv) as corpus; put the store outside the source"
            )
    inside = next((f for f in files if f.path.resolve().is_relative_to(target)), None)
    if inside is not None:
        raise DelphiError(
            f"--out {out}: --source {source} matches {inside.path}, a file of this store: the build "
            "would read its own store as corpus; put the store outside the source, or narrow the glob"
        )


def _real_out(out: Path) -> Path:
    return out.resolve() if out.is_symlink() else out  # rebuild where the link points; the link stays


@dataclass
class _Bar:
    """The progress of one pass: bytes of the source's files read, documents per second."""

    total: int
    desc: str
    enabled: bool
    docs: int = 0
    bar: Any = None
    started: float = field(default_factory=time.perf_counter)
    shown: float = 0.0

    def __post_init__(self) -> None:
        if self.enabled:
            from tqdm import tqdm

            # Only on a terminal (disable=None), and erased when done (leave=False): a log or a refusal
            # keeps its one line.
            self.bar = tqdm(
                total=self.total,
                desc=self.desc,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                dynamic_ncols=True,
                file=sys.stderr,
                disable=None,
                leave=False,
            )

    def read(self, n: int) -> None:
        if self.bar is not None and n:
            self.bar.update(n)

    def document(self) -> None:
        self.docs += 1
        if self.bar is not None and (now := time.perf_counter()) - self.shown > 0.5:
            self.shown = now
            self.bar.set_postfix_str(
                f"{self.docs:,} docs, {self.docs / max(now - self.started, 1e-9):,.0f} docs/s", refresh=False
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.docs:,} docs", refresh=False)
            self.bar.close()


def _source_bytes(files: list[SourceFile]) -> int:
    total = 0
    for f in files:
        with contextlib.suppress(OSError):
            total += f.path.stat().st_size
    return total


def _train_tokenizer(files: list[SourceFile], options: PrepareOptions) -> BpeTokenizer:
    """A byte-level BPE vocabulary trained on the train split's documents (by the split rule's
    threshold), the first `tokenizer_train_bytes` of them."""
    bar = _Bar(_source_bytes(files), "train tokenizer", options.progress)
    try:

        def train_docs() -> Iterator[bytes]:
            for doc in iter_documents(files, options.text_field, bar.read):
                if document_hash_fraction(doc.id) >= VAL_FRACTION:
                    bar.document()
                    yield doc.data

        assert options.vocab_size is not None
        tokenizer = BpeTokenizer.train(texts_of(train_docs(), options.tokenizer_train_bytes), options.vocab_size)
    finally:
        bar.close()
    if tokenizer.vocab_size < options.vocab_size:
        print(
            f"warning: --vocab-size {options.vocab_size}: the corpus gave only {tokenizer.vocab_size} tokens "
            "(no more pairs to merge); the store records the vocabulary as trained",
            file=sys.stderr,
        )
    return tokenizer


class _SplitFile:
    """One split's token file, written and hashed as it grows."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "wb", buffering=WRITE_BUFFER_BYTES)
        self.sha = hashlib.sha256()
        self.tokens = 0
        self.text_bytes = 0  # the documents' UTF-8 bytes plus one per separator
        self.documents = 0

    def append(self, payload: bytes, tokens: int, text_bytes: int) -> None:
        self.file.write(payload)
        self.sha.update(payload)
        self.tokens += tokens
        self.text_bytes += text_bytes
        self.documents += 1


@dataclass
class _Split:
    """What one pass over the source wrote, and the fallback a second pass needs (if any)."""

    train: _SplitFile
    val: _SplitFile
    documents: int = 0
    bytes: int = 0  # the documents' UTF-8 bytes, without separators
    by_package: dict[str, int] = field(default_factory=dict)
    val_token_bytes: int = 0
    first: tuple[float, str] | None = None  # (hash fraction, id) of the lowest and highest document
    last: tuple[float, str] | None = None
    override: tuple[str, str] | None = None  # ("val", id): only it is val; ("train", id): only it is train
    sha256: str = ""


def _is_val(doc_id: str, fraction: float, override: tuple[str, str] | None) -> bool:
    """The split rule (module docstring): the threshold, or the fallback a first pass found necessary."""
    if override is None:
        return fraction < VAL_FRACTION
    kind, chosen = override
    return doc_id == chosen if kind == "val" else doc_id != chosen


def _write_splits(
    tmp: Path,
    source: str,
    files: list[SourceFile],
    tokenizer: Any,
    options: PrepareOptions,
    override: tuple[str, str] | None,
) -> _Split:
    bar = _Bar(_source_bytes(files), "prepare" if override is None else "prepare (split fallback)", options.progress)
    split = _Split(_SplitFile(tmp / "train.bin"), _SplitFile(tmp / "val.bin"))
    table = tokenizer.token_bytes() if isinstance(tokenizer, BpeTokenizer) else None
    try:
        with open(tmp / "documents.tsv", "w", encoding="utf-8", newline="\n") as listing:
            listing.write("id\tsplit\tbytes\n")
            batch: list[tuple[SourceDocument, bool]] = []
            batch_bytes = 0
            for doc in iter_documents(files, options.text_field, bar.read):
                fraction = document_hash_fraction(doc.id)
                val = _is_val(doc.id, fraction, override)
                split.first = min(split.first or (fraction, doc.id), (fraction, doc.id), key=lambda t: t[0])
                split.last = max(split.last or (fraction, doc.id), (fraction, doc.id), key=lambda t: t[0])
                listing.write(f"{doc.id}\t{'val' if val else 'train'}\t{len(doc.data)}\n")
                split.documents += 1
                split.bytes += len(doc.data)
                package = package_of(doc.file_id)
                split.by_package[package] = split.by_package.get(package, 0) + len(doc.data)
                bar.document()
                if table is None:
                    (split.val if val else split.train).append(
                        doc.data + DOCUMENT_SEPARATOR, len(doc.data) + 1, len(doc.data) + 1
                    )
                    continue
                batch.append((doc, val))
                batch_bytes += len(doc.data)
                if batch_bytes >= ENCODE_BATCH_BYTES:
                    _append_encoded(split, batch, tokenizer, table)
                    batch, batch_bytes = [], 0
            if batch:
                _append_encoded(split, batch, tokenizer, table)
    finally:
        bar.close()
        for part in (split.train, split.val):
            part.file.close()
    if split.documents == 0:
        raise DelphiError(
            f"source: {quoted(source)} holds no text files (binary or non-UTF-8 files and empty records are skipped)"
        )
    if split.documents < 2:
        raise DelphiError(f"source: {split.documents} text document(s), need at least 2 to split train/validation")
    if table is None:
        split.val_token_bytes = split.val.tokens
    if override is None and (split.val.documents == 0 or split.train.documents == 0):
        assert split.first is not None and split.last is not None
        split.override = ("val", split.first[1]) if split.val.documents == 0 else ("train", split.last[1])
        return split
    combined = split.train.sha.copy()  # sha256 of train.bin followed by val.bin
    with open(tmp / "val.bin", "rb") as f:
        while chunk := f.read(WRITE_BUFFER_BYTES):
            combined.update(chunk)
    split.sha256 = combined.hexdigest()
    return split


def _append_encoded(
    split: _Split, batch: list[tuple[SourceDocument, bool]], tokenizer: BpeTokenizer, table: np.ndarray
) -> None:
    """Encode a batch of documents at once (the tokenizers package spreads it over the cores) and
    append each, with the separator, to its split."""
    import numpy as np

    dtype = np.dtype(tokenizer.dtype)
    separator = tokenizer.separator_id
    for (doc, val), ids in zip(batch, tokenizer.encode_batch([d.data.decode("utf-8") for d, _ in batch])):
        tokens = np.asarray(ids + [separator], dtype=dtype)
        (split.val if val else split.train).append(tokens.tobytes(), len(tokens), len(doc.data) + 1)
        if val:
            split.val_token_bytes += int(table[tokens].sum())


def _store_meta(source: str, files: list[SourceFile], tokenizer: Any, split: _Split, options: PrepareOptions) -> dict:
    meta = {
        "format": STORE_FORMAT,
        "source": source,
        "source_info": describe_source(source),
        "files": split.documents,  # documents (a text file is one; a lone file's chunks and records are many)
        "documents_train": split.train.documents,
        "documents_val": split.val.documents,
        "bytes": split.bytes,
        "n_train": split.train.tokens,
        "n_val": split.val.tokens,
        "sha256": split.sha256,  # of train.bin followed by val.bin
        "train_sha256": split.train.sha.hexdigest(),
        "val_sha256": split.val.sha.hexdigest(),
        "split_rule": SPLIT_RULE,
        "val_fraction": VAL_FRACTION,
        "document_separator": DOCUMENT_SEPARATOR[0] if isinstance(tokenizer, ByteTokenizer) else tokenizer.separator_id,
        "tokenizer": tokenizer.meta(),
        # Bytes of text of each split, one per document separator included (for bytes: the token
        # counts): bits per byte = nats per token x tokens / bytes. val_token_bytes: the same
        # bytes counted through the vocabulary's per-token lengths (TokenStore.eval_bytes).
        "bytes_train": split.train.text_bytes,
        "bytes_val": split.val.text_bytes,
        "val_token_bytes": split.val_token_bytes,
        # Bytes per package ("site-packages/numpy", "stdlib/json"): two stores of one source built
        # on two machines can be told apart by package (`package_differences`), not only by hash.
        "bytes_by_package": split.by_package,
        "python": platform.python_version(),
        "interpreter": sys.executable,
        "delphi_version": __version__,
    }
    shards = sum(1 for f in files if f.is_shard)
    if shards:
        meta |= {"shards": shards, "text_field": options.text_field}
    if isinstance(tokenizer, BpeTokenizer):
        meta["tokenizer"] |= {"token_bytes": TOKEN_BYTES_FILE}
        if tokenizer.origin == "trained":
            meta["tokenizer"] |= {
                "requested_vocab_size": options.vocab_size,
                "train_bytes_max": options.tokenizer_train_bytes,
            }
    return meta


# What prepare_store writes into a store directory; anything else found there is the user's and is
# carried over into the rebuilt store.
STORE_FILES = ("train.bin", "val.bin", "documents.tsv", META_FILE, TOKENIZER_FILE, TOKEN_BYTES_FILE)


def _new_build_dir(out: Path) -> Path:
    """A temporary sibling of `out` to build the store in (removed by _remove_build on failure)."""
    out = _real_out(out)
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".building", dir=parent))
    except OSError as e:
        raise DelphiError(f"--out {out}: cannot build the store beside it in {parent} ({e.strerror})") from None
    try:
        mode = (out.stat().st_mode & 0o7777) if out.is_dir() else (NEW_DIR_MODE & ~current_umask())
        tmp.chmod(mode)  # mkdtemp's 0700 would hide the store from other accounts
    except BaseException:
        _remove_build(tmp)
        raise
    return tmp


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
        raise DelphiError(
            f"--out {out}: cannot swap the rebuilt store in ({e.strerror}); the old store is unchanged"
        ) from None
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


# ---- before a run's first step: the store's bytes are the ones its meta.json pins, and its
# vocabulary is the config's

VERIFIED_DIR = "verified-stores"  # under cache_dir(): one marker per store whose bytes were hashed
_VERIFIED: set[tuple] = set()  # this process's verified (path, stat) keys


def _stat_key(path: Path) -> list[int]:
    """What changes when a file's bytes change: device, inode, size, mtime and ctime (ns). ctime
    cannot be set back by a user (utime sets mtime only), so an edit in place is always seen."""
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _verified_marker(store_dir: Path) -> Path:
    digest = hashlib.sha256(str(store_dir.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return cache_dir() / VERIFIED_DIR / f"{digest}.json"


def verify_store_bytes(store_dir: Path, meta: dict) -> None:
    """DelphiError unless train.bin and val.bin hash to the sha256 values in meta.json.

    The full hash (sha256 at ~1.7 GB/s here: 20 ms for the stdlib store, ~12 s for 20 GB) runs once
    per store state: a marker under $DELPHI_CACHE/verified-stores/ keyed by the files' stat
    (`_stat_key`) and the meta's hashes skips it while nothing changed; an unwritable cache only
    means hashing again next time."""
    files = [store_dir / "train.bin", store_dir / "val.bin"]
    try:
        key = {
            "store": str(store_dir.resolve()),
            "files": [_stat_key(f) for f in files],
            "sha256": [meta.get("train_sha256"), meta.get("val_sha256"), meta.get("sha256")],
        }
    except OSError as e:
        raise DelphiError(f"{store_dir}: cannot read the token store ({e.strerror})") from None
    frozen = json.dumps(key, sort_keys=True)
    if frozen in _VERIFIED:
        return
    marker = _verified_marker(store_dir)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(marker.read_text()) == key:
            _VERIFIED.add(frozen)
            return
    hashes = {"train": hashlib.sha256(), "val": hashlib.sha256(), "all": hashlib.sha256()}
    for name, f in zip(("train", "val"), files):
        with open(f, "rb") as handle:
            while chunk := handle.read(WRITE_BUFFER_BYTES):
                hashes[name].update(chunk)
                hashes["all"].update(chunk)
    for name, recorded, file in (
        ("train", "train_sha256", files[0]),
        ("val", "val_sha256", files[1]),
        ("all", "sha256", None),
    ):
        expected = meta.get(recorded)
        actual = hashes[name].hexdigest()
        if expected is not None and actual != expected:
            what = (
                f"{file}: its sha256 {actual[:16]}..."
                if file
                else f"{store_dir}: train.bin + val.bin hash to {actual[:16]}..."
            )
            raise DelphiError(
                f"{what}, not the {str(expected)[:16]}... its meta.json records ({recorded}): the store "
                "changed after `delphi data prepare`; prepare it again"
            )
    _VERIFIED.add(frozen)
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(marker, key)


def check_vocabulary(store_dir: Path, meta: dict, vocab_size: int, tokenizer: str | None, where: str = "") -> None:
    """DelphiError unless a model of `vocab_size` tokens (and the tokenizer a config names, if any:
    "byte", "bpe" or a tokenizer.json path) matches the vocabulary the store was built with."""
    prefix = f"{where}: " if where else ""
    recorded = meta.get("tokenizer") or {}
    kind, store_vocab = recorded.get("kind", "byte"), recorded.get("vocab_size", 256)
    described = f"the token store {store_dir} ({kind}, {store_vocab} tokens" + (
        f", tokenizer sha256 {str(recorded.get('sha256'))[:12]})" if recorded.get("sha256") else ")"
    )
    if tokenizer is not None:
        if tokenizer in ("byte", "bpe"):
            if tokenizer != kind:
                raise DelphiError(
                    f"{prefix}data.tokenizer: {tokenizer}, but {described} was built with another; "
                    "point data.store at a store of this tokenizer, or prepare one"
                )
        else:
            path = Path(tokenizer).expanduser()
            try:
                sha = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as e:
                raise DelphiError(f"{prefix}data.tokenizer: {tokenizer}: cannot read it ({e.strerror})") from None
            if sha != recorded.get("sha256"):
                raise DelphiError(
                    f"{prefix}data.tokenizer: {tokenizer} (sha256 {sha[:12]}) is not the tokenizer of "
                    f"{described}; prepare a store with `--tokenizer {tokenizer}`"
                )
    if vocab_size != store_vocab:
        raise DelphiError(
            f"{prefix}model.vocab_size: {vocab_size}, but {described}; the model's vocabulary must be "
            f"the store's: set model.vocab_size: {store_vocab}, or point data.store at another store"
        )


def store_dtype(store_dir: Path, meta: dict) -> str:
    """The token dtype meta.json names; DelphiError when it is not one or cannot hold the vocabulary."""
    tokenizer = meta.get("tokenizer") or {}
    name = tokenizer.get("dtype", "uint8")
    if name not in STORE_DTYPES:
        raise DelphiError(
            f"{store_dir / META_FILE}: tokenizer.dtype {quoted(name)}, expected one of {', '.join(STORE_DTYPES)}"
        )
    vocab = tokenizer.get("vocab_size", 256)
    largest = (1 << (8 * STORE_DTYPES[name])) - 1
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1 or vocab > largest + 1:
        raise DelphiError(
            f"{store_dir / META_FILE}: a vocabulary of {quoted(vocab)} tokens does not fit the store's "
            f"dtype {name} (ids up to {largest}); prepare the store again"
        )
    return str(name)


def check_token_file(file: Path, itemsize: int, expected: int) -> None:
    """DelphiError unless `file` holds `expected` tokens of `itemsize` bytes (meta.json's count)."""
    try:
        size = file.stat().st_size
    except OSError as e:
        raise DelphiError(f"{file}: cannot read it ({e.strerror}); prepare the store again") from None
    if size != expected * itemsize:
        raise DelphiError(
            f"{file}: holds {size // itemsize} tokens but meta.json says {expected}; prepare the store again"
        )


def check_store_for_config(cfg: Any, *, where: str = "") -> Path:
    """The directory of the store `cfg` (a delphi.train.config.TrainConfig) trains on, checked
    before its first step: the one store check the trainer and `ladder run` make. Resolves
    `cfg.data.store`, refuses a dtype that cannot hold the vocabulary and files whose sizes or
    sha256 are not meta.json's (`verify_store_bytes`), and a `model.vocab_size` or a
    `data.tokenizer` that is not the store's (`check_vocabulary`). Whether the store can feed the
    run's batches and eval set is TokenStore.check_run."""
    store_dir = resolve_store(cfg.data.store)
    meta = read_json(store_dir / META_FILE, what="token store meta.json")
    if not isinstance(meta, dict) or not all(k in meta for k in ("n_train", "n_val")):
        raise DelphiError(
            f"{store_dir / META_FILE}: no 'n_train' or 'n_val'; not a token store (rebuild it with `delphi data prepare`)"
        )
    itemsize = STORE_DTYPES[store_dtype(store_dir, meta)]
    for name, key in (("train.bin", "n_train"), ("val.bin", "n_val")):
        check_token_file(store_dir / name, itemsize, int(meta[key]))
    verify_store_bytes(store_dir, meta)
    check_vocabulary(store_dir, meta, cfg.model.vocab_size, cfg.data.tokenizer, where)
    return store_dir
