"""Training configuration: one YAML file fully describes a run.

`delphi train CONFIG.yaml` reads it with `load_train_config`, which rejects
unknown keys and impossible values with the dotted name of the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from delphi.config_schema import from_dict, load_config, to_dict
from delphi.errors import DelphiError
from delphi.model.config import ModelConfig
from delphi.model.flops import check_plausible_size, flops_per_token

# Seeds are in [0, SEED_LIMIT): JAX makes a key from a signed 64-bit integer (jax.random.key raises
# OverflowError from 2**63 on), so a larger seed could never train.
SEED_LIMIT = 2**63


# Tokens per evaluation batch by default (32 sequences at seq 128). The eval is bound by its forward
# FLOPs (dropless MoE: every expert sees every token), not by the batch size, so a small batch costs
# no time and keeps activations small (docs/notebook.md §8.28 has the timings).
EVAL_BATCH_TOKENS = 4_096


@dataclass(frozen=True)
class DataConfig:
    # A prepared token store directory, or a built-in source name ("stdlib",
    # "environment") that is prepared once into the cache on first use.
    store: str = "stdlib"
    seq_len: int = 128
    batch_size: int = 32  # sequences per optimizer step
    seed: int = 0  # the batch at step s is a pure function of (seed, s)
    # The tokenizer the run expects its store to have been built with: "byte", "bpe" or a
    # tokenizer.json path (its sha256 must be the store's); None: whatever the store holds, the
    # model's vocab_size must still match (delphi.data.store.check_store_for_config). Unset, it is
    # left out of the config's dict (DATA_KEYS_ADDED), so every config keeps its bytes and hash.
    tokenizer: str | None = None


@dataclass(frozen=True)
class OptimConfig:
    """`optimizer: adamw` (default): lr is the Adam LR at the base width (muP scales the hidden
    matrices' by 1/m) and weight_decay is decoupled, multiplied by the LR (optax.adamw).

    `optimizer: adamh` (delphi.train.adamh): lr is eta, the relative step size of the AdamH
    matrices (no width term), adam_lr the LR of the plain-Adam groups (embeddings, unembedding,
    router, norm gains); adam_lr is required, and there is no weight decay (an omitted
    weight_decay reads as 0 under adamh; any other value is refused). beta1, beta2, eps,
    grad_clip and the schedule apply to both; the schedule multiplies both LRs.
    """

    lr: float = 3e-3
    weight_decay: float = 0.1  # adamw only; multiplied by the LR (optax.adamw), see docs/design.md §4.4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8  # at the base shape; CompleteP scales it by 1/(m * m_L)
    grad_clip: float = 1.0  # global norm; 0 disables
    schedule: Literal["wsd", "cosine", "constant"] = "wsd"
    warmup_frac: float = 0.1
    decay_frac: float = 0.2  # WSD: fraction of steps in the final decay
    decay_shape: Literal["linear", "sqrt"] = "linear"  # "sqrt" is 1-sqrt (Hagele et al. 2024)
    min_lr_frac: float = 0.0  # floor as a fraction of the peak LR
    # Added with AdamH. At these defaults both are left out of the config's dict (OPTIM_KEYS_ADDED
    # below), so every config written before keeps its bytes and its config_sha256.
    optimizer: Literal["adamw", "adamh"] = "adamw"
    adam_lr: float | None = None  # adamh: LR of the plain-Adam groups; must be unset under adamw


# optim keys added after runs were on disk, with the value that reproduces those runs: a config
# at that value is written without the key (train_config_to_dict), so its YAML and its
# config_sha256 are those of the same config before the key existed.
OPTIM_KEYS_ADDED: dict[str, object] = {"optimizer": "adamw", "adam_lr": None}
DATA_KEYS_ADDED: dict[str, object] = {"tokenizer": None}  # the same for data keys


@dataclass(frozen=True)
class WandbConfig:
    project: str = "delphi"
    entity: str | None = None
    # None follows WANDB_MODE, defaulting to "disabled" so that a run needs no account.
    mode: Literal["online", "offline", "disabled"] | None = None


@dataclass(frozen=True)
class MeshConfig:
    """The device mesh a run is sharded over (docs/scaling-out.md; docs/design.md §4.3).

    Batches are split over data x expert devices; routed-expert weights [E, ...] are split over
    `expert` (each device holds E / expert experts and tokens reach them by all-to-all); every other
    parameter is replicated. data * expert * model must equal the number of devices at run time.
    The mesh changes where the maths runs, not the maths: it is left out of config_sha256 and a run
    may be resumed on a different mesh.
    """

    data: int = 1
    expert: int = 1
    model: int = 1  # tensor parallelism: reserved, must be 1 for now
    # Multi-host: call jax.distributed.initialize() before anything else. The three settings below
    # default to JAX's environment variables (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
    # JAX_PROCESS_ID) or to the cluster's auto-detection (SLURM, Open MPI, Cloud TPU).
    # DELPHI_DISTRIBUTED=1 in the environment asks for it as well.
    distributed: bool = False
    coordinator_address: str | None = None  # "host:port" of process 0
    num_processes: int | None = None
    process_id: int | None = None

    @property
    def devices(self) -> int:
        return self.data * self.expert * self.model


# Which devices train the run, and which attention kernel: settings of the machine, not of the
# maths (numbers equal up to rounding), so like `mesh` they are left out of config_sha256
# (delphi.train.trainer.MATHS_FREE_KEYS). delphi.train.device resolves and checks them.
DEVICE_CHOICES = ("auto", "cpu", "gpu")  # auto: what JAX sees (its accelerator if it has one)
ATTENTION_CHOICES = ("auto", "blocked", "fused")  # auto: fused on a GPU, blocked elsewhere
# Top-level keys added after configs were on disk, with the value that reproduces them: left out of
# the config's dict at that value (train_config_to_dict), so older configs keep their bytes.
KEYS_ADDED: dict[str, object] = {"device": "auto", "attention": "auto"}


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    steps: int = 1000
    seed: int = 0  # parameter init
    precision: Literal["f32", "bf16"] = "f32"  # bf16: f32 master weights, bf16 matmuls
    log_every: int = 10
    eval_every: int = 200
    eval_tokens: int = 65_536  # held-out tokens per evaluation
    # Held-out tokens of the last evaluation (None: eval_tokens). The final loss is the number a fit
    # uses, so it can afford a larger set than the curve's evaluations: a superset of theirs
    # (TokenStore.final_eval_chunks), evaluated with the same program; the summary's val_loss is this one.
    final_eval_tokens: int | None = None
    # Sequences per evaluation batch, independent of data.batch_size (which still sets how many
    # windows are evaluated, see TokenStore.eval_windows); None: ~EVAL_BATCH_TOKENS per batch.
    # Changes no number beyond float rounding, so like `mesh` it is left out of config_sha256.
    eval_batch_size: int | None = None
    checkpoint_every: int = 200
    # > 0: a checkpoint_every checkpoint is skipped while the last save (or the session's start) is
    # less than this many seconds ago; the final one and one on a stop are always written. An Orbax
    # save costs most of a second even for a tiny model, so short rungs keep only what a kill would
    # cost more than that to redo.
    # 0: every checkpoint_every steps. Changes no number: left out of config_sha256.
    checkpoint_every_s: float = 0.0
    keep_checkpoints: int = 2
    wandb: WandbConfig = field(default_factory=WandbConfig)
    name: str | None = None
    mesh: MeshConfig = field(default_factory=MeshConfig)
    device: Literal["auto", "cpu", "gpu"] = "auto"
    attention: Literal["auto", "blocked", "fused"] = "auto"

    def store_needs(self) -> dict[str, Any]:
        """What this run asks of its token store, as `TokenStore.check_feeds` takes it."""
        return {
            "batch_size": self.data.batch_size,
            "seq_len": self.data.seq_len,
            "eval_tokens": self.eval_tokens,
            "final_eval_tokens": self.final_eval_tokens,
        }

    @property
    def tokens_per_step(self) -> int:
        return self.data.seq_len * self.data.batch_size

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    @property
    def flops(self) -> float:
        """Model FLOPs of the whole run: exact FLOPs per token (Chinchilla appendix F) x tokens."""
        return flops_per_token(self.model, self.data.seq_len) * self.tokens

    @property
    def last_eval_tokens(self) -> int:
        """Validation tokens asked of the last evaluation, whose loss the fits use."""
        return self.eval_tokens if self.final_eval_tokens is None else self.final_eval_tokens

    def eval_batch_sequences(self, n_windows: int) -> int:
        """Sequences per evaluation batch for `n_windows` validation windows: eval_batch_size, or
        ~EVAL_BATCH_TOKENS, a multiple of the devices the batch is split over and no larger than
        the windows need."""
        shards = self.mesh.data * self.mesh.expert
        if self.eval_batch_size is not None:
            return self.eval_batch_size
        wanted = max(1, EVAL_BATCH_TOKENS // self.data.seq_len)
        return min(-(-wanted // shards), -(-n_windows // shards)) * shards

    def validate(self) -> "TrainConfig":
        self.model.validate("model")
        check_plausible_size(self.model, "model")  # a typo like d_model: 1000000000, named with the file

        def need(ok: bool, key: str, message: str) -> None:
            if not ok:
                raise DelphiError(f"{key}: {message}")

        for key, value in (
            ("steps", self.steps),
            ("data.seq_len", self.data.seq_len),
            ("data.batch_size", self.data.batch_size),
            ("log_every", self.log_every),
            ("eval_every", self.eval_every),
            ("eval_tokens", self.eval_tokens),
            ("eval_batch_size", 1 if self.eval_batch_size is None else self.eval_batch_size),
            ("checkpoint_every", self.checkpoint_every),
            ("keep_checkpoints", self.keep_checkpoints),
        ):
            need(value > 0, key, f"must be a positive integer, got {value}")
        if self.final_eval_tokens is not None:
            need(
                self.final_eval_tokens >= self.eval_tokens,
                "final_eval_tokens",
                f"must be >= eval_tokens ({self.eval_tokens}), got {self.final_eval_tokens}",
            )
        # before anything is written: a seed out of range would otherwise fail at the first batch
        # (data.seed) or in JAX's key (seed), after the run directory exists
        for key, value in (("seed", self.seed), ("data.seed", self.data.seed)):
            need(0 <= value < SEED_LIMIT, key, f"must be an integer in [0, 2**63), got {value}")
        o = self.optim
        need(self.checkpoint_every_s >= 0, "checkpoint_every_s", f"must be >= 0 seconds, got {self.checkpoint_every_s}")
        need(o.lr > 0, "optim.lr", f"must be positive, got {o.lr}")
        need(o.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {o.weight_decay}")
        need(0 <= o.beta1 < 1, "optim.beta1", f"must be in [0, 1), got {o.beta1}")
        need(0 <= o.beta2 < 1, "optim.beta2", f"must be in [0, 1), got {o.beta2}")
        need(o.eps > 0, "optim.eps", f"must be positive, got {o.eps}")
        need(o.grad_clip >= 0, "optim.grad_clip", f"must be >= 0, got {o.grad_clip}")
        need(0 <= o.warmup_frac < 1, "optim.warmup_frac", f"must be in [0, 1), got {o.warmup_frac}")
        need(0 <= o.decay_frac <= 1, "optim.decay_frac", f"must be in [0, 1], got {o.decay_frac}")
        need(o.warmup_frac + o.decay_frac <= 1, "optim.decay_frac", "warmup_frac + decay_frac must be <= 1")
        need(0 <= o.min_lr_frac <= 1, "optim.min_lr_frac", f"must be in [0, 1], got {o.min_lr_frac}")
        if o.optimizer == "adamh":
            need(
                o.adam_lr is not None,
                "optim.adam_lr",
                "required with optim.optimizer adamh: the LR of the plain-Adam groups (embeddings, norm gains, router)",
            )
            need(o.adam_lr > 0, "optim.adam_lr", f"must be positive, got {o.adam_lr}")
            need(
                o.weight_decay == 0,
                "optim.weight_decay",
                f"AdamH has no weight decay (the norm constraint replaces it); must be 0 or omitted, got {o.weight_decay}",
            )
        else:
            need(
                o.adam_lr is None,
                "optim.adam_lr",
                f"only for optim.optimizer adamh (optim.lr is the one LR of adamw); leave it unset, got {o.adam_lr}",
            )
        m = self.mesh
        for key in ("data", "expert", "model"):
            need(getattr(m, key) >= 1, f"mesh.{key}", f"must be a positive integer, got {getattr(m, key)}")
        need(m.model == 1, "mesh.model", f"tensor parallelism is not implemented yet, must be 1, got {m.model}")
        if self.model.moe is not None:
            need(
                self.model.moe.experts % m.expert == 0,
                "mesh.expert",
                f"{m.expert} devices do not divide model.moe.experts={self.model.moe.experts}",
            )
        need(
            self.data.batch_size % (m.data * m.expert) == 0,
            "data.batch_size",
            f"{self.data.batch_size} sequences do not split over mesh.data x mesh.expert = {m.data * m.expert} devices",
        )
        if self.eval_batch_size is not None:
            need(
                self.eval_batch_size % (m.data * m.expert) == 0,
                "eval_batch_size",
                f"{self.eval_batch_size} sequences do not split over mesh.data x mesh.expert = {m.data * m.expert} devices",
            )
        if m.num_processes is not None:
            need(m.num_processes >= 1, "mesh.num_processes", f"must be positive, got {m.num_processes}")
        if m.process_id is not None:
            need(m.process_id >= 0, "mesh.process_id", f"must be >= 0, got {m.process_id}")
        return self


def train_config_from_dict(data: dict, where: str = "") -> TrainConfig:
    if not isinstance(data, dict):  # an empty file is None: not a request for every default
        shown = "an empty document" if data is None else f"{type(data).__name__} {data!r:.60}"
        raise DelphiError(f"{where + ': ' if where else ''}expected a mapping (a train config), got {shown}")
    optim = data.get("optim")
    if isinstance(optim, dict) and optim.get("optimizer") == "adamh" and "weight_decay" not in optim:
        data = data | {"optim": optim | {"weight_decay": 0.0}}  # AdamH has none: omitted means 0, not adamw's default
    cfg = from_dict(TrainConfig, data, where)
    return cfg.validate()


def load_train_config(path: str | Path) -> TrainConfig:
    return load_config(path, train_config_from_dict)


def naming_config(error: DelphiError, path: str | Path) -> DelphiError:
    """`error` with the config file's name in front when it names one of the config's keys (a check
    made after loading, e.g. the vocabulary against the token store) and not yet the file."""
    message = str(error)
    key = message.split(":", 1)[0].split(".", 1)[0].split("[", 1)[0]
    if message.startswith(str(path)) or key not in TrainConfig.__dataclass_fields__:
        return error
    return DelphiError(f"{path}: {message}")


def train_config_to_dict(cfg: TrainConfig) -> dict:
    """The config as plain data, for YAML and hashing; optim keys at their OPTIM_KEYS_ADDED value
    and top-level keys at their KEYS_ADDED value are left out, so an AdamW config on the default
    device is written byte for byte as before AdamH, `device` and `attention` existed."""
    data = to_dict(cfg)
    data = {k: v for k, v in data.items() if k not in KEYS_ADDED or v != KEYS_ADDED[k]}
    data["optim"] = {k: v for k, v in data["optim"].items() if k not in OPTIM_KEYS_ADDED or v != OPTIM_KEYS_ADDED[k]}
    data["data"] = {k: v for k, v in data["data"].items() if k not in DATA_KEYS_ADDED or v != DATA_KEYS_ADDED[k]}
    return data
