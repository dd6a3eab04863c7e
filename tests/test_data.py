"""Token stores: sources, the document split, meta.json, the pure-function loader, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from delphi.cli import main as cli_main
from delphi.data.loader import TokenStore
from delphi.data.sources import list_documents
from delphi.data.store import (
    VAL_FRACTION,
    document_hash_fraction,
    prepare_store,
    resolve_store,
    split_documents,
)
from delphi.data.tokenizer import ByteTokenizer
from delphi.errors import DelphiError
from delphi.hashes import sha256_file


def _corpus(root: Path, n_files: int = 60, lines: int = 200) -> Path:
    """A small directory of distinct text files, plus a binary file and a cache dir to skip."""
    src = root / "corpus"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    for i in range(n_files):
        body = "".join(f"def f_{i}_{j}(x):\n    return x * {i} + {j}  # line {j}\n" for j in range(lines))
        (src / ("pkg" if i % 2 else "") / f"mod_{i:03d}.py").write_text(body)
    (src / "image.bin").write_bytes(bytes(range(256)) * 4)  # has NUL: binary, skipped
    (src / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))  # not UTF-8: skipped
    (src / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00pyc")
    return src


def test_byte_tokenizer_roundtrip():
    tok = ByteTokenizer()
    text = "héllo, wörld\n"
    ids = tok.encode(text)
    assert tok.vocab_size == 256 and ids.dtype == np.uint8 and len(ids) == len(text.encode())
    assert tok.decode(ids) == text


def test_prepare_store_meta_and_split(tmp_path):
    src = _corpus(tmp_path)
    meta = prepare_store(str(src), tmp_path / "store")
    store = tmp_path / "store"
    assert meta["files"] == 60  # the binary, latin-1 and __pycache__ files are skipped
    assert meta["documents_train"] + meta["documents_val"] == 60 and meta["documents_val"] >= 1
    train, val = (store / "train.bin").read_bytes(), (store / "val.bin").read_bytes()
    assert meta["n_train"] == len(train) and meta["n_val"] == len(val)
    assert meta["bytes"] + 60 == len(train) + len(val)  # one NUL separator per document
    import hashlib

    assert meta["sha256"] == hashlib.sha256(train + val).hexdigest()
    assert meta["train_sha256"] == sha256_file(store / "train.bin")
    assert meta["tokenizer"]["vocab_size"] == 256 and "sha256" in meta["split_rule"]
    assert json.loads((store / "meta.json").read_text()) == meta
    # The split is by document: every val document's text appears whole in val.bin, never in train.bin.
    listing = [line.split("\t") for line in (store / "documents.tsv").read_text().splitlines()[1:]]
    for doc_id, split, _ in listing:
        text = (src / doc_id).read_bytes()
        assert (text in val) == (split == "val") and (text in train) == (split == "train")
    # Rule: hash fraction below VAL_FRACTION, or the fallback single lowest-hash document.
    val_ids = {d for d, s, _ in listing if s == "val"}
    below = {d for d, _, _ in listing if document_hash_fraction(d) < VAL_FRACTION}
    assert val_ids == below or (not below and len(val_ids) == 1)


def test_prepare_is_deterministic_and_order_independent(tmp_path):
    src = _corpus(tmp_path)
    a = prepare_store(str(src), tmp_path / "a")
    b = prepare_store(str(src), tmp_path / "b")
    assert a["sha256"] == b["sha256"]
    # A split decision depends only on the document's own id, not on the other documents.
    ids = [f"doc_{i}.py" for i in range(500)]
    full = split_documents(ids)
    half = split_documents(ids[::2])
    assert {d for d in full if d in set(ids[::2])} == half or len(half) == 1


def test_sources_glob_and_single_file(tmp_path):
    src = _corpus(tmp_path)
    meta = prepare_store(str(src / "pkg" / "*.py"), tmp_path / "glob")
    assert meta["files"] == 30 and meta["source_info"]["kind"] == "glob"
    big = tmp_path / "book.txt"
    big.write_text("".join(f"line {i} of a long text file\n" for i in range(40_000)))
    meta = prepare_store(str(big), tmp_path / "single")
    assert meta["files"] > 10 and meta["documents_val"] >= 1  # chunked into ~64 KiB documents
    assert meta["bytes"] == big.stat().st_size


def test_missing_or_empty_source_is_an_error_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DelphiError, match="does not exist"):
        prepare_store(str(tmp_path / "nope"), out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DelphiError, match="no files"):
        prepare_store(str(tmp_path / "empty"), out)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x.dat").write_bytes(b"\x00\x01")
    with pytest.raises(DelphiError, match="no text files"):
        prepare_store(str(tmp_path / "bin"), out)
    with pytest.raises(DelphiError, match="no files"):
        prepare_store(str(tmp_path / "*.nothing"), out)
    assert not out.exists()
    # CLI: exit 2, one-line error, nothing written.
    assert cli_main(["data", "prepare", "--source", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert not out.exists()


def test_cli_prepare_json(tmp_path, capsys):
    src = _corpus(tmp_path, n_files=10, lines=20)
    assert cli_main(["data", "prepare", "--source", str(src), "--out", str(tmp_path / "s"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files"] == 10 and out["n_train"] > 0


def test_train_batch_is_a_pure_function_of_seed_and_step(tmp_path):
    src = _corpus(tmp_path)
    prepare_store(str(src), tmp_path / "store")
    store = TokenStore(tmp_path / "store")
    seq, batch = 31, 8
    b1 = store.train_batch(5, 0, batch, seq)
    assert b1.shape == (batch, seq + 1) and b1.dtype == np.int32
    other = TokenStore(tmp_path / "store")  # fresh object, nothing cached on the instance
    np.testing.assert_array_equal(b1, other.train_batch(5, 0, batch, seq))
    assert not np.array_equal(b1, store.train_batch(5, 1, batch, seq))  # seed matters
    assert not np.array_equal(b1, store.train_batch(6, 0, batch, seq))  # step matters
    # One epoch visits every window exactly once, with no overlap between windows.
    n_windows = store.n_train_windows(seq)
    steps = n_windows // batch
    starts = set()
    train = np.asarray(store.train)
    window_of = {bytes(train[k * (seq + 1) : (k + 1) * (seq + 1)]): k for k in range(n_windows)}
    for s in range(steps):
        for row in store.train_batch(s, 3, batch, seq).astype(np.uint8):
            starts.add(window_of[bytes(row)])
    assert len(starts) == steps * batch
    # The next epoch is a different permutation of the same windows.
    i0 = n_windows  # first window of epoch 1
    s, r = divmod(i0, batch)
    row = store.train_batch(s, 3, batch, seq)[r].astype(np.uint8)
    assert bytes(row) in window_of


def test_eval_batches_fixed_and_check_run(tmp_path):
    src = _corpus(tmp_path)
    prepare_store(str(src), tmp_path / "store")
    store = TokenStore(tmp_path / "store")
    seq, batch = 15, 4
    first = list(store.eval_batches(200, batch, seq))
    again = list(store.eval_batches(200, batch, seq))
    assert len(first) == 4 and all(b.shape == (batch, seq + 1) for b in first)  # ceil(200/60) whole batches
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    store.check_run(batch, seq, 200, where="cfg.yaml")
    with pytest.raises(DelphiError, match="cfg.yaml: data.batch_size"):
        store.check_run(store.n_train_windows(seq) + 1, seq, 200, where="cfg.yaml")
    with pytest.raises(DelphiError, match="eval_tokens"):
        store.check_run(batch, seq, store.n_val + 1, where="cfg.yaml")
    with pytest.raises(DelphiError, match="eval_tokens"):
        list(store.eval_batches(store.n_val + 1, batch, seq))


def test_resolve_store_paths(tmp_path):
    with pytest.raises(DelphiError, match="neither a built-in"):
        resolve_store(str(tmp_path / "missing"))
    (tmp_path / "d").mkdir()
    with pytest.raises(DelphiError, match="not a token store"):
        resolve_store(str(tmp_path / "d"))


def test_resolve_builtin_stdlib_prepared_once_into_cache(tmp_path):
    """The real stdlib source, prepared by two processes at once: one build, same store."""
    env = {**os.environ, "DELPHI_CACHE": str(tmp_path / "cache")}
    code = "from delphi.data.store import resolve_store; print(resolve_store('stdlib'))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    target = tmp_path / "cache" / "stores" / "stdlib"
    assert outs == [str(target)] * 2
    meta = json.loads((target / "meta.json").read_text())
    assert meta["files"] > 500 and meta["n_train"] > 10_000_000  # tens of MB of real code and prose
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]
    ids = [line.split("\t")[0] for line in (target / "documents.tsv").read_text().splitlines()[1:]]
    assert ids == sorted(ids) and not any("site-packages" in i or "__pycache__" in i for i in ids)
    assert list_documents("stdlib")[0].id.startswith("stdlib/")


def test_environment_source_leaves_out_editable_install_finders(tmp_path, monkeypatch):
    """`pip install -e .` writes an import finder into site-packages, or not, depending on the
    setuptools version pip built with; the `environment` corpus must not depend on that."""
    from delphi.data import sources

    site = tmp_path / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("x = 1\n")
    (site / "__editable___delphi_0_1_0_finder.py").write_text("MAPPING = {}\n")
    monkeypatch.setattr(sources, "site_packages_roots", lambda: [site])
    ids = [d.id for d in list_documents("environment") if d.id.startswith("site-packages/")]
    assert ids == ["site-packages/pkg/__init__.py"]


def test_a_store_counts_its_bytes_by_package_to_tell_two_builds_apart(tmp_path):
    from delphi.data.store import package_differences, package_of

    assert package_of("site-packages/numpy/linalg/linalg.py") == "site-packages/numpy"
    assert package_of("stdlib/os.py") == "stdlib/os.py" and package_of("notes.md") == "notes.md"
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("a = 1\n")
    (src / "pkg" / "b.py").write_text("b = 22\n")
    (src / "top.py").write_text("t = 3\n")
    meta = prepare_store(str(src), tmp_path / "store")
    assert meta["bytes_by_package"] == {"pkg/a.py": 6, "pkg/b.py": 7, "top.py": 6}
    before = {"site-packages/numpy": 100, "site-packages/old": 5, "stdlib/json": 7}
    after = {"site-packages/numpy": 173, "stdlib/json": 7, "site-packages/new": 2}
    assert (
        package_differences(before, after)
        == "site-packages/numpy +73 bytes, site-packages/old -5 bytes, site-packages/new +2 bytes"
    )
    assert package_differences(before, before) == "none"
    assert package_differences(before, after, limit=1).endswith("and 2 more")
