"""Will a training run fit in memory? An estimate made before anything is allocated.

A model too large for the machine used to abort inside XLA's allocator with a C++ stack (exit
134, issue 31), which no Python code can catch, after the run directory had been written. So
`train` first adds up what one optimizer step holds at its peak and compares it with the memory
that is free now; more than that is a DelphiError (exit 2) with the numbers, before anything is
written.

The estimate, per device:
- parameters: f32 master weights, 4 bytes each (routed experts split over mesh.expert);
- gradients: 4 bytes per parameter;
- optimizer state: Adam's two f32 moments, 8 bytes per parameter (optax.adamw);
- activations kept for the backward pass (no rematerialisation), per token of the step's batch
  on this device: per layer the normed inputs and residuals of both blocks (4 d), Q, K, V, the
  attention output and its projection input (5 h d_head), the attention scores and
  probabilities (2 h S, f32), the SwiGLU gate, up, activation and product (4 d_ff; for a MoE
  4 d_expert per routed slot x capacity factor plus the shared experts, and the router's E
  logits); then the output logits and their softmax (2 V, f32) once. Elements of the compute
  dtype (bf16: 2 bytes) except the softmaxes (f32);
- the JAX/XLA runtime itself (JAX_RUNTIME_BYTES).
It leaves out XLA's temporary buffers and fusion choices, so it is a lower bound of the real
peak: a run it refuses would not have fitted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from delphi.train.config import TrainConfig

PARAM_BYTES = 4  # f32 master weights
GRAD_BYTES = 4  # f32 gradients
ADAM_STATE_BYTES = 8  # two f32 moments per parameter (optax.adamw)
SOFTMAX_BYTES = 4  # attention and output softmaxes are computed in f32
# A process with JAX and XLA's CPU runtime loaded holds ~0.4 GB before any array (measured on the
# ladder workers, delphi.ladder.runner.WORKER_MEMORY_BYTES allows 1 GB with the compiler's peaks).
JAX_RUNTIME_BYTES = 400 * 1024**2
MEMINFO = "/proc/meminfo"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device needs at the peak of a training step, by part."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    runtime: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.runtime

    def describe(self) -> str:
        gb = lambda b: f"{b / 1e9:.3g} GB"  # noqa: E731
        return (f"{gb(self.total)} (parameters {gb(self.parameters)}, gradients {gb(self.gradients)}, optimizer "
                f"state {gb(self.optimizer)}, activations {gb(self.activations)}, runtime {gb(self.runtime)})")


def activation_elements_per_token(cfg: TrainConfig) -> tuple[float, float]:
    """(elements of the compute dtype, f32 softmax elements) kept for the backward pass per token."""
    m, seq = cfg.model, cfg.data.seq_len
    heads_width = m.n_heads * m.d_head
    if m.moe is None:
        ffn = 4 * m.d_ff
    else:
        routed = 4 * m.moe.d_expert * m.moe.top_k * m.moe.capacity_factor
        ffn = routed + 4 * m.moe.d_expert * m.moe.shared_experts + m.moe.experts
    per_layer = 4 * m.d_model + 5 * heads_width + ffn
    softmax = m.n_layers * 2 * m.n_heads * seq + 2 * m.vocab_size
    return m.n_layers * per_layer + m.d_model, softmax


def estimate_train_memory(cfg: TrainConfig, seeds: int = 1) -> MemoryEstimate:
    """One device's bytes at the peak of a step of `cfg` (a seed group of `seeds` holds each
    member's state and activations)."""
    from delphi.model.flops import count_params, expert_params

    experts = expert_params(cfg.model)
    per_device_params = count_params(cfg.model).total - experts + experts // max(cfg.mesh.expert, 1)
    tokens = cfg.data.batch_size * cfg.data.seq_len // max(cfg.mesh.data * cfg.mesh.expert, 1)
    compute_elements, softmax_elements = activation_elements_per_token(cfg)
    compute_bytes = 2 if cfg.precision == "bf16" else 4
    activations = tokens * (compute_elements * compute_bytes + softmax_elements * SOFTMAX_BYTES)
    return MemoryEstimate(
        parameters=seeds * PARAM_BYTES * per_device_params,
        gradients=seeds * GRAD_BYTES * per_device_params,
        optimizer=seeds * ADAM_STATE_BYTES * per_device_params,
        activations=int(seeds * activations),
        runtime=JAX_RUNTIME_BYTES,
    )


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
