"""The environment variables training reads, each checked before anything is written.

A value that cannot be used is a DelphiError (exit 2) naming the variable, its value and what was
expected, before the run directory exists: read where it is used, a bad one would give a traceback
(`DELPHI_STEPS_PER_CALL=abc`, `WANDB_MODE=online` without an API key) or a wrong number
(`DELPHI_PEAK_FLOPS_F32=-1`: a negative MFU).

No JAX here: `delphi train` checks the environment in the supervising parent, before it forks.
"""

from __future__ import annotations

import math
import netrc
import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from delphi.data.store import cache_dir
from delphi.errors import DelphiError, quoted
from delphi.path_policy import check_output_dir
from delphi.train.config import DEVICE_CHOICES

PEAK_ENV = {"f32": "DELPHI_PEAK_FLOPS_F32", "bf16": "DELPHI_PEAK_FLOPS_BF16"}  # FLOP/s, > 0
STEPS_PER_CALL_ENV = "DELPHI_STEPS_PER_CALL"  # an integer >= 1
CHECKPOINT_CLOCK_ENV = "DELPHI_CHECKPOINT_CLOCK_S"  # seconds >= 0 (0: off)
DISTRIBUTED_ENV = "DELPHI_DISTRIBUTED"  # a boolean
CACHE_ENV = "DELPHI_CACHE"  # token stores and the compilation cache (delphi.data.store.cache_dir)
# The persistent JAX compilation cache: $DELPHI_CACHE/jax unless DELPHI_JAX_CACHE names a directory
# or switches it off (one of JAX_CACHE_OFF).
JAX_CACHE_ENV = "DELPHI_JAX_CACHE"
JAX_CACHE_SUBDIR = "jax"
JAX_CACHE_OFF = ("off", "0", "none", "false")
DEVICE_ENV = "DELPHI_DEVICE"  # auto, cpu or gpu: the command line's --device, inherited by ladder workers
WANDB_MODE_ENV = "WANDB_MODE"
# What wandb.init(mode=...) accepts; "dryrun" is wandb's older name of offline.
WANDB_MODES = ("online", "offline", "disabled", "shared")
WANDB_MODE_ALIASES = {"dryrun": "offline"}
WANDB_DEFAULT_HOST = "https://api.wandb.ai"
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
# XLA's CPU backend splits an op over an Eigen thread pool as large as the cores the process may use,
# unless this flag turns the pool off (a ladder's one-core workers run so: delphi.ladder.runner). A
# float sum split over another number of threads rounds differently, and a few hundred steps amplify
# it to a visibly different loss. The count is therefore part of what a run's numbers depend on;
# docs/design.md says what is deterministic.
SINGLE_THREAD_XLA_FLAG = "--xla_cpu_multi_thread_eigen=false"


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def env_float(name: str, *, minimum: float = 0.0, strict: bool = True) -> float | None:
    """A finite number from the environment (> minimum when `strict`, else >= minimum), or None
    when unset or empty."""
    text = _raw(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        expected = f"a finite number {'>' if strict else '>='} {minimum:g}"
        raise DelphiError(f"environment variable {name}={quoted(text)}: expected {expected}")
    return value


def env_int(name: str, *, minimum: int = 1) -> int | None:
    """An integer >= minimum from the environment, or None when unset or empty."""
    text = _raw(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise DelphiError(f"environment variable {name}={quoted(text)}: expected an integer >= {minimum}")
    return value


def env_bool(name: str) -> bool:
    text = (os.environ.get(name) or "").strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise DelphiError(
        f"environment variable {name}={quoted(os.environ.get(name))}: expected "
        f"{'/'.join(TRUE_WORDS)} or {'/'.join(w for w in FALSE_WORDS if w)} (or unset)"
    )


def peak_flops_env(precision: str) -> float | None:
    """DELPHI_PEAK_FLOPS_F32 / _BF16: the matmul peak in FLOP/s (> 0), or None (measure it)."""
    return env_float(PEAK_ENV[precision], minimum=0.0)


def steps_per_call_env() -> int | None:
    return env_int(STEPS_PER_CALL_ENV, minimum=1)


def checkpoint_clock_env() -> float:
    """DELPHI_CHECKPOINT_CLOCK_S in seconds (0 or unset: off)."""
    return env_float(CHECKPOINT_CLOCK_ENV, minimum=0.0, strict=False) or 0.0


def distributed_env() -> bool:
    return env_bool(DISTRIBUTED_ENV)


def device_env() -> str | None:
    """DELPHI_DEVICE (auto, cpu or gpu; it overrides a config's `device`), or None when unset."""
    text = _raw(DEVICE_ENV)
    if text is None:
        return None
    if text.lower() not in DEVICE_CHOICES:
        raise DelphiError(
            f"environment variable {DEVICE_ENV}={quoted(text)}: expected one of {', '.join(DEVICE_CHOICES)}"
        )
    return text.lower()


def wandb_mode(configured: str | None) -> str:
    """The config's wandb.mode, else WANDB_MODE, else disabled (no account, no network); a
    WANDB_MODE that W&B does not know is a DelphiError naming it."""
    if configured:
        return configured
    text = _raw(WANDB_MODE_ENV)
    if text is None:
        return "disabled"
    mode = WANDB_MODE_ALIASES.get(text.lower(), text.lower())
    if mode not in WANDB_MODES:
        raise DelphiError(
            f"environment variable {WANDB_MODE_ENV}={quoted(text)}: expected one of "
            f"{', '.join(WANDB_MODES)} (unset: disabled)"
        )
    return mode


def wandb_key_source() -> str | None:
    """Where W&B would find an API key without asking: WANDB_API_KEY, an identity token file, or a
    netrc entry for the W&B host (WANDB_BASE_URL, default api.wandb.ai); None when nowhere."""
    if _raw("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    if _raw("WANDB_IDENTITY_TOKEN_FILE"):
        return "WANDB_IDENTITY_TOKEN_FILE"
    host = urlsplit(_raw("WANDB_BASE_URL") or WANDB_DEFAULT_HOST).netloc or urlsplit(WANDB_DEFAULT_HOST).netloc
    candidates = (
        [Path(os.environ["NETRC"])] if _raw("NETRC") else [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]
    )
    for path in candidates:
        if not path.is_file():
            continue
        try:
            entry = netrc.netrc(str(path)).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            return str(path)  # unreadable here: let W&B judge it rather than refuse
        if entry and entry[2]:
            return str(path)
    return None


def check_wandb(configured: str | None, where: str = "") -> str:
    """The W&B mode a run will use, refused (DelphiError) when it cannot work: an unknown mode, or
    online without an API key (wandb.init would stop to ask for one, or fail with a traceback)."""
    mode = wandb_mode(configured)
    if mode in ("online", "shared") and wandb_key_source() is None:
        source = f"{where}wandb.mode: {configured}" if configured else f"environment variable {WANDB_MODE_ENV}={mode}"
        raise DelphiError(
            f"{source}: W&B online needs an API key, and none is set (WANDB_API_KEY, or `wandb login`); "
            f"set one, or use {WANDB_MODE_ENV}=offline or unset it (disabled)"
        )
    return mode


def single_thread_xla_flags(flags: str | None) -> str:
    """An XLA_FLAGS value (`flags`, e.g. the environment's) with SINGLE_THREAD_XLA_FLAG added once."""
    parts = (flags or "").split()
    return " ".join(parts if SINGLE_THREAD_XLA_FLAG in parts else [*parts, SINGLE_THREAD_XLA_FLAG])


def xla_cpu_threads() -> int:
    """Intra-op threads XLA's CPU backend computes with in this process: 1 under
    SINGLE_THREAD_XLA_FLAG (in XLA_FLAGS before JAX started), else every core it may run on."""
    if SINGLE_THREAD_XLA_FLAG in os.environ.get("XLA_FLAGS", "").split():
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def jax_cache_dir() -> Path | None:
    """The per-machine JAX compilation cache directory, or None when switched off."""
    configured = os.environ.get(JAX_CACHE_ENV, "")
    if configured.lower() in JAX_CACHE_OFF:
        return None
    if configured:
        return Path(configured).expanduser()

    return cache_dir() / JAX_CACHE_SUBDIR


def check_cache_dirs() -> None:
    """Delphi's caches (DELPHI_CACHE: token stores; DELPHI_JAX_CACHE: compiled programs) are
    directories this process can create and write, checked before any step: otherwise every rung of
    a ladder fails on them in turn. DelphiError naming the variable and the directory."""
    for name, path in ((CACHE_ENV, cache_dir()), (JAX_CACHE_ENV, jax_cache_dir())):
        if path is None:
            continue
        shown = f"environment variable {name}" if os.environ.get(name) else f"the cache directory ({name} unset)"
        hint = f"set {name} to a directory you can write" + (f", or {name}=off" if name == JAX_CACHE_ENV else "")
        try:
            check_output_dir(path, flag=shown)
        except DelphiError as e:
            raise DelphiError(f"{e}: Delphi's cache cannot live there; {hint}") from None


def check_training_environment(wandb_modes: Iterable[str | None] = (None,)) -> None:
    """Every environment variable a training run reads, checked now (DelphiError naming the first
    bad one), with the W&B mode of each config (`wandb.mode`, None: follow WANDB_MODE)."""
    check_cache_dirs()
    for precision in PEAK_ENV:
        peak_flops_env(precision)
    steps_per_call_env()
    checkpoint_clock_env()
    distributed_env()
    device_env()
    for mode in dict.fromkeys(wandb_modes):
        check_wandb(mode)
