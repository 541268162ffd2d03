"""Faults during a devnet run (short version of bench/chaos.py): roles SIGKILLed at chosen moments
and restarted, a node's clock jumping past the signature window, one after another; the run still
reaches its step, and the audit finds nothing lost, nothing counted twice, every submission
finished and the ledger consistent. The trainer, SIGKILLed mid-step and restarted from its
checkpoint, trained each step once on a contiguous range of accepted work of its own (:func:`devnet.chaos.audit`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from intellect_protocol.devnet.chaos import CHAOS_COORDINATOR_ENV, FAULTS, audit, drain, published, wait_until
from intellect_protocol.devnet.network import start_network

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-b")]

RUN = ["--prompts-per-task", "4", "--samples-per-prompt", "4", "--max-tokens", "48"]


@pytest.mark.timeout(900)
def test_the_network_recovers_from_kills_and_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(7)
    # bench/chaos.py also runs the relay killed mid-broadcast, the coordinator killed, the slow relay and the lost
    # blob store. Here they cost a policy step of the e2e stage each, and each has a test of its own beside it: a
    # relay killed mid-download (tests/test_shardcast.py), a node riding out a coordinator restart
    # (tests/test_node_work.py), the S3 outage (tests/test_s3_blobs.py), the picker preferring fast relays.
    faults = ["trainer-step", "node-generation", "validator-batch", "clock-skew"]
    target = 2  # the trainer's fault waits for step 1 to kill the trainer mid-step 2, and recovers at step 2
    # The trainer trains until stopped: a run whose trainer is done hands out no more work (nothing
    # would read it), and the faults after it need work flowing.
    net = start_network(tmp_path, nodes=1, run_options=RUN, steps=0, coordinator_env=CHAOS_COORDINATOR_ENV)
    try:
        recoveries = [FAULTS[name](net, rng) for name in faults]
        wait_until(lambda: published(net) >= target, 600, f"policy step {target}")
        trainer_code = net.by_name("trainer").stop()  # SIGTERM, mid-step or not: its checkpoint stays consistent
        drain(net)
    finally:
        codes = net.stop()
    for r in recoveries:
        assert r.recovered, f"{r.fault}: no progress within {r.recover_s:.0f} s{r.detail}"
    result = audit(net)
    assert result.policy_step >= target
    assert trainer_code == 0, net.by_name("trainer").tail(60)
    assert (result.lost, result.duplicates, result.unfinished, result.ledger_errors) == (0, 0, 0, [])
    assert codes["trainer"] == 0, codes
