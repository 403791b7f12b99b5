"""The cluster tool: a cluster CA and one key per node, for per-node identity, with or without TLS.

`python -m app.coordination.p2p.tls init --dir DIR --nodes n0,n1,n2,operator` writes DIR/ca.pem,
DIR/ca.key and, per name, DIR/<id>.pem + DIR/<id>.key: a certificate whose common name is the
node id, signed by the CA. Run it again with new names to add nodes: the CA is kept. Copy to
each node its own <id>.pem and <id>.key and ca.pem (never ca.key), then either

* `mesh.node_keys: {ca_file, cert_file, key_file}`: each node signs its requests, answers and
  gossiped state with its own key (identity.NodeKey) over plain HTTP; a signature speaks only
  for the node its certificate names; or
* `mesh.tls: {...}` (same files): the same signatures, over mutual TLS with that CA: every node
  trusts only that CA, both ways, and a request whose sender differs from the certificate of
  its connection is refused (auth.Verifier).

An `operator` certificate lets `python -m app.cli` sign (its config's mesh.node_keys).
Without either, the cluster signs with one shared secret: the quick start, which trusts every
holder of the secret to speak for every node (the nodes say so in their log).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ssl
import sys
from pathlib import Path
from typing import Any

from app.atomic_files import atomic_write_text
from app.config.mesh import TlsConfig

VALID_DAYS = 3650


def server_context(cfg: TlsConfig) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(cfg.ca_file))
    ctx.load_cert_chain(str(cfg.cert_file), str(cfg.key_file))
    ctx.verify_mode = ssl.CERT_REQUIRED  # no certificate from our CA, no connection
    return ctx


def client_context(cfg: TlsConfig) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(cfg.ca_file))
    ctx.load_cert_chain(str(cfg.cert_file), str(cfg.key_file))
    ctx.check_hostname = False  # peers are addressed by IP; who they are is the CA's certificate + X-Mesh-Node
    return ctx


def cert_node_id(peercert: Any) -> str | None:
    """The common name of a verified peer certificate (ssl.SSLSocket.getpeercert() form)."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def own_node_id(cfg: TlsConfig) -> str:
    """The node id our own certificate names (a node must run under that id)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(Path(cfg.cert_file).read_bytes())
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def init_ca(out: Path, nodes: list[str]) -> list[Path]:
    """Create the CA (if DIR has none) and one certificate per node; the files written."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    written: list[Path] = []

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_cert_path, ca_key_path = out / "ca.pem", out / "ca.key"
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mesh cluster CA")])
        ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(ca_key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
        atomic_write_text(ca_key_path, pem_key(ca_key).decode())  # type: ignore[arg-type]
        ca_key_path.chmod(0o600)
        atomic_write_text(ca_cert_path, ca_cert.public_bytes(serialization.Encoding.PEM).decode())
        written += [ca_cert_path, ca_key_path]
    for node in nodes:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(node)]), critical=False)
                .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
        key_path, cert_path = out / f"{node}.key", out / f"{node}.pem"
        atomic_write_text(key_path, pem_key(key).decode())
        key_path.chmod(0o600)
        atomic_write_text(cert_path, cert.public_bytes(serialization.Encoding.PEM).decode())
        written += [cert_path, key_path]
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.coordination.p2p.tls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    init = sub.add_parser("init", help="create the cluster CA (once) and a key and certificate per node")
    init.add_argument("--dir", required=True, type=Path)
    init.add_argument("--nodes", required=True, help="node ids, comma separated")
    args = p.parse_args(argv)
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    from app.coordination.p2p.auth import ID_RE

    bad = [n for n in nodes if not ID_RE.match(n)]
    if bad:
        print(f"error: not a node id: {bad}", file=sys.stderr)
        return 2
    for path in init_ca(args.dir, nodes):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
