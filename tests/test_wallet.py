"""Wallets: v3 keystores, passwords from the environment, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from eth_account import Account

from intellect_protocol.shared.wallet import (
    SCRYPT_N,
    THROWAWAY_SCRYPT_N,
    WalletError,
    create_wallet,
    load_wallet,
    wallet_address,
)


def test_create_and_load(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    address = create_wallet(path, "s3cret")
    keystore = json.loads(path.read_text())
    assert keystore["version"] == 3 and "crypto" in keystore
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert load_wallet(path, "s3cret").address == address == wallet_address(path)
    # Standard format: eth-account alone opens it.
    assert Account.from_key(Account.decrypt(keystore, "s3cret")).address == address
    # An operator's wallet is stretched as eth-account's default; a throwaway one less, and it opens alike.
    assert keystore["crypto"]["kdfparams"]["n"] == SCRYPT_N == 2**18
    light = tmp_path / "light.json"
    address = create_wallet(light, "s3cret", scrypt_n=THROWAWAY_SCRYPT_N)
    assert json.loads(light.read_text())["crypto"]["kdfparams"]["n"] == THROWAWAY_SCRYPT_N < SCRYPT_N
    assert load_wallet(light, "s3cret").address == address


def test_refusals(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    create_wallet(path, "s3cret")
    with pytest.raises(WalletError, match="already exists"):
        create_wallet(path, "other")
    with pytest.raises(WalletError, match="Wrong password"):
        load_wallet(path, "nope")
    with pytest.raises(WalletError, match="No wallet"):
        load_wallet(tmp_path / "missing.json", "s3cret")
    with pytest.raises(WalletError, match="empty password"):
        create_wallet(tmp_path / "e.json", "")
    for content in ("not json", "[]", json.dumps({"version": 3}), json.dumps({"crypto": {"cipher": "x"}, "address": "zz"})):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(WalletError):
            load_wallet(bad, "s3cret")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(WalletError):
        wallet_address(tmp_path / "bin.json")


def _cli(*args: str, password: str | None = "pw") -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"]}
    if password is not None:
        env["INTELLECT_WALLET_PASSWORD"] = password
    return subprocess.run(["intellect-node", "wallet", *args], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)


def test_cli_new_and_show(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    created = _cli("new", "--out", str(path))
    assert created.returncode == 0, created.stderr
    shown = _cli("show", str(path), password=None)
    assert shown.returncode == 0
    assert shown.stdout.strip() in created.stdout
    assert load_wallet(path, "pw").address == shown.stdout.strip()


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    path.write_text("{corrupt")
    for result in (_cli("show", str(path)), _cli("new", "--out", str(path)), _cli("show", str(tmp_path / "none.json"))):
        assert result.returncode == 1
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr
    no_password = _cli("new", "--out", str(tmp_path / "n.json"), password=None)
    assert no_password.returncode == 1 and "INTELLECT_WALLET_PASSWORD" in no_password.stderr
