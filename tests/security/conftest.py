"""Fixtures for the security tests: a small PKI made with `cryptography` (a CA, the master's
certificate for 127.0.0.1 and localhost, a trainer's certificate, and a second CA that nobody
trusts), a token file, and a RecordIO dataset."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from helpers.datasets import numbered_records

TOKEN = "job-token-0123456789abcdef"
RECORDS = 40


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str
    rogue_cert: str  # signed by other_ca
    rogue_key: str
    other_client_cert: str  # a second trainer, signed by ca
    other_client_key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> str:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(path)


def _write_cert(path: Path, cert: x509.Certificate) -> str:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(  # a client of itself too: etcd's JSON gateway dials its own gRPC port
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    elif not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")

    def ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        return _cert(name, key, _name(name), key, ca=True), key

    def leaf(
        name: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], server: bool
    ) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(name, key, issuer[0].subject, issuer[1], server=server)
        return _write_cert(d / f"{name}.pem", cert), _write_key(d / f"{name}.key", key)

    root, other = ca("test-ca"), ca("other-ca")
    server_cert, server_key = leaf("master", root, server=True)
    client_cert, client_key = leaf("trainer-a", root, server=False)
    rogue_cert, rogue_key = leaf("rogue", other, server=False)
    other_client_cert, other_client_key = leaf("trainer-b", root, server=False)
    return Pki(
        ca=_write_cert(d / "ca.pem", root[0]),
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
        other_ca=_write_cert(d / "other-ca.pem", other[0]),
        rogue_cert=rogue_cert,
        rogue_key=rogue_key,
        other_client_cert=other_client_cert,
        other_client_key=other_client_key,
    )


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    return numbered_records(tmp_path / "train.rio", RECORDS)
