"""TLS handshakes of ``fanout broker``'s mqtts listener: bounded in number, and counted by how they ended.

Was: a connection to a TLS port held its SSL state (~50 KiB with uvloop) from accept until its handshake
finished or ``mqtt.connect_timeout`` passed, however many there were, so a client opening sockets and sending
nothing held up to RLIMIT_NOFILE of them; and a handshake that failed (a client certificate of another CA,
an expired one, clear text on the TLS port) was dropped by the SSL layer without a count or a log line.
Now at most ``mqtt.max_tls_handshakes`` run at once (one more is closed at accept, counted in
``$SYS/broker/limits/tls_handshakes``) and every outcome is in ``$SYS/broker/tls/handshakes/...``.
"""
from __future__ import annotations

import resource
import selectors
import socket
import time

import psutil
import pytest

from .conftest import SLACK_MIB, MiB, sys_value
from .pki import mqtt_over_tls_answers, tls_broker, tls_config, url_port

pytestmark = pytest.mark.timeout(120)

BOUND = 20
STALLERS = 600  # ~30 MiB of broker RSS without the bound (~50 KiB each), ~1 MiB with it


@pytest.fixture(autouse=True)
def _descriptors_for_the_stallers():
    """This process holds every staller's socket: a soft RLIMIT_NOFILE of 1,024 (a common default) is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = STALLERS + 512
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _sys_becomes(port: int, name: str, value: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := sys_value(port, name)) != value:
        assert time.monotonic() < deadline, f"$SYS/broker/{name} is {got}, expected {value}"
        time.sleep(0.3)


def _closed_within(socks: list[socket.socket], seconds: float) -> set[socket.socket]:
    """The sockets the broker closed (end of file or reset) within ``seconds`` (epoll: the test process may
    hold descriptors past select's 1,024)."""
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + seconds
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0 and len(closed) < len(socks):
            for key, _ in sel.select(min(left, 0.2)):
                s = key.fileobj
                try:
                    gone = s.recv(4096) == b""  # type: ignore[union-attr]
                except OSError:
                    gone = True
                if gone:
                    closed.add(s)  # type: ignore[arg-type]
                    sel.unregister(s)
    return closed


def test_stalled_handshakes_past_the_bound_are_closed_at_once_and_outcomes_are_counted(pki, tmp_path):
    cfg = tls_config(pki, tmp_path / "b.toml", client_auth="required", sys_interval="1s",
                     extra=f'max_tls_handshakes = {BOUND}\nconnect_timeout = "60s"\n')
    with tls_broker(cfg) as (proc, urls):
        plain, port = url_port(urls["mqtt"]), url_port(urls["mqtts"])
        broker = psutil.Process(proc.pid)
        assert mqtt_over_tls_answers(pki, port, pki.client("device-1"))  # warm: one completed handshake
        base = broker.memory_info().rss
        stallers = []
        try:
            for _ in range(STALLERS):  # connect, send nothing
                stallers.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            closed = _closed_within(stallers, 5.0)
            grown_mib = (broker.memory_info().rss - base) / MiB
            assert len(closed) == STALLERS - BOUND, f"{len(closed)} of {STALLERS} closed (bound {BOUND})"
            assert grown_mib < SLACK_MIB, f"RSS +{grown_mib:.1f} MiB while {STALLERS} handshakes stall"
            _sys_becomes(plain, "limits/tls_handshakes", STALLERS - BOUND)
            _sys_becomes(plain, "tls/handshakes/running", BOUND)
            assert not mqtt_over_tls_answers(pki, port, pki.client("device-2"))  # the bound bites anyone
        finally:
            for s in stallers:
                s.close()
        _sys_becomes(plain, "tls/handshakes/running", 0)  # the stallers left: their places are free
        assert sys_value(plain, "tls/handshakes/abandoned") == BOUND
        assert mqtt_over_tls_answers(pki, port, pki.client("device-3"))
        assert not mqtt_over_tls_answers(pki, port, pki.foreign_client("device-4"))
        assert not mqtt_over_tls_answers(pki, port, pki.expired_client("device-5"))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:  # MQTT in clear on the TLS port
            s.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
            assert _closed_within([s], 5.0) == {s}
        _sys_becomes(plain, "tls/handshakes/completed", 2)
        _sys_becomes(plain, "tls/handshakes/failed/certificate", 2)
        _sys_becomes(plain, "tls/handshakes/failed/protocol", 1)
        assert sys_value(plain, "limits/tls_handshakes") == STALLERS - BOUND + 1  # device-2's attempt
