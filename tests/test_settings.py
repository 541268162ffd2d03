"""Settings precedence: constructor (CLI flags) over INTELLECT_* env vars over the TOML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from intellect_protocol.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.unit


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "intellect-coordinator.toml").write_text("heartbeat_interval_s = 3.5\nrate_limit_burst = 7\n")
    assert CoordinatorSettings().heartbeat_interval_s == 3.5
    monkeypatch.setenv("INTELLECT_HEARTBEAT_INTERVAL_S", "2")
    assert CoordinatorSettings().heartbeat_interval_s == 2
    assert CoordinatorSettings(heartbeat_interval_s=1).heartbeat_interval_s == 1
    assert CoordinatorSettings().limits.rate_limit_burst == 7


# Every variable a grouped setting had as a flat one: (variable, value, where it lands, what it reads as).
GROUPED = [
    ("INTELLECT_RATE_LIMIT_BURST", "9", lambda s: s.limits.rate_limit_burst, 9),
    ("INTELLECT_MAX_HEADER_BYTES", "8192", lambda s: s.limits.header_limits.max_bytes, 8192),  # read through its view
    ("INTELLECT_S3_BUCKET", "rollouts", lambda s: s.s3.bucket, "rollouts"),
    ("INTELLECT_S3_ENDPOINT_URL", "http://127.0.0.1:9000", lambda s: s.s3.endpoint_url, "http://127.0.0.1:9000"),
    ("INTELLECT_VALIDATOR_LIVE_S", "7", lambda s: s.committee.validator_live_s, 7.0),
    ("INTELLECT_APPEALS_PER_DAY", "5", lambda s: s.committee.appeals_per_day, 5),
    ("INTELLECT_BACKLOG_FLOOR", "4", lambda s: s.admission.backlog_floor, 4),
    ("INTELLECT_TRAINER_LIVE_S", "30", lambda s: s.admission.trainer_live_s, 30.0),
    ("INTELLECT_CHAIN_CONFIRMATIONS", "6", lambda s: s.chain.confirmations, 6),
    ("INTELLECT_EPOCH_S", "60", lambda s: s.chain.epoch_s, 60.0),
]


@pytest.mark.parametrize(("variable", "value", "read", "expected"), GROUPED, ids=[g[0] for g in GROUPED])
def test_grouped_settings_keep_their_variables_and_their_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, read, expected
) -> None:
    monkeypatch.chdir(tmp_path)
    flat = variable.removeprefix("INTELLECT_").lower()
    (tmp_path / "intellect-coordinator.toml").write_text(f"{flat} = {value if value.isdigit() else repr(value)}\n")
    assert read(CoordinatorSettings()) == expected  # from the TOML file, by its flat key
    assert read(CoordinatorSettings(**{flat: value})) == expected  # a flag, by its flat keyword
    other = str(int(value) * 2) if value.isdigit() else "elsewhere"
    monkeypatch.setenv(variable, other)
    assert read(CoordinatorSettings()) == type(expected)(other), "the variable beats the file"
    assert read(CoordinatorSettings(**{flat: value})) == expected, "a flag beats the variable"


def test_settlement_needs_every_contract_and_says_which_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_CHAIN_RPC_URL", "http://127.0.0.1:8545")
    monkeypatch.setenv("INTELLECT_CHAIN_TOKEN", "0x" + "11" * 20)
    with pytest.raises(ValueError, match="INTELLECT_CHAIN_STAKE_REGISTRY, INTELLECT_CHAIN_DISTRIBUTOR, INTELLECT_CHAIN_KEYSTORE"):
        CoordinatorSettings()
    with pytest.raises(ValueError, match="does not settle on a chain"):
        CoordinatorSettings(chain_rpc_url=None).chain.deployed()


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_HEARTBEAT_INTERVAL_S", "-1")
    with pytest.raises(ValueError):
        CoordinatorSettings()


def test_a_copy_takes_grouped_settings_by_their_flat_names_and_leaves_the_original_alone() -> None:
    original = CoordinatorSettings()
    update = {"validator_max_strikes": 1, "chain_from_block": 7, "epoch_s": 5.0, "heartbeat_interval_s": 2.0}
    copy = original.model_copy(update=update)
    assert (copy.committee.validator_max_strikes, copy.chain.from_block, copy.chain.epoch_s, copy.heartbeat_interval_s) == (
        1,
        7,
        5.0,
        2.0,
    )
    assert (original.committee.validator_max_strikes, original.chain.from_block, original.chain.epoch_s) == (3, 0, 3600.0)
