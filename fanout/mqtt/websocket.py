"""MQTT over WebSocket, sans-I/O: HTTP upgrade and framing (wsproto) around the broker's byte stream.

Strategy: MQTT over WebSocket (MQTT 3.1.1 section 6) carries the same byte stream as TCP inside binary
frames. :class:`WebSocketStream` turns received socket bytes into that MQTT byte stream and MQTT bytes
into frames, so the broker core serves WebSocket clients unchanged; the asyncio adapter only moves bytes.

Rules (each enforced where named):

- Rule 1 (handshake): only ``GET /mqtt`` with the ``mqtt`` subprotocol is accepted (``MQTT-6.0.0-3``:
  the server selects ``mqtt``); anything else gets an HTTP error and the connection closes. No extension
  (``permessage-deflate``) is negotiated: a compressed frame cannot inflate into memory we did not bound.
- Rule 2 (data): only binary frames carry MQTT (``MQTT-6.0.0-1``: a text frame closes the connection with
  1003). A frame may hold part of a packet or several (``MQTT-6.0.0-2``): bytes pass through as a stream,
  wsproto hands over partial frame payloads, so nothing here buffers a whole message.
- Rule 3 (control): pings are answered, a close is answered and ends the stream.

wsproto is itself sans-I/O (the h11 family), so this module does no I/O either.
"""
from __future__ import annotations

from wsproto import ConnectionType, WSConnection
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Ping, RejectConnection, Request,
                            TextMessage)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

import structlog

log = structlog.get_logger(__name__)

MQTT_PATH = "/mqtt"
MQTT_SUBPROTOCOL = "mqtt"


class WebSocketStream:
    """One server-side WebSocket connection whose binary frames carry MQTT.

    ``receive_data(bytes)`` returns the MQTT bytes found; what must go back to the client (handshake
    response, pongs, close) accumulates in :meth:`data_to_send`. :meth:`frame` wraps broker output.

    Attributes:
        accepted: the upgrade succeeded (MQTT bytes may flow).
        closed: the stream is over (peer closed, protocol error, refused handshake); close the socket
            after sending :meth:`data_to_send`.
        close_reason: why it closed, for logs.
    """

    __slots__ = ("_ws", "_out", "accepted", "closed", "close_reason", "path")

    def __init__(self, path: str = MQTT_PATH) -> None:
        self._ws = WSConnection(ConnectionType.SERVER)
        self._out = bytearray()
        self.accepted = False
        self.closed = False
        self.close_reason = ""
        self.path = path

    def receive_data(self, data: bytes | None) -> bytes:
        """Feed socket bytes (None = EOF); returns the MQTT bytes they carried (maybe ``b""``)."""
        if self.closed:
            return b""
        mqtt = bytearray()
        try:
            self._ws.receive_data(data)
            for event in self._ws.events():
                if isinstance(event, BytesMessage):
                    mqtt += event.data  # Rule 2: a stream, frame boundaries mean nothing
                elif isinstance(event, Request):
                    self._handshake(event)
                elif isinstance(event, Ping):
                    self._out += self._ws.send(event.response())
                elif isinstance(event, CloseConnection):
                    self._finish(f"websocket closed by peer ({event.code})", reply=event.response())
                elif isinstance(event, TextMessage):
                    self._finish("text frame (MQTT-6.0.0-1)", reply=CloseConnection(code=1003, reason="binary frames only"))
        except RemoteProtocolError as exc:
            self._finish(f"websocket protocol error: {exc}")
            if exc.event_hint is not None:
                try:
                    self._out += self._ws.send(exc.event_hint)
                except LocalProtocolError:
                    pass
        if data is None and not self.closed:
            self._finish("connection lost")
        return bytes(mqtt)

    def _handshake(self, request: Request) -> None:
        target = request.target.split("?", 1)[0]
        if target != self.path:
            self._refuse(404, f"websocket path {target!r} is not {self.path}")
        elif MQTT_SUBPROTOCOL not in request.subprotocols:  # Rule 1, MQTT-6.0.0-3
            self._refuse(400, f"websocket subprotocols {request.subprotocols!r} lack {MQTT_SUBPROTOCOL!r}")
        else:
            self._out += self._ws.send(AcceptConnection(subprotocol=MQTT_SUBPROTOCOL))
            self.accepted = True

    def _refuse(self, status: int, reason: str) -> None:
        self._out += self._ws.send(RejectConnection(status_code=status, headers=[(b"content-length", b"0")]))
        self.closed = True
        self.close_reason = reason

    def _finish(self, reason: str, reply: CloseConnection | None = None) -> None:
        if reply is not None:
            try:
                self._out += self._ws.send(reply)
            except LocalProtocolError:  # already closing from our side
                pass
        self.closed = True
        self.close_reason = self.close_reason or reason

    def data_to_send(self) -> bytes:
        """The protocol's own output since the last call (handshake response, pongs, close frames)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def frame(self, mqtt: bytes) -> bytes:
        """One binary frame carrying ``mqtt`` (the broker's output for this connection)."""
        if not self.accepted or self.closed:
            return b""
        return self._ws.send(BytesMessage(data=mqtt))

    def close(self, code: int = 1000) -> bytes:
        """The close frame the server sends when it ends the connection (``b""`` if already closed)."""
        if not self.accepted or self.closed:
            return b""
        self.closed = True
        self.close_reason = self.close_reason or "closed by broker"
        try:
            return self._ws.send(CloseConnection(code=code))
        except LocalProtocolError:
            return b""


__all__ = ["WebSocketStream", "MQTT_PATH", "MQTT_SUBPROTOCOL"]
