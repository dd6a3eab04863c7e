"""BPE tokenizers through the Hugging Face `tokenizers` package: trained on a corpus at
`data prepare` time, or a user's tokenizer.json loaded from disk. Nothing is downloaded.

A trained vocabulary is byte-level BPE (GPT-2's scheme: every byte is a base token, so any text
encodes without an unknown token and decodes back to the same bytes): the ByteLevel
pre-tokenizer and decoder, no normalizer, and one special token, END_OF_DOCUMENT, with id 0,
which separates documents in the store as the NUL byte does in a byte store.

`token_bytes()` gives each token's length in bytes of text, which turns a loss in nats per token
into bits per byte (delphi.data.loader.TokenStore.eval_bytes): exact for byte-level vocabularies
(read from the byte alphabet), the length of each token decoded alone for others.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delphi.errors import DelphiError, quoted

if TYPE_CHECKING:  # numpy is imported where it is used: a byte store is prepared without it (a smaller process)
    import numpy as np
    from jaxtyping import UInt

END_OF_DOCUMENT = "<|endoftext|>"  # GPT-2's end-of-text token, the separator of a trained vocabulary
# A loaded tokenizer.json separates documents with the first of these it has (GPT-2/NeoX, Llama 3,
# SentencePiece models, Gemma).
END_OF_DOCUMENT_TOKENS = (END_OF_DOCUMENT, "<|end_of_text|>", "</s>", "<eos>")
MIN_TRAINED_VOCAB = 258  # 256 byte tokens, the separator and at least one merge
UINT16_VOCAB = 1 << 16  # ids below this fit a uint16 store
EXTRA_HINT = "pip install 'delphi[corpora]'"


def _tokenizers():  # noqa: ANN202 - the tokenizers module
    try:
        import tokenizers

        return tokenizers
    except ImportError:
        raise DelphiError(f"--tokenizer: BPE tokenizers need the tokenizers package ({EXTRA_HINT})") from None


def byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte (bytes_to_unicode), inverted: char -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return {c: b for b, c in enumerate(chars)}


def token_dtype(vocab_size: int) -> str:
    """The smallest unsigned dtype of a store whose ids are below `vocab_size`."""
    if vocab_size <= 256:
        return "uint8"
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


def _is_byte_level(spec: dict) -> bool:
    parts = [spec.get("pre_tokenizer"), spec.get("decoder")]
    stack = [p for p in parts if isinstance(p, dict)]
    while stack:
        part = stack.pop()
        if part.get("type") == "ByteLevel":
            return True
        stack += [p for key in ("pretokenizers", "decoders") for p in part.get(key) or [] if isinstance(p, dict)]
    return False


@dataclass(frozen=True)
class BpeTokenizer:
    """A `tokenizers.Tokenizer` with the JSON it was made from (what the store keeps)."""

    json_text: str
    origin: str  # "trained" or the path it was loaded from
    tokenizer: Any  # tokenizers.Tokenizer
    separator: str
    kind: str = "bpe"

    @classmethod
    def from_json(cls, text: str, origin: str) -> "BpeTokenizer":
        tk = _tokenizers()
        try:
            spec = json.loads(text)
            if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
                raise ValueError("no 'model' object")
            tokenizer = tk.Tokenizer.from_str(text)
        except (ValueError, Exception) as e:  # tokenizers raises a bare Exception for a bad file
            raise DelphiError(
                f"--tokenizer {origin}: not a tokenizer.json of the tokenizers package ({' '.join(str(e).split())[:160]})"
            ) from None
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        separator = next((t for t in END_OF_DOCUMENT_TOKENS if t in vocab), None)
        if separator is None:
            raise DelphiError(
                f"--tokenizer {origin}: no end-of-document token to separate documents "
                f"(looked for {', '.join(END_OF_DOCUMENT_TOKENS)})"
            )
        return cls(text, origin, tokenizer, separator)

    @classmethod
    def load(cls, path: str | Path) -> "BpeTokenizer":
        path = Path(path).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DelphiError(f"--tokenizer {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
        return cls.from_json(text, str(path))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BpeTokenizer":
        """Byte-level BPE with `vocab_size` tokens at most (fewer when the texts offer no more merges)."""
        check_tokenizer_arg("bpe", vocab_size)
        tk = _tokenizers()
        tokenizer = tk.Tokenizer(tk.models.BPE())
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[END_OF_DOCUMENT],
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls.from_json(tokenizer.to_str(), "trained")

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def separator_id(self) -> int:
        return int(self.tokenizer.token_to_id(self.separator))

    @property
    def dtype(self) -> str:
        return token_dtype(self.vocab_size)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.json_text.encode("utf-8")).hexdigest()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens added)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> UInt[np.ndarray, " vocab"]:
        """Bytes of text each token id stands for; the separator counts one, as the NUL of a byte store."""
        import numpy as np

        spec = json.loads(self.json_text)
        lengths = np.zeros(self.vocab_size, dtype=np.uint32)
        alphabet = byte_alphabet() if _is_byte_level(spec) else None
        special = {t["id"]: t["content"] for t in spec.get("added_tokens") or [] if isinstance(t, dict) and "id" in t}
        for token, i in self.tokenizer.get_vocab(with_added_tokens=True).items():
            if i in special:
                lengths[i] = len(special[i].encode("utf-8"))
            elif alphabet is not None and all(c in alphabet for c in token):
                lengths[i] = len(token)  # one byte per character of the byte alphabet
            else:
                lengths[i] = _decoded_length(self.tokenizer, i, token)
        lengths[self.separator_id] = 1
        return lengths

    def meta(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "dtype": self.dtype,
            "sha256": self.sha256,
            "file": TOKENIZER_FILE,
            "origin": self.origin,
            "separator": self.separator,
            "separator_id": self.separator_id,
        }


TOKENIZER_FILE = "tokenizer.json"  # the store's copy of its tokenizer


def _decoded_length(tokenizer: Any, i: int, token: str) -> int:
    if token.startswith("<0x") and token.endswith(">") and len(token) == 6:
        return 1  # SentencePiece's byte fallback
    return len(tokenizer.decode([i], skip_special_tokens=False).encode("utf-8"))


def texts_of(documents: Iterator[bytes], max_bytes: int) -> Iterator[str]:
    """The documents as strings, stopping after `max_bytes` bytes of them."""
    seen = 0
    for data in documents:
        if seen >= max_bytes:
            return
        seen += len(data)
        yield data.decode("utf-8")


def check_tokenizer_arg(value: str, vocab_size: int | None) -> None:
    """--tokenizer byte | bpe | PATH/tokenizer.json with --vocab-size only for bpe."""
    if value == "bpe":
        if vocab_size is None:
            raise DelphiError("--tokenizer bpe: needs --vocab-size N (the vocabulary to train)")
        if vocab_size < MIN_TRAINED_VOCAB:
            raise DelphiError(
                f"--vocab-size: {vocab_size}, a trained byte-level BPE needs at least {MIN_TRAINED_VOCAB} "
                "(256 byte tokens, the separator, one merge)"
            )
        if vocab_size > 1 << 32:
            raise DelphiError(f"--vocab-size: {vocab_size} ids do not fit a uint32 store")
        _tokenizers()  # installed, before anything is read
    elif vocab_size is not None:
        raise DelphiError(
            f"--vocab-size: only with --tokenizer bpe (a vocabulary trained here), not with --tokenizer {quoted(value)}"
        )
