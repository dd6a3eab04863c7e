"""Which devices a run trains on, and which attention kernel it uses there.

    device     auto | cpu | gpu  (train config `device`; `--device` on the command line, passed to
                                  ladder workers and a study's runs as DELPHI_DEVICE, wins over it)
    attention  auto | blocked | fused  (train config `attention`)

`request_platform` runs before JAX starts its backends: `cpu` restricts JAX to the CPU, so a CPU
run on a GPU machine leaves the GPU's memory alone (JAX's GPU client takes 75% of it when it
starts). `gpu` and `auto` leave the choice to JAX (JAX_PLATFORMS, else its accelerator if it has
one). `select_devices` then asks JAX which devices it has and refuses, as a DelphiError (exit 2,
one line), a GPU asked for where JAX sees none, a JAX_PLATFORMS that JAX cannot start (JAX itself
raises an AssertionError or a RuntimeError with a page of traceback), and a precision the device
cannot run (`check_precision`).

Attention (docs/design.md §4.1): `blocked` is delphi.model.transformer's query-blocked attention
with its written-out backward pass, the fastest on XLA:CPU; `fused` is
`jax.nn.dot_product_attention`, with cuDNN's flash attention on an NVIDIA GPU in bf16 (the
transformer falls back to JAX's XLA implementation where cuDNN refuses a shape). `auto` is fused
on a GPU and blocked elsewhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from delphi.errors import DelphiError, quoted
from delphi.train.environment import device_env

PLATFORMS_ENV = "JAX_PLATFORMS"
GPU_PLATFORM = "gpu"  # what jax.Device.platform says for NVIDIA (and AMD) GPUs
CUDA_INSTALL_HINT = "pip install 'delphi[cuda]' ('delphi[cuda12]' for CUDA 12)"  # JAX's own CUDA wheels
# bf16 tensor cores came with NVIDIA Ampere (compute capability 8.0: A100, then H100/H200). On an
# older GPU XLA runs bf16 matmuls as f32 ones, slower than precision f32 itself (openxla/xla#12429),
# so a bf16 run there is refused rather than silently slow.
BF16_MIN_COMPUTE_CAPABILITY = 8.0
FUSED_IMPLEMENTATIONS = ("cudnn", "xla")  # jax.nn.dot_product_attention's implementations


def effective_device(configured: str) -> str:
    """The device a run asks for: DELPHI_DEVICE (set by --device) if set, else the config's."""
    return device_env() or configured


def request_platform(device: str) -> None:
    """Before JAX starts its backends: `cpu` restricts JAX to the CPU; anything else leaves JAX's
    choice alone. A no-op once JAX's backends are running (select_devices then picks the CPU)."""
    if device != "cpu":
        return
    if "jax" not in sys.modules:
        os.environ[PLATFORMS_ENV] = "cpu"
        return
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")


def _jax_version() -> str:
    import jax

    return jax.__version__


def visible_devices() -> list[Any]:
    """jax.devices(); a backend JAX cannot start (JAX_PLATFORMS naming a platform whose plugin is
    not installed, or one that fails) is a DelphiError naming the variable and the install line."""
    import jax

    try:
        return jax.devices()
    except (RuntimeError, AssertionError) as e:
        platforms = os.environ.get(PLATFORMS_ENV, "")
        detail = " ".join(str(e).split()) or "no backend of that name is installed"
        where = f"environment variable {PLATFORMS_ENV}={quoted(platforms)}" if platforms else "JAX"
        raise DelphiError(
            f"{where}: JAX {_jax_version()} could not start its backend ({detail[:300]}); a GPU needs JAX's CUDA "
            f"build: {CUDA_INSTALL_HINT}, or unset {PLATFORMS_ENV} to train on what JAX finds"
        ) from None


def select_devices(device: str) -> list[Any]:
    """The devices a run with `device` (auto, cpu or gpu) trains on; a DelphiError when JAX has
    none of that kind."""
    import jax

    devices = visible_devices()
    if device == "auto" or devices[0].platform == ("cpu" if device == "cpu" else GPU_PLATFORM):
        return devices
    if device == "cpu":
        return jax.devices("cpu")  # the backends were already running on an accelerator
    try:
        return jax.devices(GPU_PLATFORM)
    except RuntimeError:
        pass
    seen = f"{len(devices)} {devices[0].platform} device{'s' if len(devices) > 1 else ''}"
    platforms = os.environ.get(PLATFORMS_ENV)
    setting = f", {PLATFORMS_ENV}={quoted(platforms)}" if platforms else ""
    raise DelphiError(
        f"device: gpu, but JAX {_jax_version()} sees no GPU (only {seen}{setting}); on a machine with an NVIDIA GPU "
        f"install JAX's CUDA build: {CUDA_INSTALL_HINT}; or train with --device cpu"
    )


def compute_capability(device: Any) -> float | None:
    """An NVIDIA GPU's compute capability (e.g. 9.0 for an H100), or None when JAX gives none."""
    text = getattr(device, "compute_capability", None)
    try:
        return float(text) if text is not None else None
    except (TypeError, ValueError):
        return None


def check_precision(precision: str, devices: Sequence[Any]) -> None:
    """DelphiError for a precision the devices cannot run: bf16 on a GPU without bf16 tensor cores."""
    device = devices[0]
    if precision != "bf16" or device.platform != GPU_PLATFORM:
        return
    capability = compute_capability(device)
    if capability is not None and capability < BF16_MIN_COMPUTE_CAPABILITY:
        raise DelphiError(
            f"precision: bf16 needs a GPU with bf16 tensor cores (compute capability >= {BF16_MIN_COMPUTE_CAPABILITY:.1f}, "
            f"e.g. A100, H100); {device.device_kind} has {capability:g}, where XLA would run every bf16 matmul as an "
            f"f32 one; use precision: f32"
        )


def resolve_attention(attention: str, platform: str, precision: str) -> str:
    """The attention kernel a run uses: "blocked", or one of FUSED_IMPLEMENTATIONS ("cudnn" on a
    GPU in bf16, which cuDNN's flash attention takes; JAX's "xla" otherwise)."""
    if attention == "blocked" or (attention == "auto" and platform != GPU_PLATFORM):
        return "blocked"
    return "cudnn" if platform == GPU_PLATFORM and precision == "bf16" else "xla"


def device_memory_bytes(device: Any) -> tuple[int, int] | None:
    """(bytes JAX may allocate on `device`, bytes in use) from its memory stats, or None where JAX
    reports none (the CPU: its memory is the host's)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001  some backends raise instead of returning None
        return None
    if not stats or not stats.get("bytes_limit"):
        return None
    return int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0))


# Where the NVIDIA driver lists a machine's GPUs, one directory each: readable without starting
# JAX, so a ladder's parent process can size its workers before any of them imports it.
NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"
CUDA_VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def jax_has_cuda() -> bool:
    """Whether a CUDA build of JAX is installed (its PJRT plugin package), without importing JAX."""
    from importlib import metadata

    names = {(d.metadata.get("Name") or "").lower() for d in metadata.distributions()}
    return any(name.startswith("jax-cuda") and name.endswith("-plugin") for name in names)


def worker_gpus(device: str, *, gpus_dir: str = NVIDIA_GPUS_DIR) -> list[str]:
    """The GPUs a ladder gives its workers, one each (CUDA_VISIBLE_DEVICES values), found without
    JAX: for `gpu`, and for `auto` where a CUDA build of JAX is installed, CUDA_VISIBLE_DEVICES's
    list if set, else one per GPU the driver lists; [] for `cpu` or where there is no GPU (each
    worker then takes what JAX finds, and a `gpu` run without one is refused by select_devices)."""
    if device == "cpu" or (device == "auto" and not jax_has_cuda()):
        return []
    visible = os.environ.get(CUDA_VISIBLE_ENV)
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        return [str(i) for i in range(len(os.listdir(gpus_dir)))]
    except OSError:
        return []


def check_gpu_host(device: str, gpus: list[str]) -> None:
    """Before a ladder starts workers for `gpu`: a DelphiError where this machine shows no sign of a
    GPU JAX could use (no GPU for the workers and no CUDA build of JAX), instead of every rung
    failing on its own."""
    if device == "gpu" and not gpus and not jax_has_cuda():
        raise DelphiError(
            f"--device gpu: this machine shows no GPU (none listed in {NVIDIA_GPUS_DIR}, and no CUDA build of JAX "
            f"installed); on a machine with an NVIDIA GPU install it: {CUDA_INSTALL_HINT}; or use --device cpu"
        )
