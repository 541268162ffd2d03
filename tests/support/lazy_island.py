"""A lazy pretraining island: it claims and reports whole shards and learns one batch of rows of each.

Run as a script, it is ``intellect-trainer`` with every pretraining island lazy: an island of several ranks runs
under ``torchrun``, one process a rank, where no test can hand it a class.
"""

from __future__ import annotations

import torch

from intellect_protocol.shared.pretraining.manifest import ShardRef
from intellect_protocol.trainer import pretrain_island
from intellect_protocol.trainer.pretrain_island import PretrainIsland


class LazyIsland(PretrainIsland):
    """Claims and reports whole shards, learns one batch of rows of each."""

    def fetch(self, ref: ShardRef) -> torch.Tensor:
        rows = super().fetch(ref)
        return rows[: self.pretrain.batch_rows] if ref in self.corpus.shards else rows


if __name__ == "__main__":
    from intellect_protocol.trainer.cli import app

    pretrain_island.PretrainIsland = LazyIsland  # type: ignore[misc]  # read by the trainer CLI when it runs
    app()
