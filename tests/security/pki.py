"""Certificates (trustme) and TLS/WebSocket broker processes for the transport security tests (the ``pki``
fixture is re-exported by this folder's conftest).

- ``pki`` (session): one CA with a server certificate for 127.0.0.1/localhost, client certificates per
  CN (``pki.client("VIN...")``), a client certificate from another CA and an expired one, all as PEM
  files (what the broker config, paho and ``mosquitto_pub`` read).
- :func:`tls_broker`: ``fanout broker`` as a subprocess with the extra listeners configured; yields the
  process and ``{scheme: url}`` read from its ready lines; always stopped.
- :func:`tls_paho`: a :class:`PahoClient` over TLS, WebSocket or WSS, with or without a client certificate.
"""
from __future__ import annotations

import contextlib
import datetime
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import trustme

from tests.integration.client_fixtures import free_port
from tests.integration.conftest import PahoClient, cli_broker, url_port


@dataclass
class ClientCert:
    cert: Path
    key: Path


@dataclass
class PKI:
    """PEM files of the test certificates, in one directory."""

    root: Path
    ca: trustme.CA
    ca_file: Path
    server_cert: Path
    server_key: Path
    other_ca: trustme.CA = field(default_factory=trustme.CA)
    _clients: dict[str, ClientCert] = field(default_factory=dict)

    def _write(self, name: str, leaf: trustme.LeafCert) -> ClientCert:
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
        key.write_bytes(leaf.private_key_pem.bytes())
        return ClientCert(cert, key)

    def client(self, cn: str) -> ClientCert:
        """A client certificate with subject CN ``cn``, issued by the broker's CA."""
        if cn not in self._clients:
            self._clients[cn] = self._write(f"client-{cn}", self.ca.issue_cert(common_name=cn))
        return self._clients[cn]

    def foreign_client(self, cn: str) -> ClientCert:
        """A client certificate with CN ``cn`` from a CA the broker does not trust."""
        return self._write(f"foreign-{cn}", self.other_ca.issue_cert(common_name=cn))

    def expired_client(self, cn: str) -> ClientCert:
        """A client certificate with CN ``cn`` from the broker's CA that expired yesterday."""
        now = datetime.datetime.now(datetime.timezone.utc)
        leaf = self.ca.issue_cert(common_name=cn, not_before=now - datetime.timedelta(days=30),
                                  not_after=now - datetime.timedelta(days=1))
        return self._write(f"expired-{cn}", leaf)

    def new_server_cert(self, name: str) -> ClientCert:
        """Another server certificate for 127.0.0.1/localhost from the same CA (for reload tests)."""
        return self._write(name, self.ca.issue_cert("127.0.0.1", "localhost"))


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server_cert, server_key = root / "server.crt", root / "server.key"
    server_cert.write_bytes(b"".join(p.bytes() for p in server.cert_chain_pems))
    server_key.write_bytes(server.private_key_pem.bytes())
    return PKI(root, ca, ca_file, server_cert, server_key)



def tls_config(pki: PKI, path: Path, *, client_auth: str = "none", schemes: tuple[str, ...] = ("mqtts",),
               cert: Path | None = None, key: Path | None = None, cert_role: str = "client", extra: str = "",
               sys_interval: str = "0s") -> Path:
    """Write a broker TOML with the listeners of ``schemes`` on free ports and the test certificates
    (``extra``: more ``[mqtt]`` lines, or further sections).

    ``cert_role`` defaults to ``client`` here (the product default is ``vehicle``): these tests are about
    the transport, so a certificate holder may use any topic; the vehicle binding has its own test.
    """
    ports = {s: free_port() for s in schemes}
    lines = ["[mqtt]", f'sys_interval = "{sys_interval}"', f'cert_role = "{cert_role}"',
             f'tls_cert = "{cert or pki.server_cert}"', f'tls_key = "{key or pki.server_key}"',
             f'tls_ca = "{pki.ca_file}"', f'tls_client_auth = "{client_auth}"']
    lines += [f"{ {'mqtts': 'tls_port', 'ws': 'ws_port', 'wss': 'wss_port'}[s]} = {p}" for s, p in ports.items()]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


@contextlib.contextmanager
def tls_broker(config: Path, schemes: tuple[str, ...] = ("mqtts",)) -> Iterator[tuple[subprocess.Popen, dict[str, str]]]:
    """``fanout broker --config config``; yields (process, {scheme: url}) once every ready line is out."""
    with cli_broker("--config", str(config)) as (proc, url):
        urls = {"mqtt": url}
        for _ in schemes:
            line: list[str] = []
            reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
            reader.start()
            reader.join(10)
            assert line and line[0].startswith("fanout broker ready "), f"missing ready line: {line!r}"
            u = line[0].split()[-1]
            urls[u.split("://")[0]] = u
        yield proc, urls



def client_context(pki: PKI, cert: ClientCert | None = None, **kw) -> ssl.SSLContext:
    """A client SSLContext trusting the test CA, presenting ``cert`` if given."""
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    for k, v in kw.items():
        setattr(ctx, k, v)
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


def tls_paho(make: object, pki: PKI, scheme: str, *, cert: ClientCert | None = None, client_id: str | None = None,
             clean_session: bool = True) -> PahoClient:
    """A PahoClient for ``scheme`` (mqtt, mqtts, ws, wss) trusting the test CA; not yet connected."""
    c: PahoClient = make(client_id, clean_session)  # type: ignore[operator]
    if scheme in ("ws", "wss"):
        c.client.transport = "websockets"
        c.client.ws_set_options(path="/mqtt")
    if scheme in ("mqtts", "wss"):
        c.client.tls_set_context(client_context(pki, cert))
    return c


def handshake(pki: PKI, port: int, cert: ClientCert | None = None, **ctx_kw) -> ssl.SSLSocket:
    """A TLS connection to 127.0.0.1:port (raises ``ssl.SSLError``/``OSError`` when refused at handshake)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        return client_context(pki, cert, **ctx_kw).wrap_socket(sock, server_hostname="127.0.0.1")
    except BaseException:
        sock.close()
        raise


def server_cert_der(pki: PKI, port: int) -> bytes:
    """The DER certificate the TLS listener on ``port`` presents to a new handshake."""
    with handshake(pki, port) as s:
        return s.getpeercert(binary_form=True)  # type: ignore[return-value]


def renew_and_reload(pki: PKI, proc: subprocess.Popen, cert: Path, key: Path, port: int, name: str,
                     timeout: float) -> bytes:
    """Write a new server certificate over ``cert``/``key``, SIGHUP ``proc``, and wait until new handshakes
    present it; returns its DER (AssertionError when they never do)."""
    import shutil
    import signal
    import time

    renewed = pki.new_server_cert(name)
    shutil.copy(renewed.cert, cert)
    shutil.copy(renewed.key, key)
    proc.send_signal(signal.SIGHUP)
    expected = ssl.PEM_cert_to_DER_cert(renewed.cert.read_text())
    deadline = time.monotonic() + timeout
    while (got := server_cert_der(pki, port)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got == expected, "new handshakes still get the old certificate after SIGHUP"
    return expected


CONNECT_X = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x"  # MQTT 3.1.1 CONNECT, client id "x", clean session


def mqtt_over_tls_answers(pki: PKI, port: int, cert: ClientCert | None = None, **ctx_kw) -> bool:
    """True when a TLS client (with ``cert``) gets a CONNACK; False when the TLS handshake refused it.

    With TLS 1.3 the server checks the client certificate after the client considers the handshake done,
    so a refusal surfaces as an alert (``SSLError``) or EOF on the first read; either way no MQTT byte
    reached the broker core.
    """
    try:
        s = handshake(pki, port, cert, **ctx_kw)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return False
    with s:
        try:
            s.sendall(CONNECT_X)
            data = s.recv(4)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            return False
        return data[:1] == b"\x20"
