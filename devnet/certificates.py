"""A local certificate authority for ``intellect-devnet --tls``: one CA, and a server certificate
per process that serves (coordinator, origin, relay), so every role runs over HTTPS as it would in
production and every client verifies what it is shown.

Keys are ECDSA P-256 (fast to make, accepted by every TLS stack we use). Files are PEM; the
private keys are written readable by the owner only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServerFiles:
    """A server's certificate and key, and the CA that signed them (what its clients trust)."""

    cert: Path
    key: Path
    ca: Path

    @property
    def args(self) -> list[str]:
        """The flags that make a server of ours present them."""
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]


@dataclass(frozen=True)
class Authority:
    """A CA whose certificate is ``cert`` (what clients trust: ``--ca-file``) and key ``key``."""

    cert: Path
    key: Path

    @classmethod
    def create(cls, directory: Path, name: str = "Intellect devnet CA") -> Authority:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        authority = cls(directory / "ca.pem", directory / "ca-key.pem")
        _write(authority.cert, cert.public_bytes(serialization.Encoding.PEM))
        _write_key(authority.key, key)
        return authority

    def issue(
        self,
        directory: Path,
        name: str,
        hosts: tuple[str, ...] = LOOPBACK_NAMES,
        *,
        valid_from: dt.datetime | None = None,
        valid_for: dt.timedelta = dt.timedelta(days=30),
    ) -> ServerFiles:
        """A server certificate for ``hosts`` (names or IP addresses) signed by this CA, as NAME.pem
        and NAME-key.pem in ``directory``; ``valid_from``/``valid_for`` make expired ones for tests."""
        ca_cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
        ca_key = serialization.load_pem_private_key(self.key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{self.key} is not an ECDSA key")
        key = ec.generate_private_key(ec.SECP256R1())
        start = valid_from or _now() - dt.timedelta(minutes=5)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + valid_for)
            .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        files = ServerFiles(directory / f"{name}.pem", directory / f"{name}-key.pem", self.cert)
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM))
        _write_key(files.key, key)
        return files


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
