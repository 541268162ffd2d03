"""Trainer islands' outer steps on torchft, as separate processes meeting through a real lighthouse over
Gloo: the agreed weights are what one process computes from the same pseudo-gradients, alone or as FSDP
ranks, and a faulty island is left out (an island killed and rejoining: ``test_island_trainer``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from intellect_protocol.shared.island_schemas import OuterSettings
from intellect_protocol.trainer.islands import TAG_BYTES, judge, outer_optimizer
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


def replay(pseudo_by_step: list[list[torch.Tensor]], initial: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The outer steps one process takes from the same bf16 pseudo-gradients: summed as the all-reduce
    sums them, averaged, and applied by Nesterov SGD to the fp32 agreed weights (``initial``, by default
    the initial model's)."""
    agreed = [p.detach().clone() for p in (initial or list(initial_model().parameters()))]
    outer = outer_optimizer(agreed, SETTINGS)
    for sent in pseudo_by_step:
        average = (sum(sent[1:], sent[0])).float() / len(sent)
        offset = 0
        for a in agreed:
            a.grad = average[offset : offset + a.numel()].view_as(a)
            offset += a.numel()
        outer.step()
    return agreed


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.unit
def test_judging_leaves_out_what_is_not_finite_or_far_beyond_its_peers() -> None:
    assert judge([1.0, 1.2], 10) == ([0, 1], {})
    included, excluded = judge([1.0, float("inf"), 0.9], 10)
    assert included == [0, 2] and "not finite" in excluded[1]
    included, excluded = judge([1.0, 150.0], 10)  # two islands: each is judged against the other
    assert included == [0] and "150x" in excluded[1]
    assert judge([0.0, 2.0], 10) == ([1], {})  # an island with nothing to add is neither averaged nor blamed
    assert judge([3.0], 10) == ([0], {})  # alone, nothing to compare with


@pytest.mark.unit
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, (4, 1.0, 0.0)),  # few inner steps: plain averaging (momentum at H = 1 overshot and lost 26 points)
        ({"sync_every": 1}, (1, 1.0, 0.0)),
        ({"sync_every": 49}, (49, 1.0, 0.0)),
        ({"sync_every": 50}, (50, 0.7, 0.9)),  # DiLoCo's outer optimizer, for the H it was tuned for
        ({"sync_every": 500, "outer_momentum": 0.5}, (500, 0.7, 0.5)),
        ({"sync_every": 1, "outer_lr": 0.7, "outer_momentum": 0.9}, (1, 0.7, 0.9)),  # a run may still ask for it
    ],
)
def test_the_outer_optimizer_defaults_to_what_learns_at_the_runs_h(given: dict[str, float], expected: tuple[float, ...]) -> None:
    outer = OuterSettings.model_validate(given)
    assert (outer.sync_every, outer.outer_lr, outer.outer_momentum) == expected


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
        if k in (1, 2):
            assert names == ["a"] and set(outcome.excluded) == {"b"}
            assert ("not finite" if k == 1 else "its peers' median") in outcome.excluded["b"]
        else:
            assert sorted(names) == ["a", "b"] and outcome.excluded == {}
        sent.append([{"a": ra, "b": rb}[n]["pseudo"][k] for n in sorted(names)])
    assert same(ra["agreed"][-1], rb["agreed"][-1])
    assert same(ra["agreed"][-1], replay(sent))
    # On the wire: 2 bytes a parameter, and each island's name, attempt and norm.
    assert ra["outcomes"][0].sent_bytes == 2 * sum(p.numel() for p in initial_model().parameters()) + 2 * (1 + TAG_BYTES) * 8


@pytest.mark.e2e
@pytest.mark.xdist_group("e2e-a")  # four processes under torchrun: with the other real-engine tests
def test_islands_of_two_fsdp_ranks_each_agree_on_what_one_process_computes(lighthouse, tmp_path: Path) -> None:
    address = lighthouse(2)
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent.parent), "OMP_NUM_THREADS": "1"}
    islands = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER), name, address]
            + [str(tmp_path), "3"],
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
    [expected] = replay(sent, [initial])
    assert torch.equal(whole("a", "agreed", 2), expected) and torch.equal(whole("b", "agreed", 2), expected)
