"""The matmul peak of this machine, for MFU.

MFU is achieved model FLOP/s over a peak; docs/design.md §4.5 asks for a peak measured
in the same process with a matmul of the same dtype, so numbers from different
machines (or a loaded machine) stay comparable. The measurement is a square
matmul timed a few times (best of N, ~0.2-0.5 s per dtype on 2 CPU cores) and
cached for the life of the process. `DELPHI_PEAK_FLOPS_F32` /
`DELPHI_PEAK_FLOPS_BF16` (FLOP/s) skip the measurement.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from delphi.train.environment import peak_flops_env

PEAK_MATMUL_SIZE = 1024  # large enough to reach ~90% of the BLAS peak on CPU, small enough to be cheap


def measure_matmul_flops(precision: str, size: int = PEAK_MATMUL_SIZE, repeats: int = 5, chain: int = 4) -> float:
    """Best-of-`repeats` FLOP/s of `chain` dependent (size x size) matmuls.

    bf16 multiplies bf16 inputs with f32 accumulation, as the model does.
    """
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32

    @jax.jit
    def matmuls(a, b):
        for _ in range(chain):  # dependent chain: one dispatch, `chain` matmuls
            a = jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(dtype)
        return a

    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (size, size), dtype) / size**0.5
    b = jax.random.normal(key_b, (size, size), dtype) / size**0.5
    matmuls(a, b).block_until_ready()  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmuls(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return chain * 2.0 * size**3 / best


@functools.cache
def peak_flops(precision: str) -> float:
    """FLOP/s peak used for MFU: from the environment, else measured once per process."""
    configured = peak_flops_env(precision)  # a positive finite number, or a DelphiError naming the variable
    if configured is not None:
        return configured
    return measure_matmul_flops(precision)
