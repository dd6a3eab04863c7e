"""OpenBLAS thread control: a small dense solve runs faster on one thread than with a waking pool."""

from __future__ import annotations

import ctypes
from typing import Any


class BlasThreads:
    """Context manager: OpenBLAS (numpy's and scipy's copies) limited to `n` threads inside.

    Found through the loaded shared objects (Linux /proc/self/maps); a no-op elsewhere or when
    BLAS is not OpenBLAS. The previous thread counts are restored on exit."""

    _SYMBOLS = (  # (get, set) pairs: plain OpenBLAS, and the prefixed builds in numpy/scipy wheels
        ("openblas_get_num_threads", "openblas_set_num_threads"),
        ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
        ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
        ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    )
    _found: list[tuple[Any, Any]] | None = None

    def __init__(self, n: int) -> None:
        self.n = n
        self.saved: list[int] = []

    @classmethod
    def controls(cls) -> list[tuple[Any, Any]]:
        if cls._found is None:
            cls._found = []
            try:
                with open("/proc/self/maps") as maps:
                    paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
            except OSError:
                paths = []
            for path in paths:
                try:
                    lib = ctypes.CDLL(path)
                except OSError:
                    continue
                for get, set_ in cls._SYMBOLS:
                    if hasattr(lib, get) and hasattr(lib, set_):
                        cls._found.append((getattr(lib, get), getattr(lib, set_)))
                        break
        return cls._found

    def __enter__(self) -> "BlasThreads":
        self.saved = [int(get()) for get, _ in self.controls()]
        for _, set_ in self.controls():
            set_(self.n)
        return self

    def __exit__(self, *exc: object) -> None:
        for (_, set_), n in zip(self.controls(), self.saved):
            set_(n)
