"""Batches from a token store, as pure functions of (seed, step).

The train stream is cut into non-overlapping windows of seq_len + 1 tokens
(inputs plus the next-token targets). The global window index of row r at step
s is i = s * batch_size + r; its epoch is i // n_windows, and within an epoch
the windows are visited in a permutation seeded by (seed, epoch). So the batch
at any step can be computed without replaying the ones before it, which is what
makes `--resume` reproduce an uninterrupted run exactly.

Evaluation uses a fixed set of validation windows, spread evenly over the
validation stream, identical for every call and every run on the same store.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from jaxtyping import Int, UInt

from delphi.data.store import META_FILE, check_token_file, resolve_store, store_dtype
from delphi.errors import DelphiError, quoted
from delphi.io import read_json


@functools.lru_cache(maxsize=4)
def _epoch_permutation(n_windows: int, seed: int, epoch: int) -> np.ndarray:
    # Cached: consecutive steps share an epoch; the result is never mutated.
    perm = np.random.default_rng([seed, epoch]).permutation(n_windows)
    perm.flags.writeable = False
    return perm


class TokenStore:
    """Read-only view of a prepared store (train.bin, val.bin, meta.json)."""

    def __init__(self, path: str | Path) -> None:
        self.path = resolve_store(str(path))

        meta = read_json(self.path / META_FILE, what="token store meta.json")
        missing = [k for k in ("n_train", "n_val") if not isinstance(meta, dict) or k not in meta]
        if missing:
            raise DelphiError(
                f"{self.path / META_FILE}: no {quoted(missing[0])}; not a token store (rebuild it with `delphi data prepare`)"
            )
        self.meta: dict = meta
        dtype = self._dtype()
        self.train = self._map("train.bin", dtype, self.meta["n_train"])
        self.val = self._map("val.bin", dtype, self.meta["n_val"])
        self.token_bytes = self._token_bytes()

    def _dtype(self) -> np.dtype:
        return np.dtype(store_dtype(self.path, self.meta))

    def _token_bytes(self) -> UInt[np.ndarray, " vocab"] | None:
        """Bytes of text per token id (a BPE store's token_bytes.npy); None for bytes (one each)."""
        name = (self.meta.get("tokenizer") or {}).get("token_bytes")
        if name is None:
            return None
        file = self.path / str(name)
        try:
            table = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DelphiError(
                f"{file}: not the store's table of bytes per token ({e}); prepare the store again"
            ) from None
        if table.shape != (self.vocab_size,) or not np.issubdtype(table.dtype, np.integer):
            raise DelphiError(
                f"{file}: {table.shape} {table.dtype}, expected {self.vocab_size} integers (one per token id); "
                "prepare the store again"
            )
        return table

    def _map(self, name: str, dtype: np.dtype, expected: int) -> np.ndarray:
        file = self.path / name
        check_token_file(file, dtype.itemsize, expected)
        return np.memmap(file, dtype=dtype, mode="r", shape=(expected,))

    @property
    def n_train(self) -> int:
        return int(self.meta["n_train"])

    @property
    def n_val(self) -> int:
        return int(self.meta["n_val"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["tokenizer"]["vocab_size"])

    @property
    def sha256(self) -> str:
        return str(self.meta["sha256"])

    @property
    def tokenizer_kind(self) -> str:
        return str((self.meta.get("tokenizer") or {}).get("kind", "byte"))

    def eval_bytes(self, windows: Int[np.ndarray, "windows seq_plus_1"]) -> float:
        """Bytes of the text that the next-token targets of `windows` stand for: the count of targets
        for bytes; for BPE the sum of their tokens' byte lengths, scaled by the validation split's
        measured bytes over the same sum (meta bytes_val / val_token_bytes: exactly 1 for a
        byte-level vocabulary, whose token lengths are exact). Bits per byte = nats per token x
        targets / eval_bytes / ln 2."""
        targets = windows[:, 1:]
        if self.token_bytes is None:
            return float(targets.size)
        counted = float(self.token_bytes[targets].sum(dtype=np.int64))
        measured, through_vocab = self.meta.get("bytes_val"), self.meta.get("val_token_bytes")
        if measured and through_vocab and measured != through_vocab:
            counted *= measured / through_vocab
        return counted

    def n_train_windows(self, seq_len: int) -> int:
        return self.n_train // (seq_len + 1)

    def n_val_windows(self, seq_len: int) -> int:
        return self.n_val // (seq_len + 1)

    def epochs(self, steps: int, batch_size: int, seq_len: int) -> float:
        """How many passes over the train windows `steps` steps make."""
        return steps * batch_size / max(self.n_train_windows(seq_len), 1)

    def train_batch(self, step: int, seed: int, batch_size: int, seq_len: int) -> Int[np.ndarray, "batch seq_plus_1"]:
        window = seq_len + 1
        n_windows = self.n_train_windows(seq_len)
        if batch_size > n_windows:
            raise DelphiError(
                f"data.batch_size: {batch_size} windows of {window} tokens do not fit the train split "
                f"of {self.path} ({self.n_train} tokens = {n_windows} windows)"
            )
        if step < 0 or seed < 0:
            raise DelphiError(f"step and seed must be >= 0, got step={step}, seed={seed}")
        index = step * batch_size + np.arange(batch_size, dtype=np.int64)
        epochs, within = np.divmod(index, n_windows)
        picks = np.empty(batch_size, dtype=np.int64)
        for epoch in np.unique(epochs):  # at most two epochs meet inside one batch
            rows = epochs == epoch
            picks[rows] = _epoch_permutation(n_windows, seed, int(epoch))[within[rows]]
        starts = picks * window
        return np.asarray(self.train[starts[:, None] + np.arange(window)], dtype=np.int32)

    def eval_windows(self, n_tokens: int, batch_size: int, seq_len: int) -> int:
        """Validation windows used for `n_tokens`: whole batches, at least n_tokens targets."""
        batches = max(1, math.ceil(n_tokens / (batch_size * seq_len)))
        return batches * batch_size

    def eval_set(self, n_tokens: int, batch_size: int, seq_len: int) -> Int[np.ndarray, "windows seq_plus_1"]:
        """Every validation window of `eval_batches`, in order, as one array. `batch_size` (the
        training batch) only sets how many windows (`eval_windows`); the trainer may evaluate them
        in batches of any size."""
        return self._spread_windows(self._checked_eval_windows(n_tokens, batch_size, seq_len, prefix=""), seq_len)

    def final_eval_chunks(
        self, n_tokens: int, final_tokens: int, batch_size: int, seq_len: int
    ) -> list[Int[np.ndarray, "windows seq_plus_1"]]:
        """The final evaluation's windows (at least `final_tokens` targets) as m chunks of the regular
        set's size: chunk j holds windows j, j+m, j+2m, ... of m x k evenly spread windows, so chunk 0
        is exactly `eval_set(n_tokens)` (floor(m j A / (m k)) = floor(j A / k)) and every chunk has
        its shape: the final eval reuses the regular eval's program, and its chunk 0 continues the curve."""
        k = self._checked_eval_windows(n_tokens, batch_size, seq_len, prefix="")
        m = max(1, math.ceil(self.eval_windows(final_tokens, batch_size, seq_len) / k))
        available = self.n_val_windows(seq_len)
        if m * k > available:
            raise DelphiError(
                f"final_eval_tokens: {final_tokens} tokens need {m * k} validation windows of {seq_len + 1} tokens "
                f"({m} x the {k} of eval_tokens); the store {self.path} has {available} ({self.n_val} validation tokens)"
            )
        windows = self._spread_windows(m * k, seq_len)
        return [windows[j::m] for j in range(m)]

    def _spread_windows(self, k: int, seq_len: int) -> Int[np.ndarray, "windows seq_plus_1"]:
        window = seq_len + 1
        picks = (np.arange(k, dtype=np.int64) * self.n_val_windows(seq_len)) // k  # evenly spread, fixed
        return np.asarray(self.val[(picks * window)[:, None] + np.arange(window)], dtype=np.int32)

    def eval_batches(
        self, n_tokens: int, batch_size: int, seq_len: int
    ) -> Iterator[Int[np.ndarray, "batch seq_plus_1"]]:
        windows = self.eval_set(n_tokens, batch_size, seq_len)
        for b in range(0, len(windows), batch_size):
            yield windows[b : b + batch_size]

    def check_run(
        self, batch_size: int, seq_len: int, eval_tokens: int, where: str = "", final_eval_tokens: int | None = None
    ) -> None:
        """Raise DelphiError, before any compilation, when a run cannot be fed by this store."""
        prefix = f"{where}: " if where else ""
        window = seq_len + 1
        if batch_size <= 0 or seq_len <= 0:
            raise DelphiError(f"{prefix}data.batch_size and data.seq_len must be positive, got {batch_size}, {seq_len}")
        n_windows = self.n_train_windows(seq_len)
        if batch_size > n_windows:
            raise DelphiError(
                f"{prefix}data.batch_size: {batch_size} x {window} tokens is larger than the train split of the "
                f"store {self.path} ({self.n_train} tokens = {n_windows} windows)"
            )
        self._checked_eval_windows(eval_tokens, batch_size, seq_len, prefix=prefix)
        if final_eval_tokens is not None:
            try:
                self.final_eval_chunks(eval_tokens, final_eval_tokens, batch_size, seq_len)
            except DelphiError as e:
                raise DelphiError(f"{prefix}{e}") from None

    def check_feeds(
        self, *, batch_size: int, seq_len: int, eval_tokens: int, final_eval_tokens: int | None, where: str = ""
    ) -> None:
        """Raise DelphiError, before anything compiles or is written, when this store cannot feed a run's
        batches and evaluation windows (`check_run`), wherever training starts (`delphi train`,
        `delphi ladder run`). Its bytes and vocabulary are `delphi.data.store.check_store_for_config`."""
        self.check_run(batch_size, seq_len, eval_tokens, where=where, final_eval_tokens=final_eval_tokens)

    def _checked_eval_windows(self, n_tokens: int, batch_size: int, seq_len: int, *, prefix: str) -> int:
        """`eval_windows`, or a DelphiError when the validation split holds fewer windows."""
        k = self.eval_windows(n_tokens, batch_size, seq_len)
        available = self.n_val_windows(seq_len)
        if k > available:
            raise DelphiError(
                f"{prefix}eval_tokens: {n_tokens} tokens need {k} validation windows of {seq_len + 1} tokens "
                f"(whole batches of {batch_size}); the store {self.path} has {available} "
                f"({self.n_val} validation tokens)"
            )
        return k
