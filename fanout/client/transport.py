"""One MQTT connection (5, or 3.1.1) for the platform client: paho-mqtt 2.x driven by the asyncio loop.

Strategy: paho does the protocol (CONNECT, QoS 1 flow, keepalive); this module plugs its socket into
the running asyncio loop through paho's external-loop callbacks (``on_socket_open`` /
``register_write`` ...), as aiomqtt does, but without a coroutine per publish: ``publish`` is a plain
call returning the packet id and PUBACKs arrive as ``on_ack(mid)`` callbacks on the loop thread.
Measured on this 2-core machine against Mosquitto, pipelining 20 KB QoS 1 triggers (window 128):
paho with its own network thread ~2.8k msg/s with a publish-call p99 of ~1.5 ms (GIL hand-offs
between the two threads), aiomqtt ~2.5k msg/s (a task per publish), paho on the asyncio loop
~3.8-4.8k msg/s with a p99 of ~0.3 ms. Only the blocking TCP connect runs in a worker thread.

A :class:`BrokerConnection` is used once: a fresh paho client per connection, clean session, so nothing
paho queued for a dead connection is ever re-sent behind the client's back; the client owns retries.

MQTT 5 (``mqtt5=True``): the server refuses a bad trigger or blob with a negative PUBACK (reason code and
Reason String) and keeps the connection, so ``on_ack`` gets the code and the reason too. A server that
does not speak MQTT 5 answers a level-5 CONNECT with CONNACK 0x01/0x84 or by closing the socket:
:class:`ConnectFailed` then has ``protocol_refused`` set and the client connects again with 3.1.1.
"""
from __future__ import annotations

import asyncio
import socket
import threading
from typing import Callable

import paho.mqtt.client as mqtt
import structlog
from paho.mqtt.enums import CallbackAPIVersion

log = structlog.get_logger(__name__)


class ConnectFailed(OSError):
    """The TCP connection or the MQTT CONNECT was refused or timed out.

    Attributes:
        protocol_refused: an MQTT 5 CONNECT the server may not understand (CONNACK 0x01 or 0x84, or the
            socket closed after the CONNECT without a CONNACK): worth one more try with MQTT 3.1.1.
    """

    def __init__(self, message: str, protocol_refused: bool = False) -> None:
        super().__init__(message)
        self.protocol_refused = protocol_refused


#: CONNACK codes meaning "not this protocol version": 3.1.1's 0x01 and MQTT 5's 0x84.
_PROTOCOL_REFUSED = (0x01, 0x84)
#: What ``on_ack`` gets: packet id, reason code (0 = success; >= 0x80 refused), Reason String or None.
AckFn = Callable[[int, int, "str | None"], None]


class PublishFailed(OSError):
    """paho refused to queue a PUBLISH (connection gone, invalid topic, oversized payload).

    Attributes:
        connection_lost: True when the connection is gone (not the message's fault).
    """

    def __init__(self, message: str, connection_lost: bool = False) -> None:
        super().__init__(message)
        self.connection_lost = connection_lost


class BrokerConnection:
    """The platform client's single-use MQTT connection to the broker; its callbacks run on the asyncio loop.

    Args:
        client_id: MQTT client id.
        username: login, or None.
        password: password, or None.
        keepalive_s: MQTT keepalive.
        on_ack: called with ``(packet id, reason code, reason string)`` of every PUBACK (the code is
            0 on MQTT 3.1.1; on MQTT 5 a code >= 0x80 is the server refusing that message).
        on_message: called with (topic, payload) of every PUBLISH received.
        on_lost: called once with (this connection, reason) when it ends for any reason, including
            a failed :meth:`open`.
        mqtt5: connect with MQTT 5 (else 3.1.1).
    """

    def __init__(
        self,
        *,
        client_id: str,
        username: str | None,
        password: str | None,
        keepalive_s: int,
        on_ack: AckFn,
        on_message: Callable[[str, bytes], None],
        on_lost: Callable[["BrokerConnection", str], None],
        mqtt5: bool = False,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._on_ack = on_ack
        self._on_message = on_message
        self._on_lost = on_lost
        self._lost = False
        self._connack: asyncio.Future[None] = self._loop.create_future()
        self._tcp_connected = False  # a close before the CONNACK is then the server's answer
        self.connected = False
        self.mqtt5 = mqtt5
        if mqtt5:  # clean start, session expiry 0 (the default): nothing outlives the connection
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5,
                            reconnect_on_failure=False)
        else:
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                            clean_session=True, reconnect_on_failure=False)
        if username is not None:
            c.username_pw_set(username, password)
        c.max_inflight_messages_set(0)  # the client windows itself; 0 = no paho limit
        c.max_queued_messages_set(0)
        c.on_connect = self._cb_connect
        c.on_disconnect = self._cb_disconnect
        c.on_publish = self._cb_publish
        c.on_message = self._cb_message
        c.on_subscribe = self._cb_subscribe
        c.on_socket_open = self._cb_sock_open
        c.on_socket_close = self._cb_sock_close
        c.on_socket_register_write = self._cb_reg_write
        c.on_socket_unregister_write = self._cb_unreg_write
        self._keepalive_s = keepalive_s
        self._paho = c

    # ------------------------------------------------------------------ public

    async def open(self, host: str, port: int, timeout_s: float) -> None:
        """Connect and wait for a successful CONNACK.

        Raises:
            ConnectFailed: TCP refused/unreachable, CONNACK refused, or ``timeout_s`` elapsed.
        """
        self._paho.connect_timeout = timeout_s
        try:
            await asyncio.wait_for(self._loop.run_in_executor(None, self._paho.connect, host, port, self._keepalive_s), timeout_s)
            self._tcp_connected = True
            await asyncio.wait_for(asyncio.shield(self._connack), timeout_s)
        except asyncio.CancelledError:
            self.abort("connect cancelled")
            raise
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            self.abort(f"connect failed: {exc!r}")
            if isinstance(exc, ConnectFailed):
                raise
            if isinstance(exc, asyncio.TimeoutError):  # str() of a TimeoutError is empty: say what did not come
                why = (f"no CONNACK within {timeout_s:g} s" if self._tcp_connected
                       else f"TCP connect not done within {timeout_s:g} s")
            else:
                why = str(exc) or type(exc).__name__
            raise ConnectFailed(f"cannot connect to mqtt://{host}:{port}: {why}") from None

    def publish(self, topic: str, payload: bytes) -> int:
        """Queue a QoS 1 PUBLISH.

        Returns:
            The packet id; its PUBACK comes as ``on_ack(mid)``.

        Raises:
            PublishFailed: paho refused it (not connected, invalid topic or payload).
        """
        if self._lost:
            raise PublishFailed("connection lost", connection_lost=True)
        try:
            info = self._paho.publish(topic, payload, qos=1)
        except ValueError as exc:
            raise PublishFailed(f"publish refused by paho: {exc}") from None
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            lost = info.rc in (mqtt.MQTT_ERR_NO_CONN, mqtt.MQTT_ERR_CONN_LOST)
            raise PublishFailed(f"publish failed: {mqtt.error_string(info.rc)}", connection_lost=lost)
        return info.mid

    def subscribe(self, topic: str) -> None:
        """Subscribe with QoS 1 (a refusal is logged, not raised)."""
        self._paho.subscribe(topic, qos=1)

    def misc(self) -> None:
        """Keepalive bookkeeping; call about once per second."""
        if not self._lost:
            self._paho.loop_misc()

    def abort(self, reason: str) -> None:
        """Drop the connection now, without DISCONNECT; ``on_lost(reason)`` follows."""
        sock = self._paho.socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._paho.loop_read()  # sees EOF: paho closes the socket and reports the disconnect
        self._mark_lost(reason)

    async def close(self, timeout_s: float = 1.0) -> None:
        """Send DISCONNECT and wait (bounded) for the socket to close."""
        if self._lost:
            return
        self._paho.disconnect()
        deadline = self._loop.time() + timeout_s
        while not self._lost and self._loop.time() < deadline:
            await asyncio.sleep(0.01)
        if not self._lost:
            self.abort("closed")

    # ------------------------------------------------------------------ paho callbacks

    def _mark_lost(self, reason: str) -> None:
        self.connected = False
        if not self._connack.done():
            self._connack.set_exception(ConnectFailed(reason, protocol_refused=self.mqtt5 and self._tcp_connected))
            self._connack.exception()  # retrieved: open() reports it
        if not self._lost:
            self._lost = True
            self._on_lost(self, reason)

    def _cb_connect(self, client: mqtt.Client, userdata: object, flags: object, rc: mqtt.ReasonCode, props: object) -> None:
        if rc.is_failure:
            self._connack.set_exception(ConnectFailed(f"CONNACK refused: {rc}",
                                                      protocol_refused=self.mqtt5 and rc.value in _PROTOCOL_REFUSED))
            self._connack.exception()
            return
        self.connected = True
        if not self._connack.done():
            self._connack.set_result(None)

    def _cb_disconnect(self, client: mqtt.Client, userdata: object, flags: object, rc: mqtt.ReasonCode, props: object) -> None:
        self._in_loop(self._mark_lost, f"disconnected: {rc}")

    def _cb_publish(self, client: mqtt.Client, userdata: object, mid: int, rc: mqtt.ReasonCode, props: object) -> None:
        if not self.mqtt5 or not rc.is_failure:
            self._on_ack(mid, 0, None)
            return
        self._on_ack(mid, rc.value, getattr(props, "ReasonString", None))

    def _cb_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        self._on_message(msg.topic, msg.payload)

    def _cb_subscribe(self, client: mqtt.Client, userdata: object, mid: int, codes: list[mqtt.ReasonCode], props: object) -> None:
        if any(c.is_failure for c in codes):
            log.warning("client.errors_subscription_refused", reason="cluster errors will surface only as disconnects")

    def _in_loop(self, fn: Callable[..., object], *args: object) -> None:
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def _cb_sock_open(self, client: mqtt.Client, userdata: object, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._in_loop(self._add_reader, sock)

    def _add_reader(self, sock: socket.socket) -> None:
        if self._paho.socket() is sock:
            self._loop.add_reader(sock, self._paho.loop_read)

    def _cb_sock_close(self, client: mqtt.Client, userdata: object, sock: socket.socket) -> None:
        self._in_loop(self._remove, sock.fileno())
        # paho reports on_disconnect (with its reason) right after closing the socket; this is the fallback
        self._loop.call_soon_threadsafe(self._mark_lost, "socket closed")

    def _remove(self, fd: int) -> None:
        if fd >= 0:
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)

    def _cb_reg_write(self, client: mqtt.Client, userdata: object, sock: socket.socket) -> None:
        self._in_loop(self._add_writer, sock)

    def _add_writer(self, sock: socket.socket) -> None:
        if self._paho.socket() is sock:
            self._loop.add_writer(sock, self._paho.loop_write)

    def _cb_unreg_write(self, client: mqtt.Client, userdata: object, sock: socket.socket) -> None:
        self._in_loop(self._remove_writer, sock)

    def _remove_writer(self, sock: socket.socket) -> None:
        if sock.fileno() >= 0:
            self._loop.remove_writer(sock)
