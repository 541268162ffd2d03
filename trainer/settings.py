"""Trainer settings: ``INTELLECT_TRAINER_*`` env vars or ``intellect-trainer.toml``, below CLI flags.

Defaults follow INTELLECT-2 where it states one; learning rate and batch sizes suit the tiny model on CPU.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from intellect_protocol.shared.settings import RoleSettings
from intellect_protocol.trainer.loss import LossSettings


class TrainerSettings(RoleSettings):
    model_config = SettingsConfigDict(env_prefix="INTELLECT_TRAINER_", toml_file="intellect-trainer.toml", extra="ignore")

    loss: LossSettings = LossSettings()
    """Clipping, entropy, KL and normaliser coefficients."""
    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate after warmup."""
    warmup_steps: int = Field(2, ge=0)
    """Optimizer steps of linear warmup."""
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient-norm clipping."""
    optimizer_steps: int = Field(2, ge=1)
    """Optimizer steps per policy version (each over the whole batch)."""
    micro_batch: int = Field(16, ge=1)
    """Sequences per forward and backward pass; a step's gradients accumulate over them, which
    bounds activation memory, and a stop request is honoured between them."""
    groups_per_step: int = Field(16, ge=1)
    """Prompt groups (all samples of one prompt in one task) with a learning signal per policy version."""
    pass_rate_min: float = Field(0.0, ge=0, le=1)
    """Offline filter: train on prompts whose dataset pass rate is at least this (INTELLECT-2: 0.1), when one is given."""
    pass_rate_max: float = Field(1.0, ge=0, le=1)
    """... and at most this (INTELLECT-2: 0.8)."""
    online_filter: bool = True
    """Online filter (INTELLECT-2): leave out groups whose task rewards do not vary, so every group in
    a batch carries a learning signal; off, such groups fill the batch with zero advantage."""
    threads: int | None = Field(None, ge=1)
    """Torch threads of the update (None: torch's default, every core). The devnet gives its trainer
    one, since all its roles share one machine."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (real models on GPU)."""
    accepted_wait_s: float = Field(2.0, gt=0, le=10)
    """Longest wait of one request for accepted rollouts when there are not enough yet: the
    coordinator answers the moment some are accepted (a long poll), so no step waits for a poll."""
    chunk_size: int = Field(32 << 20, ge=4096)
    """Shardcast chunk size of published steps."""
    island_vouch_wait_s: float = Field(600.0, gt=0)
    """How long an island chosen to publish a step waits for most live islands to vouch for it (they build the
    step's files after the meeting; one that died counts as live for the coordinator's island lease) before it
    gives the step up, and the next meeting's publisher publishes the following one."""
    island_catch_up_s: float = Field(600.0, gt=0)
    """An island behind the run's published step waits this long for a live island to recover it from
    (the others meet once per outer step) before it gives up."""
