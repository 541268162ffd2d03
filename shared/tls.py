"""TLS for every client of ours: which certificate authorities a process trusts, and one sentence
for a certificate it refuses.

Trust is process-wide: the operating system's certificate store (through ``truststore``, as pip does:
a company's or a distribution's own authorities are trusted without configuration), certifi's bundle
of public authorities for machines whose store is empty, and, for a deployment with a private
authority, one more CA file named by ``--ca-file`` (:func:`trust`) or ``INTELLECT_CA_FILE``. Every HTTPS connection we open (the coordinator client, shardcast
downloads, the devnet's polling) takes its context from :func:`client_context`, so a certificate is
verified the same way everywhere and a refusal reads the same everywhere (:func:`untrusted`).
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from pathlib import Path

import certifi
import httpx
import truststore

CA_FILE_ENV = "INTELLECT_CA_FILE"

_lock = threading.Lock()
_contexts: dict[str, ssl.SSLContext] = {}


class TlsError(ValueError):
    """A CA file that cannot be used; the message says why."""


class Untrusted(Exception):
    """TLS with the coordinator failed (a certificate we do not trust, a server that does not speak
    TLS): resending cannot help, and no caller can do better than stop and say so, which the
    commands' entry point does (:func:`shared.cli.entry_point`): so it is no :class:`ProtocolError`."""


def trust(ca_file: Path) -> None:
    """Trust ``ca_file`` (PEM certificates) beside the public authorities, in this process and the
    processes it starts (through ``INTELLECT_CA_FILE``); :class:`TlsError` if it cannot be used."""
    _load(str(ca_file))  # refuse a bad file now, with a sentence, not at the first connection
    os.environ[CA_FILE_ENV] = str(ca_file.resolve())


def client_context(ca_file: Path | None = None) -> ssl.SSLContext:
    """The context every HTTPS client of ours verifies with: the system's store and the public authorities plus ``ca_file``
    (default: ``INTELLECT_CA_FILE``'s). One per CA file, shared: building one costs about 25 ms of CPU."""
    name = str(ca_file) if ca_file is not None else os.environ.get(CA_FILE_ENV, "")
    with _lock:
        if name not in _contexts:
            _contexts[name] = _load(name)
        return _contexts[name]


def _load(ca_file: str) -> ssl.SSLContext:
    context = truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=certifi.where())
    if ca_file:
        try:
            context.load_verify_locations(cafile=ca_file)
        except FileNotFoundError:
            raise TlsError(f"The CA file {ca_file} does not exist.") from None
        except (ssl.SSLError, ValueError) as e:
            raise TlsError(f"The CA file {ca_file} holds no PEM certificate ({getattr(e, 'reason', None) or e}).") from None
        except OSError as e:
            raise TlsError(f"The CA file {ca_file} cannot be read: {e.strerror}.") from None
    return context


_UNKNOWN_ISSUER = (
    f"if the server uses a private certificate authority, pass its certificate with --ca-file (or {CA_FILE_ENV}); "
    "otherwise check the URL"
)
_ADVICE = {
    10: "its operator must renew it (or this machine's clock is wrong)",  # X509_V_ERR_CERT_HAS_EXPIRED
    9: "it is not valid yet: check this machine's clock",  # X509_V_ERR_CERT_NOT_YET_VALID
    62: "it was made for another host: check the URL",  # X509_V_ERR_HOSTNAME_MISMATCH
    64: "it was made for another address: check the URL",  # X509_V_ERR_IP_ADDRESS_MISMATCH
}
"""What to do, by OpenSSL's verification error code; anything else is most likely an issuer this
process does not know."""


def untrusted(error: BaseException, url: str) -> str | None:
    """One sentence when ``error`` (or what caused it) is a TLS failure talking to ``url``: a
    certificate we do not trust, or a server that does not speak TLS; None for anything else."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError):
            reason = (cause.verify_message or cause.reason or str(cause)).rstrip(".")
            return f"The certificate of {url} is not trusted ({reason}): {_ADVICE.get(cause.verify_code, _UNKNOWN_ISSUER)}."
        if isinstance(cause, ssl.SSLError):
            if "WRONG_VERSION_NUMBER" in str(cause) or "record layer failure" in str(cause):
                return f"{url} does not speak TLS: try http:// instead of https://."
            return f"TLS with {url} failed ({cause.reason or cause}); check the URL and the server's certificate."
        cause = cause.__cause__ or cause.__context__
    return None


def speaks_tls(url: str, timeout_s: float = 3.0) -> bool:
    """Whether the server at ``url``'s host and port completes a TLS handshake (its certificate unchecked: this
    only tells a plain http:// client that it knocked at an HTTPS server)."""
    parsed = httpx.URL(url)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection((parsed.host, parsed.port or 80), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=parsed.host),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


def server_tls(cert: Path | None, key: Path | None) -> dict[str, str]:
    """uvicorn's options to serve HTTPS with ``cert`` and ``key`` (empty for plain HTTP), once the
    pair is known to load; :class:`TlsError` saying what is wrong otherwise."""
    if cert is None and key is None:
        return {}
    if cert is None or key is None:
        raise TlsError("--tls-cert and --tls-key go together: give both (HTTPS) or neither (plain HTTP).")
    for path in (cert, key):
        if not path.is_file():
            raise TlsError(f"{path} does not exist.")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise TlsError(f"{cert} and {key} are not a PEM certificate and its private key ({reason}).") from None
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
