"""Will a training run fit in memory? Two answers, both before anything is written.

A model too large for the machine aborts inside XLA's allocator with a C++ stack (exit 134),
which no Python code can catch. So `train` refuses (DelphiError, exit 2, with the numbers) a run that does not fit what its devices
have free, twice: first on this module's estimate (`estimate_train_memory`: arithmetic, no JAX,
so that even an absurd config is refused at once), then on XLA's memory analysis of the compiled
train step (`CompiledMemory`, `check_program_fits`; delphi.train.trainer.check_compiled_memory
compiles it from abstract shapes, and the run then trains with that program).

The estimate, per device, counts what autodiff keeps for the backward pass as JAX's
`print_saved_residuals` lists it for this model, and what the optimizer holds:
- state: f32 parameters, gradients and Adam's two moments, 16 bytes per parameter (routed experts
  split over mesh.expert); with bf16 compute the bf16 copy of every weight matrix (2 bytes);
- per layer and token, in f32: the block's normed inputs and residual stream (3 d), the attention
  internals of the query-blocked kernel (q, k, v and their QK-norm inputs, the key and value
  slices each query block reads, its output: 10 h d_head) and its probabilities (h x 2 S / 3: three
  query blocks over the keys up to their end), then the FFN: SwiGLU's gate, up, their activation
  and product (5 d_ff), or for a MoE the router's scores (2 E), its input (d) and the gathered
  outputs (k d), and 5 d_expert per routed row (tokens x k, rounded up to whole dispatch blocks
  of delphi.model.moe.DROPLESS_BLOCK rows plus E blocks when dropless, E x capacity otherwise);
- per layer and token, in the compute dtype (each matmul's input): d + h d_head for attention,
  d + d_ff for a dense FFN, d + (d + d_expert) per routed row for a MoE;
- per token once: the final norm's input, the unembedding's input, and the logits, the loss's
  softmax and, in the backward pass, their gradients (f32, 4 V);
- a dropless MoE's expert blocks: every dispatch block multiplies its rows by its own expert's
  weights, gathered per block ([blocks, d, 2 d_expert] and [blocks, d_expert, d] in the compute
  dtype) and kept for the backward pass in every layer, and one layer's f32 gradient of them (at
  large widths most of the step's memory);
- the JAX/XLA runtime itself (JAX_RUNTIME_BYTES, host memory).
The estimate is held within ESTIMATE_TOLERANCE of XLA:CPU's analysis of the ladders' shapes, in f32
and bf16 (tests/test_memory_estimate.py; benchmarks/memory_estimate.py prints the table).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from delphi.errors import DelphiError
from delphi.model.flops import count_params, expert_params
from delphi.model.moe import DROPLESS_BLOCK, expert_capacity, is_dropless
from delphi.train.config import TrainConfig
from delphi.train.device import device_memory_bytes

PARAM_BYTES = 4  # f32 master weights
GRAD_BYTES = 4  # f32 gradients
ADAM_STATE_BYTES = 8  # two f32 moments per parameter (optax.adamw; AdamH keeps the same two)
F32_BYTES = 4  # norms, softmaxes, the residual stream and every saved non-matmul input are f32
# What a process with JAX and XLA's CPU runtime loaded holds before any array (the ladder workers;
# delphi.ladder.runner.WORKER_MEMORY_BYTES allows 1 GB with the compiler's peaks).
JAX_RUNTIME_BYTES = 400 * 1024**2
MEMINFO = "/proc/meminfo"
# How close the estimate is held to XLA's memory analysis of the compiled step.
ESTIMATE_TOLERANCE = 0.25
# Saved attention probabilities per query, per head, in units of the sequence length: the blocked
# kernel's three query blocks see 1/3, 2/3 and all of the keys (delphi.model.transformer), JAX's
# fused XLA kernel the whole score matrix, cuDNN's flash attention only a softmax statistic.
ATTENTION_PROBS_PER_SEQ = {"blocked": 2 / 3, "xla": 1.0, "cudnn": 0.0}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device needs at the peak of a training step, by part."""

    parameters: int  # f32 parameters, and with bf16 compute their bf16 copies
    gradients: int
    optimizer: int
    activations: int  # what the backward pass reads, per token
    expert_blocks: int  # a dropless MoE's per-block expert weights (0 otherwise)
    runtime: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.expert_blocks + self.runtime

    def describe(self) -> str:
        gb = lambda b: f"{b / 1e9:.3g} GB"  # noqa: E731
        blocks = f", MoE expert blocks {gb(self.expert_blocks)}" if self.expert_blocks else ""
        return (
            f"{gb(self.total)} (parameters {gb(self.parameters)}, gradients {gb(self.gradients)}, optimizer "
            f"state {gb(self.optimizer)}, activations {gb(self.activations)}{blocks}, runtime {gb(self.runtime)})"
        )


def routed_rows(cfg: TrainConfig, tokens: int) -> tuple[int, bool]:
    """(rows of the MoE's expert matmuls for `tokens` tokens, whether the dispatch is dropless):
    delphi.model.moe.MoE's dispatch buffer in training."""
    moe = cfg.model.moe
    if is_dropless(moe.capacity_factor, moe.top_k, moe.experts, train=True):
        return (-(-tokens * moe.top_k // DROPLESS_BLOCK) + moe.experts) * DROPLESS_BLOCK, True
    return moe.experts * expert_capacity(tokens, moe.top_k, moe.experts, moe.capacity_factor, train=True), False


def activation_bytes_per_token(cfg: TrainConfig, tokens: int, attention: str = "blocked") -> tuple[float, float]:
    """(bytes per token kept for the backward pass in one layer, bytes per token once at the
    output) for a step of `tokens` tokens on one device (module docstring)."""
    m, seq = cfg.model, cfg.data.seq_len
    compute = 2 if cfg.precision == "bf16" else 4
    d, heads_width, probs = m.d_model, m.n_heads * m.d_head, m.n_heads * ATTENTION_PROBS_PER_SEQ[attention] * seq
    f32 = 3 * d + 10 * heads_width + probs
    matmul_inputs = d + heads_width
    if m.moe is None:
        f32 += 5 * m.d_ff
        matmul_inputs += d + m.d_ff
    else:
        moe = m.moe
        rows_per_token = routed_rows(cfg, tokens)[0] / tokens
        shared = moe.shared_experts * moe.d_expert
        f32 += 2 * moe.experts + d + moe.top_k * d + rows_per_token * 5 * moe.d_expert + 5 * shared
        matmul_inputs += d + rows_per_token * (d + moe.d_expert) + (d + shared if shared else 0)
    output = F32_BYTES * (d + 4 * m.vocab_size) + compute * d
    return F32_BYTES * f32 + compute * matmul_inputs, output


def expert_block_bytes(cfg: TrainConfig, tokens: int) -> int:
    """A dropless MoE's per-block expert weights: kept in every layer in the compute dtype, and one
    layer's f32 gradient of them (module docstring); 0 for a dense model or capacity groups."""
    m = cfg.model
    if m.moe is None:
        return 0
    rows, dropless = routed_rows(cfg, tokens)
    if not dropless:
        return 0
    gathered = rows // DROPLESS_BLOCK * 3 * m.d_model * m.moe.d_expert
    compute = 2 if cfg.precision == "bf16" else 4
    return gathered * (m.n_layers * compute + F32_BYTES)


def estimate_train_memory(cfg: TrainConfig, seeds: int = 1, attention: str = "blocked") -> MemoryEstimate:
    """One device's bytes at the peak of a step of `cfg` (a seed group of `seeds` holds each
    member's state and activations); `attention`: the kernel (delphi.train.device.resolve_attention)."""
    counts = count_params(cfg.model)
    experts = expert_params(cfg.model)
    per_device_params = counts.total - experts + experts // max(cfg.mesh.expert, 1)
    tokens = max(1, cfg.data.batch_size * cfg.data.seq_len // max(cfg.mesh.data * cfg.mesh.expert, 1))
    per_layer, output = activation_bytes_per_token(cfg, tokens, attention)
    copies = 2 * per_device_params if cfg.precision == "bf16" else 0
    return MemoryEstimate(
        parameters=seeds * (PARAM_BYTES * per_device_params + copies),
        gradients=seeds * GRAD_BYTES * per_device_params,
        optimizer=seeds * ADAM_STATE_BYTES * per_device_params,
        activations=math.ceil(seeds * tokens * (cfg.model.n_layers * per_layer + output)),
        expert_blocks=seeds * expert_block_bytes(cfg, tokens),
        runtime=JAX_RUNTIME_BYTES,
    )


@dataclass(frozen=True)
class CompiledMemory:
    """XLA's memory analysis of a compiled program (`compiled.memory_analysis()`), in bytes: its
    arguments, its outputs, the outputs that reuse a donated argument's buffer (alias) and its
    temporaries. At its peak the program holds arguments + outputs - aliases + temporaries."""

    argument: int
    output: int
    alias: int
    temp: int

    @property
    def total(self) -> int:
        return self.argument + self.output - self.alias + self.temp

    @classmethod
    def of(cls, compiled: Any) -> "CompiledMemory | None":
        """The analysis of a jax `Compiled` program, or None where the backend gives none."""
        try:
            m = compiled.memory_analysis()
        except Exception:  # noqa: BLE001  a backend without the analysis raises or returns None
            return None
        if m is None:
            return None
        return cls(
            *(int(getattr(m, f"{name}_size_in_bytes", 0) or 0) for name in ("argument", "output", "alias", "temp"))
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "argument": self.argument,
            "output": self.output,
            "alias": self.alias,
            "temp": self.temp,
            "total": self.total,
        }


@dataclass(frozen=True)
class Available:
    """Memory a run may use: one accelerator's (`per_device`: each device has its own), or the
    host's, shared by every local CPU device and the JAX runtime."""

    bytes: int
    what: str  # for a message: whose memory, e.g. "one gpu device's free (NVIDIA H100 80GB HBM3)"
    per_device: bool
    devices: int  # local devices

    def need(self, per_device_bytes: int, runtime: int) -> int:
        """Bytes these devices need for `per_device_bytes` each (and the runtime in host memory)."""
        return per_device_bytes if self.per_device else self.devices * per_device_bytes + runtime


def available_memory(local_devices: list[Any]) -> Available:
    """What the run's devices on this host have free now: an accelerator's memory stats (what
    JAX's allocator may still take: its limit less what it holds), else the host's MemAvailable."""
    first = local_devices[0]
    stats = device_memory_bytes(first) if first.platform != "cpu" else None
    if stats is not None:
        limit, in_use = stats
        return Available(
            limit - in_use,
            f"one {first.platform} device's free ({first.device_kind}; JAX may allocate "
            f"{limit / 1e9:.3g} GB of it, see XLA_PYTHON_CLIENT_MEM_FRACTION)",
            True,
            len(local_devices),
        )
    n = len(local_devices)
    have = host_available_bytes()
    what = f"this machine's available ({n} CPU device{'s' if n > 1 else ''}; MemAvailable)"
    if have is None:
        have, what = host_memory_bytes(), f"this machine's ({n} CPU device{'s' if n > 1 else ''})"
    return Available(have, what, False, n)


def run_shape(cfg: TrainConfig, seeds: int) -> str:
    """The run's shape as a refusal names it."""
    return (
        f"model: d_model={cfg.model.d_model}, n_layers={cfg.model.n_layers} at data.batch_size="
        f"{cfg.data.batch_size} x data.seq_len={cfg.data.seq_len}{f' x {seeds} seeds' if seeds > 1 else ''}"
    )


def check_estimate_fits(cfg: TrainConfig, local_devices: list[Any], seeds: int = 1) -> MemoryEstimate:
    """DelphiError when the trainer's estimate of one step (estimate_train_memory) exceeds what the
    devices have free: made before anything is compiled, allocated or written."""
    estimate = estimate_train_memory(cfg, seeds)
    available = available_memory(local_devices)
    need = available.need(estimate.total - estimate.runtime, estimate.runtime)
    if need > available.bytes:
        raise DelphiError(
            f"{run_shape(cfg, seeds)} needs about {need / 1e9:.3g} GB per step, more than {available.what} "
            f"{available.bytes / 1e9:.3g} GB of memory; estimate: {estimate.describe()}; expected a smaller model or "
            f"batch, or more devices"
        )
    return estimate


def check_program_fits(
    cfg: TrainConfig, memory: CompiledMemory | None, local_devices: list[Any], seeds: int = 1
) -> None:
    """DelphiError when the compiled train step (XLA's memory analysis, per device) exceeds what the
    devices have free, naming both numbers and the trainer's own estimate beside them."""
    if memory is None:
        return
    available = available_memory(local_devices)
    need = available.need(memory.total, JAX_RUNTIME_BYTES)
    if need > available.bytes:
        gb = lambda b: f"{b / 1e9:.3g} GB"  # noqa: E731
        estimate = estimate_train_memory(cfg, seeds)
        raise DelphiError(
            f"{run_shape(cfg, seeds)}: its compiled train step needs {gb(need)} (XLA's memory analysis per device: "
            f"arguments {gb(memory.argument)}, outputs {gb(memory.output - memory.alias)} beyond them, temporaries "
            f"{gb(memory.temp)}; the trainer's estimate {gb(estimate.total)}), more than {available.what} "
            f"{gb(available.bytes)}; expected a smaller model or batch, or more devices"
        )


def host_memory_bytes() -> int:
    """Physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_available_bytes() -> int | None:
    """Memory the kernel can give this process now without swapping (MemAvailable), or None."""
    try:
        with open(MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
