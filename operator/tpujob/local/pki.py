"""Certificates and kubeconfigs for the local cluster.

A small certificate authority (ECDSA P-256) signs the apiserver's serving certificate and one
client certificate per identity: the admin (group `system:masters`), the scheduler and the
controller-manager (their built-in RBAC users) and the apiserver's own client for the node
agent's log endpoint. The service-account signing key is separate, as in any cluster. Files
that already exist are reused, so a cluster brought down and up again keeps its identity.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=3650)


@dataclass(frozen=True)
class Identity:
    """A client identity: the file stem, the user name (CN) and its groups (O)."""

    stem: str
    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("admin", "tpujob-admin", ("system:masters",))
SCHEDULER = Identity("scheduler", "system:kube-scheduler")
CONTROLLER_MANAGER = Identity("controller-manager", "system:kube-controller-manager")
APISERVER_KUBELET_CLIENT = Identity(
    "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path} does not hold an ECDSA key")
    return key


class CertificateAuthority:
    """The cluster CA; creates its key and certificate in `directory` on first use."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.cert_path = directory / "ca.crt"
        key_path = directory / "ca.key"
        if self.cert_path.exists() and key_path.exists():
            self._key = _load_key(key_path)
            self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            return
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpujob-local-ca")])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        _write_key(key_path, self._key)
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        groups: tuple[str, ...] = (),
        dns_names: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
    ) -> tuple[Path, Path]:
        """Issue (or reuse) `stem.crt` / `stem.key`; returns their paths."""
        cert_path = self.directory / f"{stem}.crt"
        key_path = self.directory / f"{stem}.key"
        if cert_path.exists() and key_path.exists():
            return cert_path, key_path
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if dns_names or ips:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert_path, key_path

    def issue_client(self, identity: Identity) -> tuple[Path, Path]:
        return self.issue(identity.stem, identity.user, groups=identity.groups)


def ensure_service_account_keys(directory: Path) -> tuple[Path, Path]:
    """The key pair the apiserver signs service-account tokens with."""
    key_path, pub_path = directory / "sa.key", directory / "sa.pub"
    if not (key_path.exists() and pub_path.exists()):
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(key_path, key)
        pub_path.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return key_path, pub_path


def write_kubeconfig(
    path: Path, *, server: str, ca_path: Path, cert_path: Path, key_path: Path, user: str
) -> Path:
    """A kubeconfig with the certificates embedded, so it works from any directory."""
    import base64

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tpujob-local",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_path)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(cert_path),
                    "client-key-data": b64(key_path),
                },
            }
        ],
        "contexts": [
            {"name": "tpujob-local", "context": {"cluster": "tpujob-local", "user": user}}
        ],
        "current-context": "tpujob-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
