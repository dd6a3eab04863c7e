"""Byte-level tokenizer: every byte is a token (vocabulary 256).

With one token per byte, loss in nats per token converts exactly to bits per
byte (divide by ln 2), which is why it is Delphi's default. BPE vocabularies:
delphi.data.bpe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where it is used: a byte store is prepared without it (a smaller process)
    import numpy as np
    from jaxtyping import Integer

BYTE_VOCAB_SIZE = 256


@dataclass(frozen=True)
class ByteTokenizer:
    vocab_size: int = BYTE_VOCAB_SIZE
    kind: str = "byte"

    def encode(self, text: str | bytes) -> np.ndarray:
        import numpy as np

        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).copy()

    def decode(self, tokens: Integer[np.ndarray, " n"]) -> str:
        import numpy as np

        return np.asarray(tokens, dtype=np.uint8).tobytes().decode("utf-8", errors="replace")

    def meta(self) -> dict[str, object]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "dtype": "uint8"}
