"""Wallets: standard encrypted Ethereum keystores (v3 JSON), read and written with eth-account.

The password never travels as a flag: it comes from ``INTELLECT_WALLET_PASSWORD`` or an
interactive prompt. Every failure surfaces as :class:`WalletError` with a one-line message
meant for the operator.
"""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import is_address, to_checksum_address

PASSWORD_ENV = "INTELLECT_WALLET_PASSWORD"


class WalletError(Exception):
    """A wallet could not be created or opened; the message is one sentence for the operator."""


def read_password(*, confirm: bool = False) -> str:
    """The wallet password from the environment, else from an interactive prompt."""
    password = os.environ.get(PASSWORD_ENV)
    if password is not None:
        return password
    try:
        password = getpass.getpass("Wallet password: ")
        if confirm and getpass.getpass("Repeat the password: ") != password:
            raise WalletError("The two passwords differ.")
    except EOFError:
        raise WalletError(f"No password: set {PASSWORD_ENV} or run in a terminal.") from None
    return password


SCRYPT_N = 2**18
"""Key stretching of an operator's wallet (eth-account's default): about 0.75 s of CPU to unlock."""
THROWAWAY_SCRYPT_N = 2**14
"""Key stretching of the devnet's and the tests' throwaway wallets, whose password sits in the
environment anyway: 40 ms to unlock, paid by every role at every start, instead of 0.75 s."""


def create_wallet(path: Path, password: str, *, scrypt_n: int = SCRYPT_N) -> str:
    """Write a new keystore to ``path`` (never overwriting) and return its address. ``scrypt_n``:
    the scrypt cost an attacker holding the file pays per password guess."""
    if path.exists():
        raise WalletError(f"{path} already exists; choose another --out or remove it first.")
    if not password:
        raise WalletError("Refusing an empty password.")
    account = Account.create()
    keystore = Account.encrypt(account.key, password, kdf="scrypt", iterations=scrypt_n)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(keystore, f)
    address: str = account.address
    return address


def _read_keystore(path: Path) -> dict[str, Any]:
    try:
        keystore = json.loads(path.read_text())
    except FileNotFoundError:
        raise WalletError(f"No wallet at {path}.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WalletError(f"{path} is not a keystore file ({type(e).__name__}).") from None
    if not isinstance(keystore, dict) or not isinstance(keystore.get("crypto") or keystore.get("Crypto"), dict):
        raise WalletError(f"{path} is not a v3 keystore file (no 'crypto' section).")
    return keystore


def wallet_address(path: Path) -> str:
    """The address a keystore declares, read without the password."""
    address = _read_keystore(path).get("address")
    if not isinstance(address, str) or not is_address(address if address.startswith("0x") else "0x" + address):
        raise WalletError(f"{path} does not record an address; open it with its password instead.")
    return to_checksum_address(address if address.startswith("0x") else "0x" + address)


def load_wallet(path: Path, password: str) -> LocalAccount:
    """Decrypt a keystore into a signing account."""
    keystore = _read_keystore(path)
    try:
        key = Account.decrypt(keystore, password)
    except ValueError as e:
        if "MAC mismatch" in str(e):
            raise WalletError(f"Wrong password for {path}.") from None
        raise WalletError(f"{path} is not a valid keystore ({e}).") from None
    except (KeyError, TypeError) as e:
        raise WalletError(f"{path} is not a valid keystore (missing or malformed {e}).") from None
    account: LocalAccount = Account.from_key(key)
    return account
