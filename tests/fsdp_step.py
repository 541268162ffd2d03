"""One GRPO step of each model named, on the rollouts beside it, as a rank under ``torchrun``:
``python -m torch.distributed.run --nproc-per-node 2 tests/fsdp_step.py OUT MODEL_DIR...``.

For each ``MODEL_DIR`` (holding ``rollouts.parquet``), the trainer's own :class:`Learner` wraps
the model with FSDP and takes the step; rank 0 saves the gathered weights as the trainer
publishes them, in ``OUT/<dir name>``. :func:`grpo_step` is the same step in one process. Each rank
writes the names of the threads it still runs at its last exit handler to ``OUT/threads-<rank>.txt``."""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import torch

from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.rollout_file import read_rollouts
from intellect_protocol.trainer.data import Batch, Group
from intellect_protocol.trainer.distributed import Placement, full_state_dict, placement
from intellect_protocol.trainer.learner import Learner
from intellect_protocol.trainer.settings import TrainerSettings


def grpo_step(model_dir: Path, where: Placement) -> Learner:
    """The trainer's step on ``model_dir``'s rollouts, with each group given a reward spread
    (random weights earn none)."""
    rollouts = read_rollouts((model_dir / "rollouts.parquet").read_bytes())
    for i, r in enumerate(rollouts):
        r.reward = r.task_reward = float(i % 2)
    prompts = sorted({r.prompt_id for r in rollouts})
    groups = [Group(("task", p), [r for r in rollouts if r.prompt_id == p]) for p in prompts]
    model, _ = load_model(model_dir)
    learner = Learner(model, TrainerSettings(micro_batch=2), 1.0, where)
    learner.step(Batch(groups=groups), 0)
    return learner


def _write_threads(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tasks = Path("/proc/self/task")
    path.write_text("\n".join(sorted((tasks / tid / "comm").read_text().strip() for tid in os.listdir(tasks))))


def main(out: Path, model_dirs: list[Path]) -> None:
    torch.set_num_threads(1)
    # Registered before the process group's teardown, so it runs after it.
    atexit.register(_write_threads, out / f"threads-{os.environ['RANK']}.txt")
    where = placement()
    for model_dir in model_dirs:
        learner = grpo_step(model_dir, where)
        gathered = full_state_dict(learner.module, where)
        if gathered is not None:
            learner.model.save_pretrained(out / model_dir.name, state_dict=gathered)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
