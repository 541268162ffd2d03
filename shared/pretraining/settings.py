"""How a pretraining run's islands learn from its shards (:mod:`shared.pretraining.learning` takes the steps): one setting for
the single-process trainer, the islands and the validators that replay an island's inner steps. Free of torch, so
the coordinator can hold a run's settings."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

TOLERANCE = 0.02
"""The default largest relative error (``|sent - replayed| / |replayed|``) an audit's replay passes: the bf16 a
pseudo-gradient travels in costs about 0.2 % on the example, and learning one shard other than the one reported 25 %.
Other engines and dtypes need their own, calibrated as rollouts' tolerances are."""


class PretrainSettings(BaseModel):
    """How a model learns from shards (a run setting of a pretraining run)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    batch_rows: int = Field(16, ge=1, le=4096)
    """Rows of the corpus' ``seq_len`` tokens an inner step learns from."""
    lr: float = Field(3e-3, gt=0, le=1)
    """AdamW's learning rate, constant."""
    weight_decay: float = Field(0.01, ge=0, le=1)
    """AdamW's decoupled weight decay."""
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    """Each inner step's gradient is clipped to this norm."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """With the epoch, orders each shard's rows."""
    epochs: int = Field(1, ge=1, le=1000)
    """Passes over every training shard."""
    fresh_inner: bool = True
    """An island's inner AdamW starts afresh at every outer step, so an outer step is a function of what the run
    publishes (the agreed weights, the slots, these settings) and an audit can replay it
    (:mod:`shared.pretraining.audit`). Measured on the example (``bench/pretrain.py --compare-reset``): by outer step,
    as low a held-out loss as state carried across outer steps, or lower."""
    audit_rate: float = Field(0.1, ge=0, le=1)
    """Share of the pseudo-gradients published steps averaged that validators replay (:mod:`shared.pretraining.audit`),
    drawn after the step is published, so an island cannot know which of its outer steps will be replayed."""
    audit_votes: int = Field(1, ge=1, le=15)
    """Validators' verdicts an audit waits for at least: then all passing pass it, and otherwise it waits until one
    side holds a majority of at least two (one validator alone never convicts an island). More where validators are
    strangers: with one, the validator drawn for an audit passes it alone."""
    audit_second_opinion: float = Field(0.2, ge=0, le=1)
    """Share of audits that a lone passing verdict would decide which wait for a second validator's replay, drawn after
    the verdict: a validator colluding with an island is caught passing its lies at this rate (outvoted and struck)."""
    audit_replay_s: float = Field(900.0, gt=0, le=7 * 86400)
    """How long the validator drawn for an audit has to replay and judge it before another is drawn in its place: an
    outer step's compute on the validator's machine, and then some."""
    audit_tolerance: float = Field(TOLERANCE, gt=0, le=1)
    """Largest relative error between what an island sent and its replayed outer step that passes."""

    @model_validator(mode="after")
    def _replayable(self) -> PretrainSettings:
        if self.audit_rate > 0 and not self.fresh_inner:
            raise ValueError("audits replay outer steps from what the run publishes: they need fresh_inner (or audit_rate 0)")
        return self
