"""The trainer's scale path: the same loop on one process (CPU or one GPU) or sharded over
several GPUs with FSDP under ``torchrun``.

One process (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``): the model is used as it is. Several:
``init_process_group`` (NCCL on GPUs, Gloo otherwise), one device per local rank, and each
decoder layer wrapped as an FSDP unit with full-state saving on rank 0 only, so the published
safetensors are the whole model. Only rank 0 talks to the coordinator and publishes.
"""

from __future__ import annotations

import atexit
import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    device: torch.device

    @property
    def leader(self) -> bool:
        return self.rank == 0


def placement() -> Placement:
    """This process's place, initialising the process group when launched by ``torchrun``."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        atexit.register(_tear_down)
    return Placement(dist.get_rank() if dist.is_initialized() else 0, world_size, device)


def _tear_down() -> None:
    """End the process group while the interpreter is whole. Gloo joins its threads only when the
    group object is freed, and every sharded module holds it, often in garbage cycles that only the
    interpreter's teardown would free. A thread still releasing a finished collective's tensors there
    needs the GIL, finds the interpreter gone and aborts the rank ("terminate called without an
    active exception"), after its work was done: so the cycles go first, then the group."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def shard(model: torch.nn.Module, where: Placement) -> torch.nn.Module:
    """``model`` on this process's device: as it is alone, FSDP-wrapped per decoder layer with others."""
    model = model.to(where.device)
    if where.world_size == 1:
        return model
    from functools import partial

    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    layer_types = {type(layer) for layer in getattr(getattr(model, "model", model), "layers", [])}
    precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if where.device.type == "cuda" else None
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_types),
        mixed_precision=precision,
        device_id=where.device,  # named even when it is the CPU, which FSDP otherwise refuses
    )


def clip_grad_norm(module: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the gradients to a global norm of ``max_norm``; returns the norm before clipping. A
    sharded module's norm is over every rank's shard, so every rank scales alike."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(module, FullyShardedDataParallel):
        return module.clip_grad_norm_(max_norm)
    return torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)


def full_state_dict(model: torch.nn.Module, where: Placement) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on the leader (None elsewhere), gathered from the shards if sharded."""
    if where.world_size == 1:
        return None  # the caller saves the unwrapped model directly
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

    # Offloading is for GPU shards; on the CPU it would free the very storage being gathered into.
    config = FullStateDictConfig(offload_to_cpu=where.device.type != "cpu", rank0_only=True)
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        state = model.state_dict()
    return state if where.leader else None


def gathered_whole(
    model: torch.nn.Module, params: Sequence[torch.Tensor], flat: torch.Tensor, where: Placement, names: list[str] | None
) -> torch.Tensor | None:
    """``flat`` (this rank's part of every one of ``params``, the sharded module's own, end to end: a pseudo-gradient
    as an island of several ranks holds it) as one process holds it: the parameters ``names`` lists
    (:func:`trained_names`; None: every entry of the full state), flat, in that order, on the leader (None elsewhere). Collective: every rank calls it
    alike. The parameters hold ``flat`` while their full state is gathered, then their own values again."""
    own = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.copy_(part.view_as(p))
        try:
            state = full_state_dict(model, where)
        finally:
            for p, value in zip(params, own, strict=True):
                p.copy_(value)
    return None if state is None else torch.cat([state[name].flatten() for name in names or state])


def trained_names(model: torch.nn.Module) -> list[str] | None:
    """The trained parameters' names in the order one process's ``parameters()`` gives them (a tied head once, under
    the embedding's name), read from a copy of the unwrapped model on the meta device: a sharded one holds flat
    parameters. None for a model without a transformers config: it ties no weights, so its full state's entries are
    its parameters, in order."""
    from transformers import AutoModelForCausalLM

    unwrapped = getattr(model, "module", model)
    if not hasattr(unwrapped, "config"):
        return None
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(unwrapped.config)
    return [name for name, p in meta.named_parameters() if p.requires_grad]
