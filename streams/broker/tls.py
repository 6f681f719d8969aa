"""TLS of the local cluster (security_protocol SASL_SSL): a CA of its own and one certificate every node serves,
made at the first start under `<kafka dir>/tls/` and kept. Clients verify the nodes against `ca.pem` (hostname
checked: the certificate names 127.0.0.1, ::1, localhost and this host's name, the addresses nodes advertise).

Files: ca.pem (the CA's certificate, what clients trust), ca.key (0600, only to sign a new node certificate),
node.pem (0600: the node's PKCS#8 private key, unencrypted, then its certificate and the CA's, Kafka's PEM
keystore since 3.3). Everything is EC P-256: small keys, fast handshakes on a 2-core box.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from core.settings import Settings

VALID_DAYS = 825  # what browsers accept for a leaf; the CA lives ten years


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA certificate clients trust
    keystore: Path  # the node's key + certificate chain


def tls_dir(settings: Settings) -> Path:
    return settings.kafka_dir / "tls"


def ensure_tls(settings: Settings) -> TlsFiles:
    """The CA and the node certificate, made once (a certificate that no longer names this host is made anew)."""
    directory = tls_dir(settings)
    files = TlsFiles(directory / "ca.pem", directory / "node.pem")
    directory.mkdir(parents=True, exist_ok=True)
    if not files.ca.exists():
        ca_key = ec.generate_private_key(ec.SECP256R1())
        _write_private(directory / "ca.key", _pkcs8(ca_key))
        files.ca.write_bytes(_pem(_ca_certificate(ca_key)))
    names = _node_names(settings)
    if not files.keystore.exists() or _names_in(files.keystore) != names:
        ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
        node_key = ec.generate_private_key(ec.SECP256R1())
        certificate = _node_certificate(node_key, ca, ca_key, names)
        _write_private(files.keystore, _pkcs8(node_key) + _pem(certificate) + _pem(ca))
    return files


def local_cafile(settings: Settings) -> Path | None:
    """The CA a client of the local cluster trusts: set explicitly (ssl_cafile), else the project's own."""
    if settings.ssl_cafile is not None or settings.uses_external_kafka or not settings.uses_ssl:
        return settings.ssl_cafile
    return tls_dir(settings) / "ca.pem"


def _node_names(settings: Settings) -> list[str]:
    """The addresses a client may reach a node by: loopback, this host's name, and listen_host."""
    names = ["127.0.0.1", "::1", "localhost", socket.getfqdn()]
    if settings.listen_host not in ("", "0.0.0.0", "::") and settings.listen_host not in names:
        names.append(settings.listen_host)
    return names


def _alt_names(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _names_in(keystore: Path) -> list[str]:
    certificate = x509.load_pem_x509_certificates(keystore.read_bytes())[0]
    alt = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(entry.value) for entry in alt]


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flywheel local Kafka CA")])
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )


def _node_certificate(key, ca: x509.Certificate, ca_key, names: list[str]) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flywheel kafka node")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(_alt_names(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # a node is a TLS server to clients and a TLS client to the other nodes (inter-broker traffic)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )  # fmt: skip
        .sign(ca_key, hashes.SHA256())
    )


def _pkcs8(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(fd, 0o600)
        handle.write(data)
