"""Dropless MoE dispatch: the shipped block layout against `jax.lax.ragged_dot`, one MoE layer,
forward and backward, in the same run (issue 42).

    .venv/bin/python benchmarks/moe_dispatch.py [--reps 30] [--json OUT.json] [--quick]

Hypothesis: `jax.lax.ragged_dot` (tokens sorted by expert, one grouped matmul per projection; the
field's primitive for dropless MoE, and on GPU a grouped GEMM) beats the shipped dispatch
(`delphi.model.moe.MoE` with every assignment kept: the assignments sorted into blocks of
DROPLESS_BLOCK rows, each block multiplied by its own expert's gathered weights). Expected on
XLA:CPU: it does not, because ragged_dot lowers there to a dense matmul over every expert with the
rows of the other experts masked (E times the work), which is what the module docstring of
`delphi.model.moe` says was seen before; on a GPU the answer may differ (not measured here).

Method: the MoE layer of the trainer's benchmark shapes (benchmarks/trainer.py: 8 experts, top-2,
d_expert = half the dense SwiGLU width, the ladders' capacity factor 4 = E / k, so nothing drops)
at d_model 32 and 64 (1,024 tokens, the ladder shapes) and 256 (8,192 tokens, nanoGPT's shape).
Both paths share the module's routing and weights; the loss is the sum of squared outputs, and the
gradients with respect to the input and every parameter are compared (they must agree to float
tolerance, or the row says so). Each path is one jitted value-and-grad; the time is the median of
`--reps` calls after a warm-up, the ratio ragged / blocks is taken in the same run, f32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine  # noqa: E402
from trainer import DROPLESS_CAPACITY_FACTOR, LADDER_D32, LADDER_D64, NANOGPT_D256, Shape, moe_same_active  # noqa: E402

from delphi.model.moe import MoE, swiglu  # noqa: E402

SHAPES = (LADDER_D32, LADDER_D64, NANOGPT_D256)
AGREEMENT_RTOL = 1e-4  # relative max difference of any gradient at which the two paths count as the same function


def ragged_forward(moe: MoE, x: Float[Array, "batch seq d"]) -> Float[Array, "batch seq d"]:
    """The MoE layer with its dropless dispatch through `jax.lax.ragged_dot` (no shared experts)."""
    batch, seq, d = x.shape
    xt = x.reshape(batch * seq, d)
    routing = moe.route(xt)
    tokens, k = routing.expert_idx.shape
    flat = routing.expert_idx.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    group_sizes = jnp.bincount(flat, length=moe.moe.experts).astype(jnp.int32)
    xs = xt[order // k]
    h = swiglu(jax.lax.ragged_dot(xs, moe.experts.w_in[...], group_sizes, preferred_element_type=jnp.float32))
    ys = jax.lax.ragged_dot(h, moe.experts.w_out[...], group_sizes, preferred_element_type=jnp.float32)
    per_assignment = jnp.zeros_like(ys).at[order].set(ys).reshape(tokens, k, d)
    return jnp.einsum("tk,tkd->td", routing.gates, per_assignment).reshape(batch, seq, d)


def shipped_forward(moe: MoE, x: Float[Array, "batch seq d"]) -> Float[Array, "batch seq d"]:
    return moe(x, train=True)[0]


def timed_grad(forward, moe: MoE, x: Array, reps: int) -> tuple[float, list[np.ndarray]]:
    """(median ms per value-and-grad call, [d loss / d x, d loss / d each parameter])."""

    def loss(moe: MoE, x: Array) -> Array:
        return jnp.sum(forward(moe, x) ** 2)

    step = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1)))
    _, (g_moe, g_x) = step(moe, x)
    grads = [np.asarray(g_x)] + [np.asarray(v) for v in jax.tree.leaves(nnx.state(g_moe, nnx.Param))]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(step(moe, x))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), grads


def measure(shape: Shape, reps: int) -> dict:
    cfg = moe_same_active(shape, DROPLESS_CAPACITY_FACTOR)
    moe = MoE(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (shape.batch, shape.seq_len, shape.d_model))
    blocks_ms, blocks_grads = timed_grad(shipped_forward, moe, x, reps)
    ragged_ms, ragged_grads = timed_grad(ragged_forward, moe, x, reps)
    # The router's gradient flows through the gates only in both paths; every array must agree.
    diff = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-30)) for a, b in zip(blocks_grads, ragged_grads))
    return {
        "shape": shape.name,
        "d_model": shape.d_model,
        "tokens": shape.batch * shape.seq_len,
        "experts": cfg.moe.experts,
        "top_k": cfg.moe.top_k,
        "d_expert": cfg.moe.d_expert,
        "blocks_ms": blocks_ms,
        "ragged_dot_ms": ragged_ms,
        "ragged_over_blocks": ragged_ms / blocks_ms,
        "max_rel_grad_diff": diff,
        "same_function": diff <= AGREEMENT_RTOL,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="the d32 shape, 2 calls: a smoke test of the script")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    host = machine()
    print(f"machine: {host}", file=sys.stderr)
    rows = []
    for shape in SHAPES[:1] if args.quick else SHAPES:
        row = measure(shape, 2 if args.quick else args.reps)
        rows.append(row)
        print(
            f"{row['shape']:4s} d{row['d_model']} {row['tokens']} tokens: blocks {row['blocks_ms']:.2f} ms, ragged_dot "
            f"{row['ragged_dot_ms']:.2f} ms, ragged / blocks {row['ragged_over_blocks']:.2f}; gradients agree to "
            f"{row['max_rel_grad_diff']:.1e}{'' if row['same_function'] else ' (NOT the same function)'}",
            file=sys.stderr,
        )
    result = {
        "machine": host,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "rows": rows,
        "wall_s": time.perf_counter() - started,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({r["shape"]: round(r["ragged_over_blocks"], 3) for r in rows}))
    return 0 if all(r["same_function"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
