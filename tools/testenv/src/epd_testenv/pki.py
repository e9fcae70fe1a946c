"""The certificates a local control plane needs, made fresh for every cluster with `cryptography`.

One small CA signs the apiserver's serving certificate and one client certificate per component, so RBAC sees
the same identities as in a real cluster (system:kube-controller-manager, system:kube-scheduler) and the admin
and kwok are system:masters. A separate key pair signs service-account tokens. ECDSA P-256 throughout: keys
are generated in microseconds, where RSA would add a second to every `cluster up`.
"""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
"""Long enough for any cluster lifetime; the files are regenerated at every `up` anyway."""

BACKDATE = datetime.timedelta(hours=1)
"""Certificates start an hour early so a small clock step never makes them not-yet-valid."""

SERVING_DNS_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
SERVING_IPS = ("127.0.0.1",)


FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class Identity:
    """A client certificate: Kubernetes reads the user from CN and the groups from O."""

    name: str
    """File stem, e.g. `admin` gives admin.crt and admin.key."""
    user: str
    groups: tuple[str, ...] = ()


CLIENTS = (
    Identity("admin", "epd-admin", ("system:masters",)),
    Identity("kube-controller-manager", "system:kube-controller-manager"),
    Identity("kube-scheduler", "system:kube-scheduler"),
    # kwok writes node and pod status for every simulated node; the Node authorizer would need one identity
    # per node, so it runs as a master like kwokctl does.
    Identity("kwok", "kwok", ("system:masters",)),
    # The apiserver's identity towards aggregated APIs. Giving the apiserver a request-header CA also fills
    # kube-system/extension-apiserver-authentication, which the controller-manager and scheduler read for
    # their own authentication; without it they log an error every few seconds.
    Identity(FRONT_PROXY_CLIENT, FRONT_PROXY_CLIENT),
)

REAL_NODE_NAME = "epd-real-node"
KUBELET_CLIENT = Identity("kube-apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",))
"""The apiserver's identity towards the kubelet (logs, exec, port-forward), as kubeadm names it."""
NODE_CLIENTS = (
    # The kubelet: the Node authorizer lets it write only its own node and its pods.
    Identity(REAL_NODE_NAME, f"system:node:{REAL_NODE_NAME}", ("system:nodes",)),
    # Bound to system:node-proxier by the apiserver's default RBAC.
    Identity("kube-proxy", "system:kube-proxy"),
    # CoreDNS reads Services, EndpointSlices, pods and namespaces: a master, like kwok, rather than RBAC
    # objects the harness would have to create before it starts.
    Identity("coredns", "epd-testenv:coredns", ("system:masters",)),
    KUBELET_CLIENT,
)
"""The real node's identities (realnode.py), made only for a cluster that has one."""


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files."""

    dir: pathlib.Path

    @property
    def ca_cert(self) -> pathlib.Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> pathlib.Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> pathlib.Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> pathlib.Path:
        return self.dir / "apiserver.key"

    @property
    def sa_public_key(self) -> pathlib.Path:
        return self.dir / "sa.pub"

    @property
    def sa_private_key(self) -> pathlib.Path:
        return self.dir / "sa.key"

    def client_cert(self, name: str) -> pathlib.Path:
        return self.dir / f"{name}.crt"

    def client_key(self, name: str) -> pathlib.Path:
        return self.dir / f"{name}.key"


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: pathlib.Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _write_cert(path: pathlib.Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
    )


def _leaf(
    builder: x509.CertificateBuilder, usage: x509.ObjectIdentifier, ca_key: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    return (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def generate(directory: pathlib.Path, *, extra_ips: tuple[str, ...] = (), real_node: bool = False) -> Pki:
    """Write a fresh CA, serving certificate, client certificates and service-account key pair.

    `extra_ips` join the serving certificate's addresses (with a real node: the bridge address and the
    `kubernetes` Service's ClusterIP, which in-cluster clients dial); `real_node` adds NODE_CLIENTS."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)

    ca_key = _new_key()
    ca_name = _name("epd-testenv-ca")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    serving_key = _new_key()
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVING_DNS_NAMES]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in (*SERVING_IPS, *extra_ips)]
    serving = _builder(_name("kube-apiserver"), ca_name, serving_key).add_extension(
        x509.SubjectAlternativeName(alt_names), critical=False
    )
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, _leaf(serving, ExtendedKeyUsageOID.SERVER_AUTH, ca_key))

    for identity in (*CLIENTS, *(NODE_CLIENTS if real_node else ())):
        key = _new_key()
        builder = _builder(_name(identity.user, identity.groups), ca_name, key)
        _write_key(pki.client_key(identity.name), key)
        _write_cert(pki.client_cert(identity.name), _leaf(builder, ExtendedKeyUsageOID.CLIENT_AUTH, ca_key))

    sa_key = _new_key()
    _write_key(pki.sa_private_key, sa_key)
    pki.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def issue(pki: Pki, name: str, dns_names: tuple[str, ...], ips: tuple[str, ...]) -> tuple[pathlib.Path, pathlib.Path]:
    """A certificate signed by the cluster's CA for a server that is also a client of its peers (KEDA's operator
    and metrics server talk mutual TLS with one pair); (NAME.crt, NAME.key) in the PKI folder."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_name = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    key = _new_key()
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        _builder(_name(name), ca_name, key)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.client_key(name), key)
    _write_cert(pki.client_cert(name), cert)
    return pki.client_cert(name), pki.client_key(name)
