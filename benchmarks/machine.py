"""The machine a benchmark ran on, stated beside every figure: CPU model, usable cores, SIMD flags
and load. One reader of /proc/cpuinfo for every script here (the machine changes from day to day:
one had AVX-512 and native bf16, the next neither)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
SIMD_PREFIXES = ("avx", "fma", "amx", "sse4")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # native bf16 dot products


def _cpuinfo_field(name: str) -> str | None:
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    return set((_cpuinfo_field("flags") or "").split())


def native_bf16() -> bool:
    """True where the CPU executes bf16 dot products natively (AVX512-BF16 or AMX-BF16)."""
    return bool(cpu_flags() & set(BF16_FLAGS))


def machine() -> dict:
    flags = cpu_flags()
    return {
        "cpu_model": cpu_model(),
        "cpus": len(os.sched_getaffinity(0)),
        "simd_flags": sorted(f for f in flags if f.startswith(SIMD_PREFIXES)),
        "native_bf16": bool(flags & set(BF16_FLAGS)),
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
