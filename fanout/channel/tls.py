"""TLS for the direct channels: one key and self-signed certificate per Ray cluster, pinned by every caller.

Strategy: the channels already authenticate both ends with the cluster's secret (an HMAC handshake naming the
service, :mod:`fanout.channel.frames`); what TLS adds is confidentiality and integrity on the wire between
machines. So the certificate needs no PKI: the first actor that needs it makes an ECDSA P-256 key and a
self-signed certificate and stores both where the secret lives (the Ray cluster's GCS, ``actors.channels``);
servers present it, clients accept exactly that certificate (it is their only trust anchor; no host name
check, since the channels are addressed by IP). TLS 1.3 only. The HMAC handshake then runs inside the tunnel,
unchanged: holding the certificate proves nothing about the service.
"""
from __future__ import annotations

import datetime
import os
import ssl
import tempfile

_CERT_BEGIN = b"-----BEGIN CERTIFICATE-----"
VALID_DAYS = 3650  # the identity lives as long as the Ray cluster's GCS; a restarted cluster makes a new one


def new_identity() -> bytes:
    """A fresh private key and self-signed certificate, PEM (key first), for one Ray cluster's channels."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sdv-fanout channels")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks of the cluster's machines differ a little
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem + cert.public_bytes(serialization.Encoding.PEM)


def certificate_of(identity: bytes) -> bytes:
    """The certificate part of an identity (what a client pins)."""
    at = identity.find(_CERT_BEGIN)
    if at < 0:
        raise ValueError("the channel TLS identity holds no certificate")
    return identity[at:]


def server_context(identity: bytes) -> ssl.SSLContext:
    """The server side: presents the identity's certificate; TLS 1.3 only."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    # load_cert_chain reads files only: a private file for the moment it takes, removed at once
    fd, path = tempfile.mkstemp(prefix="fanout-channel-", suffix=".pem")
    try:
        os.write(fd, identity)
        os.close(fd)
        fd = -1
        ctx.load_cert_chain(path)
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)
    return ctx


def client_context(identity: bytes) -> ssl.SSLContext:
    """The client side: accepts the identity's certificate and nothing else; TLS 1.3 only."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # addressed by IP; the pinned certificate is the only anchor
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=certificate_of(identity).decode("ascii"))
    return ctx


__all__ = ["new_identity", "certificate_of", "server_context", "client_context", "VALID_DAYS"]
