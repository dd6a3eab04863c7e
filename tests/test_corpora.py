"""Corpora in the formats labs keep them (JSONL, gzip/zstd JSONL, Parquet, Arrow and a `datasets`
save), BPE vocabularies with bits per byte, the store check before a run's first step, and the
refusals: each an exit 2 with one line and nothing written."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from delphi.cli import main as cli_main
from delphi.data.loader import TokenStore
from delphi.data.store import META_FILE, PrepareOptions, check_store_for_config, prepare_store
from delphi.errors import DelphiError
from delphi.model.config import ModelConfig
from delphi.train.config import DataConfig, OptimConfig, TrainConfig, train_config_to_dict
from delphi.train.trainer import train

pa = pytest.importorskip("pyarrow")  # the `test` extra installs it (pip install -e '.[test]')
pq = pytest.importorskip("pyarrow.parquet")
tokenizers = pytest.importorskip("tokenizers")
zstandard = pytest.importorskip("zstandard")


def _words(n: int = 600, seed: int = 11) -> list[str]:
    """Pseudo-words from syllables: a vocabulary rich enough for a few hundred BPE merges."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"] + ["th", "ing", "er", "st", "qu"]
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(n)]


WORDS = _words()


def _documents(n: int, seed: int = 0) -> list[str]:
    """Sentences of common English words: enough repeated structure for BPE merges and a model to learn."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        sentences = [
            " ".join(rng.choice(WORDS[: rng.randint(50, len(WORDS))]) for _ in range(rng.randint(4, 14))).capitalize()
            + "."
            for _ in range(rng.randint(3, 12))
        ]
        docs.append(" ".join(sentences))
    return docs


def _write_jsonl(path: Path, records: list[dict], opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def _one_line_refusal(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no build left aside


def _split_texts(store: Path) -> tuple[list[bytes], list[bytes]]:
    """The documents of a byte store's train and val splits."""
    return tuple((store / f"{s}.bin").read_bytes().split(b"\x00")[:-1] for s in ("train", "val"))  # type: ignore[return-value]


# ---- plain text: the store is byte for byte what it was


def test_plain_text_stores_are_byte_identical_to_before(tmp_path):
    """The sha256 values come from `prepare_store` before corpora were streamed (main at 088cc32):
    a directory (with a binary file skipped, one split fallback) and a lone file cut into chunks."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(40):
        (src / ("sub" if i % 2 else "") / f"doc{i:02d}.txt").write_text(
            "".join(f"line {j} of document {i}: héllo wörld\n" for j in range(i * 7 + 1))
        )
    (src / "blob.bin").write_bytes(bytes(range(256)))
    lone = tmp_path / "lone.txt"
    lone.write_text("".join(f"row {j}: the quick brown fox\n" for j in range(30000)))
    expected = {
        "dir": ("b7a4a2a5dd1e700cb2ff333cf4e699601955d9881fc90c9d9b8a060a5ad5aa42", 201637, 8939),
        "lone": ("4dd7b31a69740788a351edee90cee725db38167f9a18468fe2b989be6d62638b", 853339, 65566),
    }
    for name, source in (("dir", src), ("lone", lone)):
        meta = prepare_store(str(source), tmp_path / f"store_{name}")
        assert (meta["sha256"], meta["n_train"], meta["n_val"]) == expected[name]
        assert meta["tokenizer"] == {"kind": "byte", "vocab_size": 256, "dtype": "uint8"}
        assert (meta["bytes_train"], meta["bytes_val"], meta["val_token_bytes"]) == (
            meta["n_train"],
            meta["n_val"],
            meta["n_val"],
        )


# ---- record shards


def _shards(root: Path, docs: list[str]) -> dict[str, Path]:
    """The same documents in every format a lab keeps them in, one shard directory each."""
    records = [{"id": f"doc-{i}", "text": d, "meta": {"n": i}} for i, d in enumerate(docs)]
    made = {}
    for name in ("jsonl", "gzip", "zstd", "parquet", "arrow", "datasets"):
        (root / name).mkdir(parents=True)
        made[name] = root / name
    half = len(records) // 2
    _write_jsonl(root / "jsonl" / "part-0.jsonl", records[:half])
    _write_jsonl(root / "jsonl" / "part-1.jsonl", records[half:])
    _write_jsonl(root / "gzip" / "part-0.jsonl.gz", records[:half], gzip.open)
    _write_jsonl(root / "gzip" / "part-1.jsonl.gz", records[half:], gzip.open)
    for k, part in enumerate((records[:half], records[half:])):
        with open(root / "zstd" / f"part-{k}.jsonl.zst", "wb") as raw:
            with zstandard.ZstdCompressor().stream_writer(raw) as f:
                f.write("".join(json.dumps(r) + "\n" for r in part).encode())
    table = pa.table({"id": [r["id"] for r in records], "text": [r["text"] for r in records]})
    pq.write_table(table.slice(0, half), root / "parquet" / "part-0.parquet", row_group_size=7)
    pq.write_table(table.slice(half), root / "parquet" / "part-1.parquet", row_group_size=7)
    for directory, name in ((root / "arrow", "part-0.arrow"), (root / "datasets", "data-00000-of-00001.arrow")):
        with pa.ipc.new_stream(str(directory / name), table.schema) as writer:
            for batch in table.to_batches(max_chunksize=10):
                writer.write_batch(batch)
    # what `datasets.Dataset.save_to_disk` writes beside its Arrow stream (its bookkeeping is not corpus)
    (root / "datasets" / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_fingerprint": "abc", "_split": None})
    )
    (root / "datasets" / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))
    return made


def test_every_shard_format_gives_the_same_documents(tmp_path):
    docs = _documents(120)
    for name, source in _shards(tmp_path / "corpus", docs).items():
        meta = prepare_store(str(source), tmp_path / f"store_{name}")
        train, val = _split_texts(tmp_path / f"store_{name}")
        assert sorted(train + val) == sorted(d.encode() for d in docs), name  # every record, as its text, once
        assert meta["files"] == len(docs) and meta["documents_val"] >= 1 and meta["text_field"] == "text"
        # ids: the shard's id and the line (JSONL, from 1) or the row (from 0); the split is by id
        ids = [
            line.split("\t")[0] for line in (tmp_path / f"store_{name}" / "documents.tsv").read_text().splitlines()[1:]
        ]
        first = {
            "jsonl": "part-0.jsonl#1",
            "gzip": "part-0.jsonl.gz#1",
            "zstd": "part-0.jsonl.zst#1",
            "parquet": "part-0.parquet#0",
            "arrow": "part-0.arrow#0",
            "datasets": "data-00000-of-00001.arrow#0",
        }[name]
        assert ids[0] == first and len(ids) == len(docs)
    # A directory with two formats reads each file by its name; a glob of shards works too.
    glob_meta = prepare_store(str(tmp_path / "corpus" / "*" / "part-0.*"), tmp_path / "store_glob")
    assert glob_meta["files"] == 4 * (len(docs) // 2) + len(docs) and glob_meta["shards"] == 5  # part-0.arrow holds all


def test_text_field_names_the_field(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "c.jsonl", [{"content": d} for d in _documents(30)])
    out = tmp_path / "store"
    assert cli_main(["data", "prepare", "--source", str(src), "--out", str(out)]) == 2
    _one_line_refusal(capsys, f"{src}: line 1: no field 'text'", "'content'", "--text-field")
    _nothing_written(out)
    assert (
        cli_main(["data", "prepare", "--source", str(src), "--out", str(out), "--text-field", "content", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["documents_train"] >= 28


@pytest.mark.parametrize(
    "case",
    [
        "not_json",
        "missing_field",
        "not_a_string",
        "null_text",
        "empty_jsonl",
        "parquet_column",
        "parquet_null",
        "parquet_empty",
        "bad_gzip",
        "not_parquet",
    ],
)
def test_a_bad_shard_is_one_line_naming_file_line_and_field(tmp_path, capsys, case):
    good = [{"text": d} for d in _documents(10)]
    src = tmp_path / "corpus"
    src.mkdir()
    _write_jsonl(src / "a.jsonl", good)  # a good shard first: the bad one is found while streaming
    if case == "not_json":
        (src / "b.jsonl").write_text(json.dumps(good[0]) + "\n" + '{"text": "cut' + "\n")
        needles = (f"{src / 'b.jsonl'}: line 2: not a JSON line",)
    elif case == "missing_field":
        _write_jsonl(src / "b.jsonl", good[:3] + [{"body": "x"}])
        needles = (f"{src / 'b.jsonl'}: line 4: no field 'text'", "'body'")
    elif case == "not_a_string":
        _write_jsonl(src / "b.jsonl", [{"text": 12}])
        needles = (f"{src / 'b.jsonl'}: line 1: field 'text' holds int, expected a string",)
    elif case == "null_text":
        _write_jsonl(src / "b.jsonl", [{"text": None}])
        needles = (f"{src / 'b.jsonl'}: line 1: field 'text' holds null",)
    elif case == "empty_jsonl":
        (src / "b.jsonl").write_text("\n")
        needles = (f"{src / 'b.jsonl'}: an empty shard",)
    elif case == "parquet_column":
        pq.write_table(pa.table({"body": ["x", "y"]}), src / "b.parquet")
        needles = (f"{src / 'b.parquet'}: no column 'text'", "'body'")
    elif case == "parquet_null":
        pq.write_table(pa.table({"text": ["x", None]}), src / "b.parquet")
        needles = (f"{src / 'b.parquet'}: row 1: field 'text' holds null",)
    elif case == "parquet_empty":
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), src / "b.parquet")
        needles = (f"{src / 'b.parquet'}: an empty shard",)
    elif case == "bad_gzip":
        (src / "b.jsonl.gz").write_bytes(b"not gzip at all")
        needles = (f"{src / 'b.jsonl.gz'}: not a readable gzip file",)
    else:
        (src / "b.parquet").write_bytes(b"PAR1 but not really")
        needles = (f"{src / 'b.parquet'}: not a Parquet file",)
    out = tmp_path / "store"
    assert cli_main(["data", "prepare", "--source", str(src), "--out", str(out)]) == 2
    _one_line_refusal(capsys, *needles)
    _nothing_written(out)


def test_a_failed_rebuild_leaves_the_old_store(tmp_path, capsys):
    src = tmp_path / "corpus"
    src.mkdir()
    _write_jsonl(src / "a.jsonl", [{"text": d} for d in _documents(40)])
    out = tmp_path / "store"
    assert cli_main(["data", "prepare", "--source", str(src), "--out", str(out)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (src / "b.jsonl").write_text("{oops\n")
    assert cli_main(["data", "prepare", "--source", str(src), "--out", str(out)]) == 2
    _one_line_refusal(capsys, f"{src / 'b.jsonl'}: line 1: not a JSON line")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".store.")]


# ---- issue 53, cause 9: a store inside its own source


def test_out_inside_source_is_refused(tmp_path, capsys):
    """Before: the second prepare read the first store's meta.json and documents.tsv as corpus, and
    the store changed on every run."""
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(20):
        (src / f"d{i}.txt").write_text(f"document {i}\n" * 50)
    out = src / "store"
    assert cli_main(["data", "prepare", "--source", str(src), "--out", str(out)]) == 2
    _one_line_refusal(capsys, f"--out {out}: is inside --source {src}")
    _nothing_written(out)
    # a glob that would match the store's own files
    outside = tmp_path / "store"
    assert cli_main(["data", "prepare", "--source", str(src), "--out", str(outside)]) == 0
    capsys.readouterr()
    pattern = str(tmp_path / "**" / "*.*")
    assert cli_main(["data", "prepare", "--source", pattern, "--out", str(outside), "--force"]) == 2
    _one_line_refusal(capsys, f"--out {outside}: --source {pattern} matches", "a file of this store")


# ---- BPE: trained here or loaded, recorded in the store


@pytest.fixture(scope="module")
def bpe_corpus(tmp_path_factory) -> Path:
    """A JSONL shard, a gzip JSONL shard and a Parquet shard of one text, and the same text as a
    plain file: ~1 MB of sentences."""
    root = tmp_path_factory.mktemp("bpe_corpus")
    docs = _documents(3600, seed=7)
    third = len(docs) // 3
    _write_jsonl(root / "web.jsonl", [{"text": d} for d in docs[:third]])
    _write_jsonl(root / "web.jsonl.gz", [{"text": d} for d in docs[third : 2 * third]], gzip.open)
    pq.write_table(pa.table({"text": docs[2 * third :]}), root / "web.parquet", row_group_size=100)
    (root / "plain.txt").write_text("\n".join(docs) + "\n")
    return root


BPE_VOCAB = 384


def test_bpe_store_records_its_tokenizer_and_is_deterministic(bpe_corpus, tmp_path):
    options = PrepareOptions(tokenizer="bpe", vocab_size=BPE_VOCAB)
    meta = prepare_store(str(bpe_corpus / "web.jsonl"), tmp_path / "a", options=options)
    again = prepare_store(str(bpe_corpus / "web.jsonl"), tmp_path / "b", options=options)
    tok = meta["tokenizer"]
    assert tok["kind"] == "bpe" and tok["vocab_size"] == BPE_VOCAB and tok["dtype"] == "uint16"
    assert tok["sha256"] == hashlib.sha256((tmp_path / "a" / "tokenizer.json").read_bytes()).hexdigest()
    assert (meta["sha256"], tok["sha256"]) == (again["sha256"], again["tokenizer"]["sha256"])  # same corpus, same store
    store = TokenStore(tmp_path / "a")
    assert store.train.dtype == np.uint16 and store.vocab_size == BPE_VOCAB and int(store.train.max()) < BPE_VOCAB
    # the separator ends every document; decoding a split gives its documents' text back
    from delphi.data.bpe import BpeTokenizer

    loaded = BpeTokenizer.load(tmp_path / "a" / "tokenizer.json")
    val_docs = [d for d in (tmp_path / "a" / "documents.tsv").read_text().splitlines()[1:] if d.split("\t")[1] == "val"]
    ids = np.asarray(store.val)
    cuts = np.flatnonzero(ids == tok["separator_id"])
    assert len(cuts) == len(val_docs) == meta["documents_val"]
    first = loaded.decode(ids[: cuts[0]].tolist())
    assert len(first.encode()) == int(val_docs[0].split("\t")[2])
    # bytes per token: exact for byte-level BPE (the table reproduces the split's text bytes)
    assert meta["val_token_bytes"] == meta["bytes_val"] == int(store.token_bytes[ids].sum())
    assert store.eval_bytes(np.stack([ids[:33], ids[33:66]])) == float(
        store.token_bytes[ids[1:33]].sum() + store.token_bytes[ids[34:66]].sum()
    )

    # a user's tokenizer.json: loaded, copied into the store, the same sha256
    user = tmp_path / "mine.json"
    user.write_bytes((tmp_path / "a" / "tokenizer.json").read_bytes())
    loaded_meta = prepare_store(
        str(bpe_corpus / "web.parquet"), tmp_path / "c", options=PrepareOptions(tokenizer=str(user))
    )
    assert loaded_meta["tokenizer"]["sha256"] == tok["sha256"] and loaded_meta["tokenizer"]["origin"] == str(user)


def test_bad_tokenizer_arguments_are_refused(bpe_corpus, tmp_path, capsys):
    out = tmp_path / "store"
    src = str(bpe_corpus / "web.jsonl")
    cases = [
        (["--tokenizer", str(tmp_path / "garbage.json")], "not a tokenizer.json"),
        (["--tokenizer", str(tmp_path / "other.json")], "not a tokenizer.json"),
        (["--tokenizer", "bpe"], "--tokenizer bpe: needs --vocab-size"),
        (["--tokenizer", "bpe", "--vocab-size", "100"], "--vocab-size: 100"),
        (["--vocab-size", "300"], "--vocab-size: only with --tokenizer bpe"),
        (["--tokenizer", str(tmp_path / "missing.json")], "cannot read it"),
    ]
    (tmp_path / "garbage.json").write_text("{ not json")
    (tmp_path / "other.json").write_text(json.dumps({"name": "a config, not a tokenizer"}))
    for flags, needle in cases:
        assert cli_main(["data", "prepare", "--source", src, "--out", str(out), *flags]) == 2, flags
        _one_line_refusal(capsys, needle)
        _nothing_written(out)


# ---- the store a run trains on: checked before its first step


def tiny_config(store: Path, vocab_size: int, **changes) -> TrainConfig:
    cfg = TrainConfig(
        model=ModelConfig(vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64),
        data=DataConfig(store=str(store), seq_len=32, batch_size=8, seed=0),
        optim=OptimConfig(lr=1e-2, warmup_frac=0.1, decay_frac=0.2),
        steps=40,
        log_every=10,
        eval_every=20,
        eval_tokens=512,
        checkpoint_every=40,
    )
    return dataclasses.replace(cfg, **changes).validate()


def _write_config(path: Path, cfg: TrainConfig) -> Path:
    path.write_text(yaml.safe_dump(train_config_to_dict(cfg), sort_keys=False))
    return path


def test_acceptance_bpe_on_three_shard_formats_reports_bits_per_byte(bpe_corpus, tmp_path):
    """Issue 51: a JSONL, a gzip JSONL and a Parquet shard, each prepared with a trained BPE
    vocabulary and trained on for a few steps (real JAX), report bits per byte; the same text as a
    plain file under the byte tokenizer lands within a sane range of them."""
    results = {}
    for name in ("web.jsonl", "web.jsonl.gz", "web.parquet"):
        store = tmp_path / f"store_{name}"
        meta = prepare_store(
            str(bpe_corpus / name), store, options=PrepareOptions(tokenizer="bpe", vocab_size=BPE_VOCAB)
        )
        summary = train(tiny_config(store, meta["tokenizer"]["vocab_size"]), tmp_path / f"run_{name}", progress=False)
        # bits per byte = nats per token x tokens / bytes of the eval text / ln 2, from the store's own windows
        windows = TokenStore(store).eval_set(512, 8, 32)
        targets, eval_bytes = windows[:, 1:].size, TokenStore(store).eval_bytes(windows)
        assert summary["val_bpb"] == pytest.approx(summary["val_loss"] * targets / eval_bytes / math.log(2), rel=1e-12)
        assert eval_bytes / targets > 1.5  # a BPE token stands for more than a byte of this text
        assert (
            summary["tokenizer"] == "bpe"
            and summary["vocab_size"] == BPE_VOCAB
            and summary["loss_unit"] == "nats/token"
        )
        last = [json.loads(line) for line in (tmp_path / f"run_{name}" / "metrics.jsonl").read_text().splitlines()][-1]
        assert last["val_bpb"] == pytest.approx(summary["val_bpb"], rel=1e-12)
        results[name] = summary["val_bpb"]
    plain = tmp_path / "store_plain"
    prepare_store(str(bpe_corpus / "plain.txt"), plain)
    byte_summary = train(tiny_config(plain, 256), tmp_path / "run_plain", progress=False)
    assert byte_summary["val_bpb"] == byte_summary["val_loss"] / math.log(2)  # bytes: exactly as always
    assert byte_summary["eval_bytes_per_token"] == 1.0 and byte_summary["tokenizer"] == "byte"
    for name, bpb in results.items():
        assert 0.3 < bpb < 8.5, (name, bpb)  # below 8 bits per byte: the models learned something
        assert 1 / 3 < bpb / byte_summary["val_bpb"] < 3, (name, bpb, byte_summary["val_bpb"])


def test_a_config_whose_vocabulary_or_tokenizer_is_not_the_stores_is_refused(bpe_corpus, tmp_path, capsys):
    store = tmp_path / "store"
    meta = prepare_store(
        str(bpe_corpus / "web.parquet"), store, options=PrepareOptions(tokenizer="bpe", vocab_size=300)
    )
    vocab = meta["tokenizer"]["vocab_size"]
    other = tmp_path / "other.json"
    other.write_text((store / "tokenizer.json").read_text().replace('"<|endoftext|>"', '"<|endoftext|>" ', 1))
    cases = [
        (tiny_config(store, 256), "model.vocab_size: 256, but the token store"),
        (
            tiny_config(store, vocab, data=DataConfig(store=str(store), seq_len=32, batch_size=8, tokenizer="byte")),
            "data.tokenizer: byte, but the token store",
        ),
        (
            tiny_config(
                store, vocab, data=DataConfig(store=str(store), seq_len=32, batch_size=8, tokenizer=str(other))
            ),
            f"data.tokenizer: {other} (sha256",
        ),
    ]
    for i, (cfg, needle) in enumerate(cases):
        config = _write_config(tmp_path / f"c{i}.yaml", cfg)
        run = tmp_path / f"run{i}"
        assert cli_main(["train", str(config), "--out", str(run), "--no-progress"]) == 2
        _one_line_refusal(capsys, needle)
        assert not run.exists() or not any(run.iterdir())
    # naming the store's own tokenizer file, and its vocabulary, passes the check
    ok = tiny_config(
        store,
        vocab,
        data=DataConfig(store=str(store), seq_len=32, batch_size=8, tokenizer=str(store / "tokenizer.json")),
    )
    assert check_store_for_config(ok) == store
    # an unset data.tokenizer is left out of config.yaml: every existing config keeps its bytes and hash
    assert "tokenizer" not in train_config_to_dict(tiny_config(store, vocab))["data"]


def test_a_vocabulary_larger_than_the_stores_dtype_is_refused(tmp_path, capsys):
    src = tmp_path / "corpus"
    src.mkdir()
    _write_jsonl(src / "a.jsonl", [{"text": d} for d in _documents(60)])
    store = tmp_path / "store"
    prepare_store(str(src), store)
    meta = json.loads((store / META_FILE).read_text())
    meta["tokenizer"]["vocab_size"] = 300  # 300 ids do not fit the uint8 train.bin
    (store / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DelphiError, match=r"a vocabulary of 300 tokens does not fit the store's dtype uint8"):
        TokenStore(store)
    config = _write_config(tmp_path / "c.yaml", tiny_config(store, 300))
    assert cli_main(["train", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    _one_line_refusal(capsys, "does not fit the store's dtype uint8")


# ---- issue 53, cause 10: the store's bytes against its meta.json


def test_a_changed_byte_in_the_store_is_refused_before_the_first_step(tmp_path, capsys, monkeypatch):
    """Before: a changed byte trained silently, and the run recorded the meta's data_sha256."""
    monkeypatch.setenv("DELPHI_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "corpus"
    src.mkdir()
    _write_jsonl(src / "a.jsonl", [{"text": d} for d in _documents(200)])
    store = tmp_path / "store"
    prepare_store(str(src), store)
    cfg = tiny_config(store, 256)
    check_store_for_config(cfg)  # hashes once, then remembers the verified state
    markers = list((tmp_path / "cache" / "verified-stores").iterdir())
    assert len(markers) == 1
    train_bin = store / "train.bin"
    stat = train_bin.stat()
    data = bytearray(train_bin.read_bytes())
    data[1000] ^= 0x01  # a changed byte, same size
    train_bin.write_bytes(bytes(data))
    os.utime(train_bin, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with its mtime put back
    config = _write_config(tmp_path / "c.yaml", cfg)
    assert cli_main(["train", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    _one_line_refusal(capsys, f"{train_bin}: its sha256", "its meta.json records (train_sha256)")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    # restored, the store passes again
    data[1000] ^= 0x01
    train_bin.write_bytes(bytes(data))
    assert check_store_for_config(cfg) == store


# ---- streamed: memory bounded whatever the corpus size

MEMORY_LIMIT_BYTES = 64 << 20  # the address space of the preparing process (RLIMIT_AS)


def _run_limited(args: list[str], limit: int) -> subprocess.CompletedProcess:
    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    code = "import sys; from delphi.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        preexec_fn=limit_memory,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_corpus_20x_the_memory_limit_is_prepared(tmp_path):
    """Issue 51: a lone text file and a JSONL shard, each 20x the process's address-space limit
    (64 MiB: Python, the CLI and a byte store's code take ~30 MiB), prepared under that limit."""
    size = 20 * MEMORY_LIMIT_BYTES
    docs = [d.encode() for d in _documents(400, seed=3)]
    block = b"\n".join(docs) + b"\n"
    lone = tmp_path / "big.txt"
    with open(lone, "wb") as f:
        for _ in range(size // len(block) + 1):
            f.write(block)
    shard = tmp_path / "big.jsonl"  # records of ~8 KB, as web pages are
    pages = [b" ".join(docs[i : i + 20]).decode() for i in range(0, len(docs), 20)]
    lines = b"".join(json.dumps({"text": page}).encode() + b"\n" for page in pages)
    with open(shard, "wb") as f:
        for _ in range(size // len(lines) + 1):
            f.write(lines)
    try:
        # the limit bites: what prepare_store did before streaming (the whole corpus in memory) fails under it
        whole = subprocess.run(
            [sys.executable, "-c", f"open({str(lone)!r}, 'rb').read()"],
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES,) * 2),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert whole.returncode != 0 and "MemoryError" in whole.stderr
        for source in (lone, shard):
            out = tmp_path / f"store_{source.suffix[1:]}"
            assert source.stat().st_size >= size
            done = _run_limited(
                ["data", "prepare", "--source", str(source), "--out", str(out), "--json"], MEMORY_LIMIT_BYTES
            )
            assert done.returncode == 0, done.stderr[-2000:]
            meta = json.loads(done.stdout)
            assert meta["n_train"] + meta["n_val"] == meta["bytes"] + meta["files"]  # every byte, one NUL per document
            assert meta["bytes"] >= size * 0.95 and meta["documents_val"] > 0 and meta["documents_train"] > 0
            shutil.rmtree(out)
            source.unlink()
    finally:
        for p in (lone, shard):
            p.unlink(missing_ok=True)
        for out in tmp_path.glob("store_*"):
            shutil.rmtree(out, ignore_errors=True)


# ---- the results table says its loss unit; the fits take bits per byte as well


def test_collect_says_the_loss_unit_and_tokenizer(tmp_path):
    from micro_ladder import micro_ladder

    from delphi.ladder.collect import collect_ladder
    from delphi.ladder.manifest import read_manifest

    ladder = micro_ladder(tmp_path, [1e9, 2e9])
    rows = read_manifest(ladder)
    for row, summary_extra in zip(rows[:2], ({}, {"tokenizer": "bpe", "loss_unit": "nats/token"})):
        run = ladder / "runs" / row["run_id"]
        run.mkdir(parents=True)
        (run / "status.json").write_text(json.dumps({"status": "completed"}))
        (run / "summary.json").write_text(
            json.dumps(
                {
                    "status": "completed",
                    "val_loss": 2.0,
                    "val_bpb": 1.1,
                    "tokens": int(row["tokens"]),
                    "flops": float(row["flops"]),
                    **summary_extra,
                }
            )
        )
    table = collect_ladder(ladder).set_index("run_id")
    assert list(table["loss_unit"]) == ["nats/token"] * 2
    # a summary without the key is a run from before BPE existed: bytes
    assert list(table["tokenizer"]) == ["byte", "bpe"] and list(table["bpb"]) == [1.1, 1.1]


def test_fits_take_bits_per_byte(tmp_path, capsys):
    """The eighth edition's table (bytes: bpb = loss / ln 2) fitted on `loss` and on `bpb`: the same
    exponents and optima, the loss scale moved by exactly 1 / ln 2."""
    table = Path(__file__).resolve().parents[1] / "paper" / "editions" / "v8" / "study" / "results.csv"
    fits = {}
    for col in ("loss", "bpb"):
        assert cli_main(["fit", "isoflop", str(table), "--loss-col", col, "--out", str(tmp_path / f"{col}.json")]) == 0
        fits[col] = json.loads((tmp_path / f"{col}.json").read_text())
    loss, bpb = fits["loss"]["params"], fits["bpb"]["params"]
    assert bpb["a"] == pytest.approx(loss["a"], rel=1e-6) and bpb["b"] == pytest.approx(loss["b"], rel=1e-6)
    assert bpb["log10_L0"] - loss["log10_L0"] == pytest.approx(-math.log10(math.log(2)), abs=1e-6)
    for a, b in zip(fits["loss"]["optima"], fits["bpb"]["optima"]):
        assert b["params_opt"] == pytest.approx(a["params_opt"], rel=1e-6)
        assert b["best_observed_loss"] == pytest.approx(a["best_observed_loss"] / math.log(2), rel=1e-9)
