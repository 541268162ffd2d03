"""HTTPS as in production: a coordinator presenting a certificate of a private authority is reached
by clients that trust that authority (``--ca-file``), and every other certificate (unknown issuer,
expired, made for another host) or a server without TLS is refused at once with one sentence,
never retried, never a traceback. The whole network over HTTPS runs in the devnet test (``--tls``)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from eth_account import Account

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.certificates import Authority, ServerFiles
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.tls import CA_FILE_ENV, TlsError, Untrusted, client_context, server_tls, trust
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from tests.conftest import Served, serve


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority.create(tmp_path_factory.mktemp("ca"))


def _served(sqlite_url: str, tmp_path: Path, tls: ServerFiles | None) -> Iterator[Served]:
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")
    with serve(settings, tls) as served:
        yield served


@pytest.fixture
def https(sqlite_url: str, tmp_path: Path, authority: Authority) -> Iterator[Served]:
    yield from _served(sqlite_url, tmp_path, authority.issue(tmp_path, "coordinator"))


def _node(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["intellect-node", *args], capture_output=True, text=True, timeout=timeout)


def _receipts(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    wallet = tmp_path / "wallet.json"
    if not wallet.exists():
        create_wallet(wallet, "test-password", scrypt_n=THROWAWAY_SCRYPT_N)
    return _node("receipts", "--wallet", str(wallet), "--coordinator", url, *extra)


def _one_sentence(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_client_that_trusts_the_authority_speaks_https(
    https: Served, authority: Authority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert httpx.get(f"{https.url}/healthz", verify=client_context(authority.cert)).is_success
    monkeypatch.setenv(CA_FILE_ENV, str(authority.cert))
    with CoordinatorClient(https.url, Account.create()) as api:
        assert api.public_status().audience == https.audience  # signed requests fetch the audience first
    listed = _receipts(tmp_path, https.url, "--ca-file", str(authority.cert))
    assert listed.returncode == 0, listed.stderr
    assert "Receipts of" in listed.stdout
    checked = _node("check", "--coordinator", https.url, "--ca-file", str(authority.cert), "--state-dir", str(tmp_path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Ready to join" in checked.stdout


def test_an_unknown_authority_is_refused_at_once_with_one_sentence(https: Served, tmp_path: Path) -> None:
    started = time.monotonic()
    refused = _receipts(tmp_path, https.url)
    assert refused.returncode == 6
    sentence = _one_sentence(refused)
    assert f"The certificate of {https.url} is not trusted" in sentence and "--ca-file" in sentence, sentence
    assert "local issuer" in sentence or "self-signed" in sentence, sentence
    # Not retried: a client that retried would wait out the one-shot commands' 30 s.
    assert time.monotonic() - started < 25
    with pytest.raises(Untrusted), CoordinatorClient(https.url, give_up_s=None) as api:
        api.public_status()
    checked = _node("check", "--coordinator", https.url, "--state-dir", str(tmp_path))
    assert checked.returncode == 1 and "is not trusted" in checked.stderr and "Traceback" not in checked.stderr


def test_an_authority_in_the_system_store_is_trusted_without_a_ca_file(
    https: Served, authority: Authority, tmp_path: Path
) -> None:
    # SSL_CERT_FILE stands for the operating system's store here (OpenSSL reads it in place of the
    # distribution's bundle): an authority a company installs system-wide needs no --ca-file.
    system = subprocess.run(
        ["intellect-node", "check", "--coordinator", https.url, "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SSL_CERT_FILE": str(authority.cert)},
    )
    assert system.returncode == 0, system.stdout + system.stderr
    assert "Ready to join" in system.stdout


def test_join_stops_with_exit_code_6_instead_of_retrying(https: Served, tmp_path: Path) -> None:
    wallet = tmp_path / "node.json"
    create_wallet(wallet, "test-password", scrypt_n=THROWAWAY_SCRYPT_N)
    args = ["join", "--wallet", str(wallet), "--coordinator", https.url, "--state-dir", str(tmp_path / "state")]
    joined = _node(*args, timeout=90)
    assert joined.returncode == 6, joined.stdout + joined.stderr
    assert "is not trusted" in _one_sentence(joined)


@pytest.mark.parametrize(
    ("certificate", "reason"),
    [
        ("expired", "certificate has expired): its operator must renew it"),
        ("another host", "made for another address: check the URL"),
    ],
)
def test_a_wrong_certificate_of_a_trusted_authority_is_refused(
    certificate: str, reason: str, sqlite_url: str, tmp_path: Path, authority: Authority
) -> None:
    if certificate == "expired":
        files = authority.issue(
            tmp_path, "old", valid_from=dt.datetime.now(dt.UTC) - dt.timedelta(days=10), valid_for=dt.timedelta(days=1)
        )
    else:
        files = authority.issue(tmp_path, "elsewhere", ("coordinator.example",))
    for served in _served(sqlite_url, tmp_path, files):
        refused = _receipts(tmp_path, served.url, "--ca-file", str(authority.cert))
        assert refused.returncode == 6
        sentence = _one_sentence(refused)
        assert "is not trusted" in sentence and reason in sentence, sentence


def test_https_to_a_plain_http_server_says_so(sqlite_url: str, tmp_path: Path) -> None:
    for served in _served(sqlite_url, tmp_path, None):
        url = served.url.replace("http://", "https://")
        refused = _receipts(tmp_path, url)
        assert refused.returncode == 6
        assert "does not speak TLS: try http://" in _one_sentence(refused)


def test_http_to_a_tls_coordinator_says_try_https(https: Served, tmp_path: Path) -> None:
    """A TLS server hangs up on plain HTTP: join retried forever and check said "Server disconnected"."""
    url = https.url.replace("https://", "http://")
    wallet = tmp_path / "node.json"
    create_wallet(wallet, "test-password", scrypt_n=THROWAWAY_SCRYPT_N)
    joined = _node("join", "--wallet", str(wallet), "--coordinator", url, "--state-dir", str(tmp_path / "state"), timeout=90)
    assert joined.returncode == 6, joined.stdout + joined.stderr
    assert f"{url} speaks TLS: try https://" in _one_sentence(joined)
    checked = _node("check", "--coordinator", url, "--state-dir", str(tmp_path / "state"), timeout=90)
    assert checked.returncode == 1 and "speaks TLS: try https://" in " ".join(checked.stderr.split()), checked.stderr


def test_a_ca_file_that_cannot_be_used_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "empty.pem").write_text("not a certificate\n")
    for path, why in [(tmp_path / "missing.pem", "does not exist"), (tmp_path / "empty.pem", "holds no PEM certificate")]:
        with pytest.raises(TlsError, match=why):
            trust(path)
        refused = _node("receipts", "--wallet", str(tmp_path / "w.json"), "--ca-file", str(path))
        assert refused.returncode == 2 and why in refused.stderr and "Traceback" not in refused.stderr


def test_serve_refuses_a_certificate_without_its_key(tmp_path: Path, authority: Authority) -> None:
    files = authority.issue(tmp_path, "coordinator")
    other = authority.issue(tmp_path, "other")
    with pytest.raises(TlsError, match="go together"):
        server_tls(files.cert, None)
    with pytest.raises(TlsError, match="not a PEM certificate and its private key"):
        server_tls(files.cert, other.key)
    database = f"sqlite:///{tmp_path / 'ledger.db'}"
    for args, why in [
        (["--tls-cert", str(files.cert)], "go together"),
        (["--tls-cert", str(files.cert), "--tls-key", str(other.key)], "not a PEM certificate and its private key"),
    ]:
        result = subprocess.run(
            ["intellect-coordinator", "serve", "--database-url", database, "--port", "1", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2 and why in result.stderr and "Traceback" not in result.stderr, result.stderr
