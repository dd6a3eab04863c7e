"""Byte-level tokenizer: every byte is a token (vocabulary 256).

With one token per byte, loss in nats per token converts exactly to bits per
byte (divide by ln 2), which is why it is Delphi's default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxtyping import Integer

BYTE_VOCAB_SIZE = 256


@dataclass(frozen=True)
class ByteTokenizer:
    vocab_size: int = BYTE_VOCAB_SIZE
    kind: str = "byte"

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).copy()

    def decode(self, tokens: Integer[np.ndarray, " n"]) -> str:
        return np.asarray(tokens, dtype=np.uint8).tobytes().decode("utf-8", errors="replace")

    def meta(self) -> dict[str, object]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "dtype": "uint8"}
