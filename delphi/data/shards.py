"""Record shards: the files a lab keeps web text in, read one document at a time.

    JSONL     one JSON object per line (.jsonl, .ndjson), optionally compressed with gzip
              (.jsonl.gz) or zstd (.jsonl.zst); Dolma's .json.gz / .json.zst are JSONL too
    Parquet   one row per document (.parquet), read one record batch at a time (pyarrow)
    Arrow     the files `datasets.Dataset.save_to_disk` writes (.arrow: Arrow IPC streams)

A document is the string in its `text_field` (default "text"). Its id is the shard's id, "#", and
the 1-based line number (JSONL, as an editor shows it) or the 0-based row (Parquet, Arrow, as
pyarrow counts). Nothing is held beyond one line or one record batch, so memory does not grow
with the shard. A line that is not JSON, a record without the field, a field that is not a
string, a file of the wrong format and a shard with no record are DelphiErrors naming the file,
the line or row and the field.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from delphi.errors import DelphiError, quoted

DEFAULT_TEXT_FIELD = "text"  # FineWeb, Dolma, RedPajama, The Pile and C4 all name it so
JSONL_SUFFIXES = (".jsonl", ".ndjson")
# Dolma keeps JSONL as .json.gz / .json.zst; a bare .json is one JSON document, read as a text file.
COMPRESSED_JSON_SUFFIXES = (".json",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)
# Files `datasets.save_to_disk` writes beside its .arrow files: its own bookkeeping, not corpus text.
DATASETS_METADATA_FILES = ("state.json", "dataset_info.json", "dataset_dict.json")
RECORD_BATCH_ROWS = 1_024  # Parquet rows decoded at a time
PROGRESS_EVERY_RECORDS = 1_024  # a shard reports how far into its file it is this often
EXTRA_HINT = "pip install 'delphi[corpora]'"

Progress = Callable[[int], None]  # told the bytes of the file read so far


def shard_format(path: Path) -> tuple[str, str | None] | None:
    """(format, compression) of a record shard by its name, or None for any other file."""
    name = path.name.lower()
    suffixes = Path(name).suffixes
    compression = COMPRESSION_SUFFIXES.get(suffixes[-1]) if suffixes else None
    inner = suffixes[-2] if compression and len(suffixes) >= 2 else (suffixes[-1] if suffixes else "")
    if inner in JSONL_SUFFIXES or (compression and inner in COMPRESSED_JSON_SUFFIXES):
        return "jsonl", compression
    if compression:
        return None  # another compressed file (.tar.gz, .py.gz): not a shard, and not text either
    if inner in PARQUET_SUFFIXES:
        return "parquet", None
    if inner in ARROW_SUFFIXES:
        return "arrow", None
    return None


def read_records(
    path: Path, shard_id: str, fmt: str, compression: str | None, text_field: str, progress: Progress | None = None
) -> Iterator[tuple[str, str]]:
    """(document id, text) of every record of one shard, in file order."""
    readers = {"jsonl": _jsonl_records, "parquet": _parquet_records, "arrow": _arrow_records}
    yield from readers[fmt](path, shard_id, compression, text_field, progress or (lambda _: None))


def _fields(obj: dict) -> str:
    names = list(obj)
    return ", ".join(quoted(str(n), 40) for n in names[:8]) + (" ..." if len(names) > 8 else "") if names else "none"


@contextlib.contextmanager
def _open_decompressed(path: Path, compression: str | None) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """(the decompressed stream, the raw file: its position is the progress)."""
    raw = open(path, "rb")
    try:
        if compression is None:
            yield raw, raw
        elif compression == "gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                yield stream, raw
        else:
            try:
                import zstandard
            except ImportError:
                raise DelphiError(f"{path}: reading zstd shards needs the zstandard package ({EXTRA_HINT})") from None
            with io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=False)) as stream:
                yield stream, raw
    finally:
        raw.close()


def _decompression_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [gzip.BadGzipFile, EOFError, OSError]
    with contextlib.suppress(ImportError):
        import zstandard

        errors.append(zstandard.ZstdError)
    return tuple(errors)


def _jsonl_records(
    path: Path, shard_id: str, compression: str | None, text_field: str, progress: Progress
) -> Iterator[tuple[str, str]]:
    records = 0
    line_no = 0
    try:
        with _open_decompressed(path, compression) as (stream, raw):
            for line_no, line in enumerate(stream, 1):
                if not line.strip():
                    continue  # a blank line (a trailing newline, a separator) holds no record
                try:
                    obj = json.loads(line)
                except (ValueError, UnicodeDecodeError) as e:
                    reason = getattr(e, "msg", None) or type(e).__name__
                    raise DelphiError(
                        f"{path}: line {line_no}: not a JSON line ({reason}): {quoted(line[:80].decode('utf-8', 'replace').rstrip(), 80)}"
                    ) from None
                yield f"{shard_id}#{line_no}", _text_of(obj, text_field, f"{path}: line {line_no}")
                records += 1
                if records % PROGRESS_EVERY_RECORDS == 0:
                    progress(raw.tell())
    except _decompression_errors() as e:
        if isinstance(e, DelphiError):
            raise
        what = {"gzip": "gzip", "zstd": "zstd"}.get(compression or "", "JSONL")
        raise DelphiError(
            f"{path}: not a readable {what} file after line {line_no} ({type(e).__name__}: {e})"
        ) from None
    if records == 0:
        raise DelphiError(f"{path}: an empty shard (no JSON line with a record); remove it or fill it")


def _text_of(obj: object, text_field: str, where: str) -> str:
    if not isinstance(obj, dict):
        raise DelphiError(f"{where}: a JSON {type(obj).__name__}, expected an object with a {quoted(text_field)} field")
    if text_field not in obj:
        raise DelphiError(
            f"{where}: no field {quoted(text_field)} (fields: {_fields(obj)}); name the text field with --text-field"
        )
    text = obj[text_field]
    if not isinstance(text, str):
        shown = "null" if text is None else type(text).__name__
        raise DelphiError(f"{where}: field {quoted(text_field)} holds {shown}, expected a string")
    return text


def _pyarrow(path: Path, what: str):  # noqa: ANN202 - the pyarrow module
    try:
        import pyarrow

        return pyarrow
    except ImportError:
        raise DelphiError(f"{path}: reading {what} needs the pyarrow package ({EXTRA_HINT})") from None


def _check_column(path: Path, schema, text_field: str, rows: int | None) -> None:  # noqa: ANN001 - a pyarrow schema
    import pyarrow as pa

    if text_field not in schema.names:
        shown = ", ".join(quoted(n, 40) for n in schema.names[:8]) + (" ..." if len(schema.names) > 8 else "")
        raise DelphiError(
            f"{path}: no column {quoted(text_field)} (columns: {shown or 'none'}); name the text column with --text-field"
        )
    kind = schema.field(text_field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or getattr(pa.types, "is_string_view", lambda _: False)(kind)
    ):
        raise DelphiError(f"{path}: column {quoted(text_field)} holds {kind}, expected strings")
    if rows == 0:
        raise DelphiError(f"{path}: an empty shard (0 rows); remove it or fill it")


def _column_texts(
    path: Path,
    batches,
    text_field: str,
    shard_id: str,
    progress: Progress,  # noqa: ANN001
    position: Callable[[], int],
) -> Iterator[tuple[str, str]]:
    row = 0
    for batch in batches:
        column = batch.column(batch.schema.get_field_index(text_field))
        for text in column.to_pylist():
            if text is None:
                raise DelphiError(f"{path}: row {row}: field {quoted(text_field)} holds null, expected a string")
            yield f"{shard_id}#{row}", text
            row += 1
        progress(position())
    if row == 0:
        raise DelphiError(f"{path}: an empty shard (0 rows); remove it or fill it")


def _parquet_records(
    path: Path, shard_id: str, compression: str | None, text_field: str, progress: Progress
) -> Iterator[tuple[str, str]]:
    pa = _pyarrow(path, "Parquet")
    import pyarrow.parquet as pq

    try:
        shard = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DelphiError(f"{path}: not a Parquet file ({' '.join(str(e).split())[:160]})") from None
    with contextlib.closing(shard):
        _check_column(path, shard.schema_arrow, text_field, shard.metadata.num_rows)
        done = [0]

        def batches():  # noqa: ANN202
            for group in range(shard.num_row_groups):
                yield from shard.iter_batches(batch_size=RECORD_BATCH_ROWS, row_groups=[group], columns=[text_field])
                done[0] += shard.metadata.row_group(group).total_byte_size

        try:
            yield from _column_texts(
                path, batches(), text_field, shard_id, progress, lambda: min(done[0], path.stat().st_size)
            )
        except (pa.ArrowException, OSError) as e:
            raise DelphiError(f"{path}: unreadable Parquet data ({' '.join(str(e).split())[:160]})") from None


def _arrow_records(
    path: Path, shard_id: str, compression: str | None, text_field: str, progress: Progress
) -> Iterator[tuple[str, str]]:
    pa = _pyarrow(path, "Arrow files")
    import pyarrow.ipc

    source = pa.memory_map(str(path), "r")
    with contextlib.closing(source):
        try:
            reader = pyarrow.ipc.open_stream(source)  # what `datasets` writes
            batches = iter(reader)
        except pa.ArrowInvalid:
            try:
                source.seek(0)
                file_reader = pyarrow.ipc.open_file(source)  # the Arrow file format
                batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
                reader = file_reader
            except pa.ArrowInvalid as e:
                raise DelphiError(f"{path}: not an Arrow IPC file ({' '.join(str(e).split())[:160]})") from None
        _check_column(path, reader.schema, text_field, None)
        try:
            yield from _column_texts(path, batches, text_field, shard_id, progress, source.tell)
        except (pa.ArrowException, OSError) as e:
            raise DelphiError(f"{path}: unreadable Arrow data ({' '.join(str(e).split())[:160]})") from None


def check_readers(shards: list[tuple[Path, str, str | None]]) -> None:
    """DelphiError, before anything is read, when a (path, format, compression) shard needs a
    package that is not installed (pyarrow for Parquet and Arrow, zstandard for zstd)."""
    for path, fmt, compression in shards:
        if fmt in ("parquet", "arrow"):
            _pyarrow(path, "Parquet" if fmt == "parquet" else "Arrow files")
        elif compression == "zstd":
            try:
                import zstandard  # noqa: F401
            except ImportError:
                raise DelphiError(f"{path}: reading zstd shards needs the zstandard package ({EXTRA_HINT})") from None


def datasets_data_files(directory: Path) -> list[str] | None:
    """The .arrow files `datasets.save_to_disk` listed in `directory`/state.json, in order; None
    when the directory is not such a save."""
    state = directory / "state.json"
    if not state.is_file():
        return None
    try:
        files = json.loads(state.read_text()).get("_data_files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files
    ):
        return None
    return [f["filename"] for f in files]
