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
from typing import Any

from delphi.errors import DelphiError
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
        return cls(*(int(getattr(m, f"{name}_size_in_bytes", 0) or 0) for name in ("argument", "output", "alias", "temp")))

    def as_dict(self) -> dict[str, int]:
        return {"argument": self.argument, "output": self.output, "alias": self.alias, "temp": self.temp,
                "total": self.total}


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
    from delphi.train.device import device_memory_bytes

    first = local_devices[0]
    stats = device_memory_bytes(first) if first.platform != "cpu" else None
    if stats is not None:
        limit, in_use = stats
        return Available(limit - in_use, f"one {first.platform} device's free ({first.device_kind}; JAX may allocate "
                         f"{limit / 1e9:.3g} GB of it, see XLA_PYTHON_CLIENT_MEM_FRACTION)", True, len(local_devices))
    n = len(local_devices)
    have = host_available_bytes()
    what = f"this machine's available ({n} CPU device{'s' if n > 1 else ''}; MemAvailable)"
    if have is None:
        have, what = host_memory_bytes(), f"this machine's ({n} CPU device{'s' if n > 1 else ''})"
    return Available(have, what, False, n)


def run_shape(cfg: TrainConfig, seeds: int) -> str:
    """The run's shape as a refusal names it."""
    return (f"model: d_model={cfg.model.d_model}, n_layers={cfg.model.n_layers} at data.batch_size="
            f"{cfg.data.batch_size} x data.seq_len={cfg.data.seq_len}{f' x {seeds} seeds' if seeds > 1 else ''}")


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


def check_program_fits(cfg: TrainConfig, memory: CompiledMemory | None, local_devices: list[Any], seeds: int = 1) -> None:
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
