"""Who is at the other end of a connection, as the adapter tells the broker core.

:class:`Peer` is what an adapter passes to ``Broker.connection_made(now_ms, peer)``. It is a named tuple
so that ``peer[0]``/``peer[1]`` (host, port) read as the socket's ``peername`` did before it existed.
``cert_cn`` is the subject common name of a client certificate that the TLS handshake verified against
``mqtt.tls_ca`` (None without TLS, without a certificate, or with ``tls_client_auth = "none"``): the auth
layer treats it as an authenticated user name (see :mod:`fanout.mqtt.auth`). Only the adapter sets it,
and only from a verified chain, never from anything the client sends inside MQTT.
"""
from __future__ import annotations

from typing import NamedTuple

TRANSPORTS = ("mqtt", "mqtts", "ws", "wss")


class Peer(NamedTuple):
    """The remote end of one connection.

    Attributes:
        host: remote address.
        port: remote port.
        cert_cn: verified client-certificate subject CN, or None.
        transport: the listener kind, one of :data:`TRANSPORTS` (for logs and ``$SYS``).
    """

    host: str
    port: int
    cert_cn: str | None = None
    transport: str = "mqtt"

    @classmethod
    def from_peername(cls, peername: object, cert_cn: str | None = None, transport: str = "mqtt") -> "Peer":
        """A Peer from ``transport.get_extra_info("peername")`` (a 2- or 4-tuple, or None for a socketpair)."""
        if isinstance(peername, tuple) and len(peername) >= 2:
            return cls(str(peername[0]), int(peername[1]), cert_cn, transport)
        return cls("", 0, cert_cn, transport)


__all__ = ["Peer", "TRANSPORTS"]
