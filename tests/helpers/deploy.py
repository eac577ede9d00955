"""For the deployment tests: the repository's root, installing what a cluster test needs, and
a CA with a master certificate."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[2]


def ensure(script: str) -> None:
    """Run scripts/<script> (it installs Debian packages when missing); skip, naming its
    output, when it cannot."""
    proc = subprocess.run(
        ["sh", str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        pytest.skip(f"scripts/{script} failed: {(proc.stderr or proc.stdout).strip()[-800:]}")


def server_pki(d: Path, *names: str, ips: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """A CA and a master certificate for these DNS names and IP addresses: the paths of the
    CA, the certificate and its key (PEM) in `d`."""
    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        build("test ca", ca_key)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test ca")]))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        build(names[0] if names else ips[0], key)
        .issuer_name(ca.subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    (d / "master.pem").write_bytes(cert.public_bytes(pem))
    (d / "master.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(d / "ca.pem"), str(d / "master.pem"), str(d / "master.key")
