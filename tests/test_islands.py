"""Trainer islands' outer steps on torchft, as separate processes meeting through a real lighthouse over
Gloo: the agreed weights are what one process computes from the same pseudo-gradients, alone or as FSDP
ranks, and a faulty island is left out (an island killed and rejoining: ``test_island_trainer``)."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from intellect_protocol.shared.island_schemas import OuterSettings
from intellect_protocol.trainer.islands import TAG_BYTES
from intellect_protocol.trainer.robust_average import outer_optimizer, pairwise_dots, robust_average
from tests.island_worker import SETTINGS, initial_model

WORKER = Path(__file__).with_name("island_worker.py")


@pytest.fixture
def lighthouse():
    from torchft._torchft import LighthouseServer

    servers = []

    def start(min_replicas: int) -> str:
        server = LighthouseServer(bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=500, heartbeat_timeout_ms=1500)
        servers.append(server)
        return server.address().replace(server.address().split("//")[1].split(":")[0], "127.0.0.1")

    yield start
    for server in servers:
        server.shutdown()


def island(name: str, address: str, out: Path, steps: int, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent.parent)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), name, address, str(out), str(steps), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(out / f"{name}.log", "ab"),  # noqa: SIM115  (the child owns it)
    )


def finished(*islands: subprocess.Popen[bytes], timeout: float = 120) -> None:
    for p in islands:
        assert p.wait(timeout) == 0


def record(out: Path, name: str) -> dict:
    return torch.load(out / f"{name}.pt", weights_only=False)


def replay(
    pseudo_by_step: list[list[torch.Tensor]], initial: list[torch.Tensor] | None = None, shards: list[int] | None = None
) -> list[torch.Tensor]:
    """The outer steps one process takes from the same bf16 pseudo-gradients (those of the islands present, in
    the quorum's order), judged and averaged as the islands do, with each island's norm summed over ``shards``
    (lengths, when the islands are FSDP ranks) as its ranks sum it. From the initial model's weights by default."""
    agreed = [p.detach().clone() for p in (initial or list(initial_model().parameters()))]
    outer = outer_optimizer(agreed, SETTINGS)
    for sent in pseudo_by_step:
        matrix = torch.stack(sent).float()
        parts = matrix.split(shards or [matrix.shape[1]], dim=1)
        dots = sum((pairwise_dots(part.contiguous()) for part in parts[1:]), pairwise_dots(parts[0].contiguous()))
        norms = [math.sqrt(x) for x in dots.diagonal().tolist()]
        average, _, _ = robust_average(matrix, norms, SETTINGS.outlier_ratio, dots)
        assert average is not None
        offset = 0
        for a in agreed:
            a.grad = average[offset : offset + a.numel()].view_as(a)
            offset += a.numel()
        outer.step()
    return agreed


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.unit
def test_the_average_judges_what_was_sent_and_one_liar_of_three_cannot_move_it() -> None:
    torch.manual_seed(0)
    honest = torch.randn(2, 1000) + 1.0  # two honest islands that broadly agree
    norms = lambda sent: [float(n) for n in pairwise_dots(sent).diagonal().sqrt()]  # noqa: E731

    def average(sent: torch.Tensor) -> tuple[torch.Tensor, list[int], dict[int, str]]:
        result, included, excluded = robust_average(sent, norms(sent), 10)
        assert result is not None
        return result, included, excluded

    # The honest values, and zero: clipping to the median norm may shrink an honest step, never grow or turn it.
    low, high = honest.min(0).values.clamp(max=0), honest.max(0).values.clamp(min=0)
    lies = {
        "sign-flipped at 1.2x": -1.2 * honest[0],
        "noise at 200x": 200 * honest[0].norm() * torch.randn(1000) / 1000**0.5,
        "near zero": 1e-9 * honest[0],
    }
    for what, lie in lies.items():
        result, included, excluded = average(torch.stack([honest[0], honest[1], lie]))
        # Coordinate by coordinate, the step lies within what the honest islands sent.
        assert bool(((result >= low - 1e-6) & (result <= high + 1e-6)).all()), what
        assert 0 in included and 1 in included, what  # a liar never has an honest island left out
        assert set(excluded) <= {2}, what
    # Two islands: the liar can cancel the honest step, never reverse or blow it up; a tiny one excludes no one.
    for lie in (-1.2 * honest[0], -0.8 * honest[0], 200 * honest[0], 1e-9 * honest[0]):
        result, included, excluded = average(torch.stack([honest[0], lie]))
        assert float(result @ honest[0]) >= -1e-3 * float(honest[0] @ honest[0]) and excluded == {}
        assert float(result.norm()) <= float(honest[0].norm()) + 1e-4
    # What is not finite, or far beyond the upper median of what was measured, is named and left out.
    broken = torch.stack([honest[0], honest[1], torch.full((1000,), float("nan"))])
    assert "not finite" in average(broken)[2][2]
    huge = torch.stack([honest[0], honest[1], 1e4 * honest[0]])
    _, included, excluded = average(huge)
    assert included == [0, 1] and "x the median" in excluded[2]
    # An island with nothing to add is neither averaged nor blamed; no one sound: no step.
    assert average(torch.stack([honest[0], torch.zeros(1000)]))[1:] == ([0], {})
    assert robust_average(torch.zeros(2, 10), [0.0, 0.0], 10) == (None, [], {})


@pytest.mark.unit
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, (4, 1.0, 0.0, False)),  # few inner steps: plain averaging (momentum at H = 1 overshot and lost 26 points)
        ({"sync_every": 1}, (1, 1.0, 0.0, False)),
        ({"sync_every": 49}, (49, 1.0, 0.0, False)),
        ({"sync_every": 50}, (50, 0.7, 0.9, True)),  # DiLoCo's outer optimizer, for the H it was tuned for
        ({"sync_every": 500, "outer_momentum": 0.5}, (500, 0.7, 0.5, True)),
        ({"sync_every": 1, "outer_lr": 0.7, "outer_momentum": 0.9}, (1, 0.7, 0.9, False)),  # a run may still ask for it
        ({"sync_every": 100, "screen_directions": False}, (100, 0.7, 0.9, False)),
    ],
)
def test_the_outer_optimizer_defaults_to_what_learns_at_the_runs_h(given: dict[str, float], expected: tuple[float, ...]) -> None:
    outer = OuterSettings.model_validate(given)
    assert (outer.sync_every, outer.outer_lr, outer.outer_momentum, outer.screen_directions) == expected


@pytest.mark.unit
def test_a_pseudo_gradient_against_every_other_one_is_left_out_when_the_rest_agree() -> None:
    torch.manual_seed(0)
    honest = torch.randn(2, 1000) + 1.0  # two honest islands that broadly agree
    flip = torch.stack([honest[0], honest[1], -1.2 * honest[0]])
    norms = [float(n) for n in pairwise_dots(flip).diagonal().sqrt()]
    screened, included, excluded = robust_average(flip, norms, 10, screen=True)
    assert included == [0, 1] and list(excluded) == [2] and "points against every other" in excluded[2]
    bound = sorted(norms)[1]
    assert screened is not None and torch.allclose(
        screened, (honest * (bound / torch.tensor(norms[:2])).clamp(max=1)[:, None]).mean(0)
    )
    # Unscreened, the median keeps the liar from reversing the step, but leaves a smaller one.
    median, included, excluded = robust_average(flip, norms, 10)
    assert median is not None and included == [0, 1, 2] and excluded == {}
    assert float(median @ honest.mean(0)) < 0.8 * float(screened @ honest.mean(0))
    # Honest islands that point against each other (few inner steps) give a liar that sides with one of them the
    # choice of whom the screen leaves out: why it is off by default below DiLoCo's H.
    disagree = torch.stack([honest[0], -honest[0] + 0.5 * torch.randn(1000), -honest[0]])
    norms = [float(n) for n in pairwise_dots(disagree).diagonal().sqrt()]
    assert list(robust_average(disagree, norms, 10, screen=True)[2]) == [0]
    # Just under every threshold: against one honest island, barely with the other (a cosine of 1e-3), at 9.9x the
    # median norm. Nobody is left out; clipped, then the median, it stays within what the honest islands sent.
    h0, h1 = honest[0], honest[1]
    sly = -h0 + (float(h0 @ h1) + 1e-3 * float(h0.norm() * h1.norm())) / float(h1 @ h1) * h1
    sent = torch.stack([h0, h1, sly * 9.9 * float(h0.norm()) / float(sly.norm())])
    norms = [float(n) for n in pairwise_dots(sent).diagonal().sqrt()]
    result, included, excluded = robust_average(sent, norms, 10, screen=True)
    low, high = honest.min(0).values.clamp(max=0), honest.max(0).values.clamp(min=0)
    assert result is not None and included == [0, 1, 2] and excluded == {}
    assert bool(((result >= low - 1e-6) & (result <= high + 1e-6)).all()) and float(result @ honest.mean(0)) > 0
    # Noise against no one, or one that agrees with one island and not another: screened, still no one left out.
    for third in (torch.randn(1000), honest[1] - honest[0]):
        sent = torch.stack([honest[0], honest[1], third * honest[0].norm() / third.norm()])
        norms = [float(n) for n in pairwise_dots(sent).diagonal().sqrt()]
        assert robust_average(sent, norms, 10, screen=True)[2] == {}


@pytest.mark.integration
def test_two_islands_agree_on_the_outer_steps_one_process_computes_leaving_out_a_faulty_one(lighthouse, tmp_path: Path) -> None:
    address = lighthouse(2)
    # b's weights before meetings 1 and 2: not finite, then 1e4 times too big; meetings 0 and 3 are sound.
    a, b = island("a", address, tmp_path, 4), island("b", address, tmp_path, 4, "--fault", "nan@1", "huge@2")
    finished(a, b)
    ra, rb = record(tmp_path, "a"), record(tmp_path, "b")
    assert [o.step for o in ra["outcomes"]] == [0, 1, 2, 3] and all(o.committed for o in ra["outcomes"])
    assert [o.included for o in ra["outcomes"]] == [o.included for o in rb["outcomes"]]
    assert [o.leader for o in ra["outcomes"]] != [o.leader for o in rb["outcomes"]]  # one publisher per step
    sent = []
    for k, outcome in enumerate(ra["outcomes"]):
        names = [i.island for i in outcome.included]
        if k == 1:
            assert names == ["a"] and set(outcome.excluded) == {"b"} and "not finite" in outcome.excluded["b"]
        else:  # at 2, b's 1e4x weights are not left out but clipped to a's norm: with two, neither is the median
            assert sorted(names) == ["a", "b"] and outcome.excluded == {}
        sent.append([{"a": ra, "b": rb}[n]["pseudo"][k] for n in sorted(names)])
    assert same(ra["agreed"][-1], rb["agreed"][-1])
    assert same(ra["agreed"][-1], replay(sent))
    # On the wire: a slot of 2 bytes a parameter for each island, and each island's name and attempt.
    assert ra["outcomes"][0].sent_bytes == 2 * 2 * sum(p.numel() for p in initial_model().parameters()) + 2 * TAG_BYTES * 8


@pytest.mark.integration
def test_overlapped_meetings_agree_on_the_steps_one_process_computes_from_a_round_late_start(lighthouse, tmp_path: Path) -> None:
    """Streaming DiLoCo's overlap (``OuterSync.launch``): each meeting runs while the next round trains, which starts
    eagerly from the agreed weights it has minus the island's own pseudo-gradient as sent (its guess of the meeting's
    result); the agreed weights are still what one process computes from what was sent."""
    address = lighthouse(2)
    a, b = island("a", address, tmp_path, 4, "--overlap"), island("b", address, tmp_path, 4, "--overlap")
    finished(a, b)
    ra, rb = record(tmp_path, "a"), record(tmp_path, "b")
    assert [o.step for o in ra["outcomes"]] == [0, 1, 2, 3] and all(o.committed for o in ra["outcomes"])
    for r in (ra, rb):  # round k from meeting k - 2's agreed weights (the initial ones before) less its round k - 1
        assert same(r["start"][0], ra["initial"])
        for k in (1, 2, 3):
            before = ra["initial"] if k == 1 else ra["agreed"][k - 2]
            sent = r["pseudo"][k - 1].float().split([a.numel() for a in before])
            assert same(r["start"][k], [a - s.view_as(a) for a, s in zip(before, sent)])
    assert same(ra["agreed"][-1], rb["agreed"][-1])
    sent = [
        [{"a": ra, "b": rb}[i.island]["pseudo"][k] for i in sorted(o.included, key=lambda i: i.island)]
        for k, o in enumerate(ra["outcomes"])
    ]
    assert same(ra["agreed"][-1], replay(sent))


@pytest.mark.integration
def test_one_lying_island_of_three_cannot_steer_the_agreed_weights(lighthouse, tmp_path: Path) -> None:
    """Round four: islands reported their own norms, and nobody saw another's vector before the sum, so a
    sign-flipped update at its true norm, noise at 200x while claiming a normal norm, or a claimed norm of
    1e-9 (which had the honest island excluded) all got through. Now norms are measured on what was sent."""
    address = lighthouse(3)
    a, b = island("a", address, tmp_path, 4), island("b", address, tmp_path, 4)
    c = island("c", address, tmp_path, 4, "--fault", "flip@0", "noise@1", "tiny@2", "flip@3")
    finished(a, b, c)
    ra, rb, rc = (record(tmp_path, n) for n in "abc")
    assert all(o.committed for o in ra["outcomes"]) and [o.step for o in ra["outcomes"]] == [0, 1, 2, 3]
    for k, outcome in enumerate(ra["outcomes"]):
        # Nobody honest is ever left out, whatever the liar sends; every island took the same step.
        assert {"a", "b"} <= {i.island for i in outcome.included} and set(outcome.excluded) <= {"c"}
        assert [i.island for i in outcome.included] == [i.island for i in rc["outcomes"][k].included]
        honest = torch.stack([ra["pseudo"][k], rb["pseudo"][k]]).float()
        before = ra["initial"] if k == 0 else ra["agreed"][k - 1]
        step = torch.cat([(x - y).flatten() for x, y in zip(before, ra["agreed"][k])])
        if k == 0:  # Nesterov's first step is lr x (1 + momentum) x the average
            average = step / (SETTINGS.outer_lr * (1 + SETTINGS.outer_momentum))
            low, high = honest.min(0).values.clamp(max=0), honest.max(0).values.clamp(min=0)
            assert bool(((average >= low - 1e-5) & (average <= high + 1e-5)).all())
    for other in (rb, rc):
        assert same(ra["agreed"][-1], other["agreed"][-1])
    sent = [[r["pseudo"][k] for r in (ra, rb, rc)] for k in range(4)]
    assert same(ra["agreed"][-1], replay(sent))


@pytest.mark.integration
def test_a_recovering_island_refuses_a_state_the_run_did_not_agree_on(lighthouse, tmp_path: Path) -> None:
    """torchft has a behind island recover the state of whichever peer claims the highest step: a liar claiming
    the next step with weights of its own had every honest island take them. Now the island asks whether the
    state is the run's agreed one (the trainer asks the coordinator) and, refused, sits the meeting out."""
    address = lighthouse(3)
    a, b = (island(n, address, tmp_path, 4, "--refuse-heals") for n in "ab")
    c = island("c", address, tmp_path, 4, "--fault", "ahead@1")  # for its second meeting only
    finished(a, b, c)
    ra, rb = record(tmp_path, "a"), record(tmp_path, "b")
    for name in "ab":
        assert "not the run's agreed state: it sits this meeting out at step 1" in (tmp_path / f"{name}.log").read_text()
    # The meeting of the lie took no step for them; the next ones, the liar honest again, did.
    assert [(o.step, o.committed) for o in ra["outcomes"]] == [(0, True), (1, False), (1, True), (2, True), (3, True)]
    assert [(o.step, o.committed) for o in rb["outcomes"]] == [(o.step, o.committed) for o in ra["outcomes"]]
    assert same(ra["agreed"][1], ra["agreed"][0])
    for k in range(5):
        assert same(ra["agreed"][k], rb["agreed"][k])
    # The liar's weights (1,000x the agreed) never became theirs.
    largest = max(float(t.abs().max()) for t in ra["agreed"][-1])
    assert largest < 10 * max(float(t.abs().max()) for t in ra["initial"])


@pytest.mark.e2e
@pytest.mark.xdist_group("e2e-a")  # four processes under torchrun: with the other real-engine tests
def test_islands_of_two_fsdp_ranks_each_agree_on_what_one_process_computes(lighthouse, tmp_path: Path) -> None:
    address = lighthouse(2)
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent.parent), "OMP_NUM_THREADS": "1"}
    islands = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER), name, address]
            + [str(tmp_path), "3", "--keep-sent"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"{name}.log", "ab"),  # noqa: SIM115  (the child owns it)
        )
        for name in ("a", "b")
    ]
    finished(*islands, timeout=180)
    ranks = {name: [record(tmp_path, f"{name}-{r}") for r in (0, 1)] for name in ("a", "b")}

    def whole(name: str, key: str, k: int) -> torch.Tensor:
        """An island's ``key`` at meeting ``k``, its two ranks' shards end to end."""
        return torch.cat([torch.cat([t.flatten() for t in ([r[key][k]] if key == "pseudo" else r[key][k])]) for r in ranks[name]])

    outcomes = ranks["a"][0]["outcomes"]
    assert [o.step for o in outcomes] == [0, 1, 2] and all(sorted(i.island for i in o.included) == ["a", "b"] for o in outcomes)
    # Each rank met the same rank of the other island: the same decisions on both, one publisher per step.
    names = [[i.island for i in o.included] for o in outcomes]
    assert [[i.island for i in o.included] for o in ranks["a"][1]["outcomes"]] == names
    assert [o.leader for o in outcomes] != [o.leader for o in ranks["b"][0]["outcomes"]]
    initial = torch.cat([torch.cat([t.flatten() for t in r["initial"]]) for r in ranks["a"]])
    sent = [[whole("a", "pseudo", k), whole("b", "pseudo", k)] for k in range(3)]
    [expected] = replay(sent, [initial], shards=[len(r["pseudo"][0]) for r in ranks["a"]])
    assert torch.equal(whole("a", "agreed", 2), expected) and torch.equal(whole("b", "agreed", 2), expected)
    # As in an audited run, every rank records each included pseudo-gradient's sha256 over it whole, as one process
    # holds it (the shards end to end, less the flat parameter's padding), and the first rank keeps it for audits.
    size = sum(p.numel() for p in initial_model().parameters())
    for k, outcome in enumerate(outcomes):
        digests = {i.island: i.digest for i in outcome.included}
        assert digests == {i.island: i.digest for i in ranks["a"][1]["outcomes"][k].included}
        for name, pseudo in zip(("a", "b"), sent[k], strict=True):
            assert digests[name] == hashlib.sha256(pseudo[:size].view(torch.int16).numpy().data).hexdigest()
    kept = ranks["a"][0]["kept"]
    assert kept and ranks["a"][1]["kept"] == {}
    assert all(hashlib.sha256(t.view(torch.int16).numpy().data).hexdigest() == d and t.numel() == size for d, t in kept.items())
