"""DiLoCo outer steps among trainer islands, on PyTorch's torchft: the quorum (through a lighthouse),
the fault-tolerant all-reduce over Gloo, and recovery of a joining island's state from a live peer.

Each island trains on its own data for ``sync_every`` inner steps, then every island in the quorum
meets: it sends its pseudo-gradient (the weights the islands last agreed on minus its own) in bf16, each
into its own slot of one all-reduce, so every island receives every pseudo-gradient exactly as sent. Each
then computes the same robust average (:func:`trainer.robust_average.robust_average`) and the outer Nesterov SGD steps the agreed
weights (kept in fp32) by it. Every island then starts its next inner steps from the new agreed weights.
The outer step's number is torchft's step; committed, its agreed weights are policy step ``step + 1``, which
every island vouches for and one publishes (:mod:`coordinator.services.step_vouches`).

Nothing an island says about its own pseudo-gradient is believed: norms are measured on what it sent. One
that is not finite, or whose norm exceeds ``outlier_ratio`` times the upper median of the measured norms, is
left out and named; the rest are clipped to the lower median norm. With three islands or more and the run's
``screen_directions`` (on from DiLoCo's H), one whose pseudo-gradient points against every other one's is left out
and named too, when the others are a majority that all point the same way (:func:`~trainer.robust_average.against_the_rest`): a
sign-flipped island then costs the honest islands nothing. The average is the mean of what is left if it is two,
else the coordinate-wise median, which one liar among three cannot move beyond the honest islands' values.
With two, it is the mean of the two clipped ones: a lying island can cancel the honest one's step (stall the
run) but not reverse or blow it up. One of norm 0 (an island that just recovered, or had nothing to learn
from) adds nothing. The price is bandwidth: each island receives all the pseudo-gradients, not their sum.

With the run's ``overlap`` (:meth:`OuterSync.launch`, Streaming DiLoCo's overlap a whole round deep), a meeting runs
on a thread of its own while the next round's inner steps run, so a link slower than a round's compute costs no
waiting; the price is a round that starts from the agreed weights one outer step older.

An island may itself be FSDP ranks under ``torchrun`` (every island the same number): each rank meets
the same rank of the other islands with its own shard of the pseudo-gradients and agreed weights, norms
are the whole island's (summed over its ranks), and a recovering rank takes its shard from the same rank of
a peer. The island's ranks share torchrun's store.

Recovery is not trust: torchft hands a behind island the state of the peer that claims the highest step. The
island asks ``check_heal`` whether what it received is the run's agreed state; if not, it puts its own state
back (its step too) and sits the meeting out: torchft counts a recovering island out of the meeting's
all-reduce, so it sends nothing, and it commits nothing. A peer that keeps claiming a step ahead with weights
nobody agreed on stalls the islands behind it; it cannot move them.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch
from torch.distributed import ReduceOp, TCPStore

from intellect_protocol.shared.island_schemas import Included, OuterSettings
from intellect_protocol.trainer.distributed import gathered_whole, placement, trained_names
from intellect_protocol.trainer.robust_average import outer_optimizer, pairwise_dots, robust_average


class _NoFlightRecorderNotice(logging.Filter):
    """Drops torchft's notice, at every meeting, that NCCL's flight recorder cannot be reset: islands meet over
    Gloo, where there is no flight recorder, and operators read the line as an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "NCCL flight recorder" not in record.getMessage()


logging.getLogger("torchft.manager").addFilter(_NoFlightRecorderNotice())

log = logging.getLogger("intellect.trainer.islands")
M = TypeVar("M", bound=torch.nn.Module)


WIRE = torch.bfloat16
"""The pseudo-gradient's dtype on the wire (OpenDiLoCo: halving it loses nothing)."""
TAG_BYTES = 64 + 32
"""An island's name and its attempt, padded, as each island tells the others who it is."""


@dataclass(frozen=True)
class OuterStep:
    """What one meeting of the islands decided, the same on every island."""

    step: int
    """The outer step taken (or tried): committed, it is published as policy step ``step + 1``."""
    committed: bool
    included: list[Included]
    excluded: dict[str, str] = field(default_factory=dict)
    publisher: str = ""
    """The island chosen to publish the step: the participants take turns (participant ``step mod n``), so a
    lying one chosen cannot stall the run for more than a step (the step after a lost one is published)."""
    leader: bool = False
    """This island is the publisher (its rank 0 publishes)."""
    participants: int = 1
    sent_bytes: int = 0
    """Bytes this island put on the all-reduce for it."""

    def settled(self) -> dict[str, Any]:
        """What settling it sends (:class:`~shared.island_schemas.IslandSettle`'s own fields)."""
        return {"outer_step": self.step, "included": self.included, "excluded": self.excluded}


class OuterSync:
    """The outer half of DiLoCo for one island: call :meth:`sync` every ``sync_every`` inner steps."""

    def __init__(
        self,
        model: torch.nn.Module,
        island: str,
        lighthouse: str,
        settings: OuterSettings,
        step: int = 0,
        host: str = "127.0.0.1",
        timeout_s: float = 60.0,
        rank: int = 0,
        world_size: int = 1,
        check_heal: Callable[[], bool] | None = None,
        keep_sent: bool = False,
    ) -> None:
        """``model`` holds the agreed weights of policy step ``step`` (this island's latest; an FSDP module
        on ``world_size`` ranks, this one ``rank``). ``host`` is where peers reach this island (its
        recovery server and, alone, its store). ``check_heal()``, called on every rank once a peer's state
        is in the model (at :attr:`step`), says whether it is the run's agreed state; without it every peer is
        believed. ``keep_sent`` (an audited run): every included pseudo-gradient's sha256 goes in the step's record,
        and the last committed steps' are kept (:attr:`sent`) for audits to upload, whole, as one process holds them
        (an island of several ranks gathers them on its first rank, which alone keeps them)."""
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        self.model, self.island, self.settings = model, island, settings
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.agreed = [p.detach().to(torch.float32, copy=True) for p in self.params]
        self.outer = outer_optimizer(self.agreed, settings)
        self.committed: list[OuterStep] = []
        """The last three committed steps: the publisher of one settles it and the one before, the earlier again in
        case its own publisher died before it could (three: overlapped, the next may commit meanwhile)."""
        self.world_size = world_size
        self.check_heal = check_heal
        self.keep_sent = keep_sent
        self.sent: dict[str, torch.Tensor] = {}
        self._names: tuple[list[str] | None] | None = None
        """By sha256, the bf16 pseudo-gradients the committed steps kept included, as received."""
        self.start: list[torch.Tensor] | None = None
        """Overlapped (:meth:`launch`): the weights this round's inner steps started from, no longer the agreed ones."""
        self._meeting: Future[OuterStep] | None = None
        self.eager: tuple[str, torch.Tensor] | None = None
        """Overlapped: the attempt and sent pseudo-gradient the round now running subtracted from its start."""
        self._meets = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"meet-{island}")
        self._own_manager = {"step": step, "batches_committed": 0}
        self._sitting_out: str | None = None
        timeout = timedelta(seconds=timeout_s)
        if world_size == 1:
            self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
            store_host, store_port = host, self._store.port
        else:
            store_host, store_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=self._healed,
            state_dict=self.state_dict,
            min_replica_size=1,
            use_async_quorum=False,
            replica_id=island,
            store_addr=store_host,
            store_port=store_port,
            hostname=host,
            rank=rank,
            world_size=world_size,
            lighthouse_addr=lighthouse,
            timeout=timeout,
            quorum_timeout=timeout,
            connect_timeout=timeout,
            # Islands start from the same published step: recovering at step 0 would only throw away
            # one island's first inner steps.
            init_sync=False,
        )
        self.manager.load_state_dict({"step": step, "batches_committed": 0})

    @property
    def step(self) -> int:
        """The policy step of the agreed weights."""
        return int(self.manager.current_step())

    def close(self) -> None:
        self._meets.shutdown(wait=False, cancel_futures=True)
        self.manager.shutdown(wait=False)

    def state_dict(self) -> dict[str, Any]:
        committed = [
            {"step": c.step, "included": [i.model_dump() for i in c.included], "excluded": c.excluded} for c in self.committed
        ]
        return {"agreed": self.agreed, "outer": self.outer.state_dict(), "committed": committed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A peer's state, as a recovering island receives it (or this island's own, saved): its weights
        become this island's, and its inner steps start from them."""
        with torch.no_grad():
            for mine, theirs in zip(self.agreed, state["agreed"]):
                mine.copy_(theirs)
        self.outer.load_state_dict(state["outer"])
        self.committed = [
            OuterStep(c["step"], True, [Included(**i) for i in c["included"]], c["excluded"]) for c in state["committed"]
        ]
        self._restart_inner()

    def _healed(self, state: dict[str, Any]) -> None:
        """A peer's state, received while torchft heals this island (its step already the peer's)."""
        if self.check_heal is None:
            self.load_state_dict(state)
            return
        own = copy.deepcopy(self.state_dict())
        self.load_state_dict(state)
        if self.check_heal():
            log.info("island %s: recovered policy step %d from a peer: the run's agreed state", self.island, self.step)
            return
        log.warning(
            "island %s: the state received for policy step %d is not the run's agreed state: it sits this meeting out at step %d",
            self.island,
            self.step,
            self._own_manager["step"],
        )
        self._sitting_out = f"refused the state a peer sent for policy step {self.step}"
        self.load_state_dict(own)
        self.manager.load_state_dict(self._own_manager)

    def _restart_inner(self) -> None:
        if self._meeting is not None and not self._meeting.done():
            return  # healed by a meeting in flight: the next launch restarts from its weights, on the training thread
        with torch.no_grad():
            for p, agreed in zip(self.params, self.agreed):
                p.copy_(agreed)
            for start, agreed in zip(self.start or [], self.agreed):
                start.copy_(agreed)

    def sync(self, attempt: str, contribute: bool = True) -> OuterStep:
        """Meet the quorum (recovering first if behind) and take outer step :attr:`step` with every sound
        pseudo-gradient; ``contribute=False`` joins without adding this island's. Blocks until done; the next inner
        steps start from the new agreed weights."""
        outcome = self._meet(attempt, contribute, self._pseudo())
        self._restart_inner()
        return outcome

    def launch(self, attempt: str, contribute: bool = True) -> None:
        """Streaming DiLoCo's overlap, a whole round deep, with an eager start: meet on a thread of its own while the
        next round's inner steps run. :meth:`wait` for the meeting launched a round ago first (on a fast enough link,
        it is done).

        It takes this round's pseudo-gradient against the weights the round started from and launches its meeting,
        which steps the agreed weights by the robust average. Not knowing that average yet, the next round starts
        from the agreed weights minus this island's own pseudo-gradient as sent: its best guess of the next agreed
        weights, and a function of what the run published and the island sent, so an audit replays it. The island
        sends the next round only if the run included this one (:meth:`started_from_record`). One rank only."""
        if self.world_size > 1:
            raise ValueError("overlapped outer steps need islands of one rank")
        if self.in_flight:
            raise RuntimeError("a meeting is in flight: wait() for it first")
        pseudo = self._pseudo()
        if self.start is None:
            self.start = [a.clone() for a in self.agreed]
        self._restart_inner()
        self.eager = (attempt, pseudo.to(WIRE)) if contribute else None
        if self.eager is not None:
            with torch.no_grad():
                for p, start, sent in zip(self.params, self.start, self._split(self.eager[1].float()), strict=True):
                    start.sub_(sent)
                    p.copy_(start)
        self._meeting = self._meets.submit(self._meet, attempt, contribute, pseudo)

    def started_from_record(self, landed: OuterStep | None) -> bool:
        """Whether the round now ending started from weights the run records: the agreed ones, or (eager) them minus
        this island's pseudo-gradient that ``landed``, the meeting just waited for, included."""
        if self.eager is None:
            return True
        attempt = self.eager[0]
        return (
            landed is not None
            and landed.committed
            and any(i.island == self.island and i.attempt == attempt for i in landed.included)
        )

    @property
    def start_digest(self) -> str | None:
        """sha256 of what the round now ending subtracted from the agreed weights to start from (None: nothing)."""
        return None if self.eager is None else _sha256(self.eager[1])

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` cut into the parameters' shapes."""
        return [part.view_as(p) for part, p in zip(flat.split([p.numel() for p in self.params]), self.params, strict=True)]

    def agreed_copy(self, model: M) -> M:
        """A copy of ``model`` (the one this island trains) holding the agreed weights."""
        agreed = copy.deepcopy(model)
        with torch.no_grad():
            for p, weights in zip([p for p in agreed.parameters() if p.requires_grad], self.agreed, strict=True):
                p.copy_(weights)
        return agreed

    @property
    def in_flight(self) -> bool:
        """A meeting launched by :meth:`launch` is not waited for yet."""
        return self._meeting is not None

    def wait(self) -> OuterStep | None:
        """The outcome of the meeting in flight once it is done (None if none is)."""
        meeting, self._meeting = self._meeting, None
        return None if meeting is None else meeting.result()

    def finish(self) -> OuterStep | None:
        """The end of overlapped rounds: the meeting in flight's outcome, its agreed weights in the model."""
        outcome, self.eager = self.wait(), None
        self._restart_inner()
        return outcome

    def _pseudo(self) -> torch.Tensor:
        """This island's pseudo-gradient (fp32, flat): the weights its inner steps started from minus its own."""
        with torch.no_grad():
            return torch.cat([(a - p.float()).flatten() for a, p in zip(self.start or self.agreed, self.params)])

    def _meet(self, attempt: str, contribute: bool, pseudo: torch.Tensor) -> OuterStep:
        self._own_manager, self._sitting_out = self.manager.state_dict(), None
        self.manager.start_quorum()  # recovers here from a peer when this island is behind (see _healed)
        contribute = contribute and self._sitting_out is None
        step, n, rank = self.manager.current_step(), self.manager.num_participants(), self.manager.participating_rank()
        tags = torch.zeros(n, TAG_BYTES, dtype=torch.float64)
        # Each participant writes only its own slot: the sum of the slots is every pseudo-gradient as sent.
        slots = torch.zeros(n, pseudo.numel(), dtype=WIRE)
        if rank is not None:
            tags[rank] = torch.tensor(list(f"{self.island:<64}{attempt:<32}".encode()), dtype=torch.float64)
            if contribute:
                slots[rank] = pseudo.to(WIRE)
        self.manager.allreduce(tags, reduce_op=ReduceOp.SUM).wait()
        self.manager.allreduce(slots, reduce_op=ReduceOp.SUM).wait()
        names = [bytes(int(b) for b in row.tolist()).decode() for row in tags]
        sent = slots.float()
        dots = pairwise_dots(sent)
        if self.world_size > 1:
            torch.distributed.all_reduce(dots)  # each island's whole pseudo-gradient, over this island's ranks
        norms = [math.sqrt(s) if math.isfinite(s) else float("inf") for s in dots.diagonal().tolist()]
        average, included, excluded = robust_average(
            sent, norms, self.settings.outlier_ratio, dots, self.settings.screen_directions
        )
        # Counted before judging: a liar left out must not stall the others' step by leaving them too few.
        senders = sum(n != 0 for n in norms)
        if average is None or senders < self.settings.min_islands:
            average = None  # no step: a lone island (a liar among them) must not move the run by itself
            self.manager.report_error(
                RuntimeError(f"{senders} islands sent a pseudo-gradient, the run takes a step from {self.settings.min_islands}")
            )
        if self._sitting_out is not None:  # after the all-reduces, which the others wait for
            self.manager.report_error(RuntimeError(self._sitting_out))
        committed = self.manager.should_commit()
        if committed and average is not None:
            for a, part in zip(self.agreed, self._split(average), strict=True):
                a.grad = part
            self.outer.step()
            self.outer.zero_grad(set_to_none=True)
        turn = step % n
        kept = self._whole(included, slots) if self.keep_sent else {}
        digests = {i: _sha256(t) for i, t in kept.items()}
        if self.keep_sent and self.world_size > 1:
            told = [digests]
            torch.distributed.broadcast_object_list(told, src=0)  # the step's record is the same on every rank
            digests = told[0]
        outcome = OuterStep(
            step=step,
            committed=committed,
            included=[
                Included(island=names[i][:64].rstrip(), attempt=names[i][64:].rstrip(), digest=digests.get(i)) for i in included
            ],
            excluded={names[i][:64].rstrip(): why for i, why in excluded.items()},
            publisher=names[turn][:64].rstrip(" \x00"),  # an unwritten slot (no participant) names no one
            leader=rank == turn,
            participants=n,
            sent_bytes=tags.numel() * tags.element_size() + slots.numel() * slots.element_size(),
        )
        if committed:
            self.committed = [*self.committed, outcome][-3:]
            still = {i.digest for c in self.committed for i in c.included}
            self.sent = {d: t for d, t in self.sent.items() if d in still} | {d: kept[i] for i, d in digests.items() if i in kept}
        return outcome

    def _whole(self, included: list[int], slots: torch.Tensor) -> dict[int, torch.Tensor]:
        """Each included pseudo-gradient whole, as a one-rank island receives it (bf16): an island of several ranks
        holds a part of each on every rank and gathers them on its first (the others keep none)."""
        if self.world_size == 1:
            return {i: slots[i] for i in included}
        if self._names is None:
            self._names = (trained_names(self.model),)  # once: the same every meeting (7B-32B configs: 0.04-0.6 s)
        where = placement()
        wholes = {i: gathered_whole(self.model, self.params, slots[i].float(), where, self._names[0]) for i in included}
        return {i: whole.to(WIRE) for i, whole in wholes.items() if whole is not None}


def _sha256(sent: torch.Tensor) -> str:
    """sha256 of a pseudo-gradient's bytes as it travels (bf16, little-endian as every machine that runs torch)."""
    return hashlib.sha256(sent.view(torch.int16).numpy().data).hexdigest()
