"""Everything the MQTT package reads from configuration, as one plain immutable object.

Strategy: the package is standalone (it imports nothing outside itself but the standard library and
structlog), so it does not know the project's config file, its units or its environment overrides.
:class:`MQTTSettings` is what it needs, already parsed into plain units (milliseconds, bytes, counts,
a compiled pattern); ``fanout.config.mqtt_settings(config)`` builds it from the loaded configuration, and
a test or another embedding may build it directly. The records it holds that the config file also
describes (:class:`UserConfig`, :class:`AclRule`) and the error a bad value raises (:class:`ConfigError`)
are defined here, at the bottom of the layers, and ``fanout.config`` re-exports them: one definition each.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


class ConfigError(ValueError):
    """A config file, key or value that cannot be used; the message names it (``mqtt.port: ...``)."""


@dataclass(frozen=True, slots=True)
class UserConfig:
    """One ``[users.NAME]`` table: a login with its PBKDF2 hash (``fanout passwd``) and role."""

    name: str
    password_hash: str
    role: str


@dataclass(frozen=True, slots=True)
class AclRule:
    """One extra ACL rule: first matching rule wins, before the role's built-in rules."""

    action: str
    topic: str
    allow: bool
    role: str | None = None
    user: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MQTTSettings:
    """The MQTT package's settings (``[mqtt]``, ``[users]`` and ``[[acl]]`` of the config file).

    Every field is required: the defaults live once, in ``fanout.config.SCHEMA``. Names carry their unit.

    Attributes:
        vehicle_client_id: the client-id rule of the ``vehicle`` role (a VIN); ``fullmatch`` decides.
        host: listener address.
        port: listener port (0 = any free port).
        anonymous_role: role of clients without user name (``none`` refuses them).
        cert_role: role of a verified client certificate whose CN names no configured user.
        dev_platform_login: allow ``platform``/``platform`` on a loopback listener without users.
        users: configured logins.
        acl: extra ACL rules, in file order.
        max_connect_size_bytes: largest CONNECT accepted (before authentication; larger closes the connection).
        max_packet_size_bytes: largest packet accepted from a client.
        max_platform_packet_size_bytes: largest packet from a platform/admin login (after its CONNACK).
        max_topic_levels: most levels in a topic name or filter.
        max_topic_length_bytes: longest topic name or filter (UTF-8 bytes).
        max_subscriptions_per_client: filters one session may hold.
        sys_interval_ms: ``$SYS`` publish period (0 = off).
        connect_timeout_ms: a connection that sends no CONNECT within this is closed.
        max_connections: concurrent connections accepted.
        max_sessions: persistent sessions kept (the oldest offline one is evicted past it).
        session_expiry_ms: a disconnected persistent session is dropped after this (0 = never).
        takeover_window_ms: window over which takeovers of one client id are counted.
        takeover_limit: takeovers per window before a newcomer is refused (CONNACK 0x03).
        max_inflight: unacknowledged outbound QoS 1/2 messages per session before queueing.
        max_offline_messages: queued messages per session.
        offline_drop: which message a full queue drops, ``oldest`` or ``newest``.
        auth_fail_limit_per_host: failed logins per source address per window before PBKDF2 logins are refused.
        auth_fail_limit_total: failed logins overall per window before PBKDF2 logins are refused.
        auth_fail_window_ms: the failed-login counting window.
        auth_threads: PBKDF2 threads.
        auth_queue: PBKDF2 verifications waiting or running before a newcomer is refused.
        max_session_bytes: bytes of messages one session holds, queued + in flight.
        max_queued_bytes: bytes of queued messages of all sessions together.
        offline_queued_fraction: part of ``max_queued_bytes`` the queues of disconnected sessions may hold.
        backpressure_high_fraction: fill (of what offline queues leave of ``max_queued_bytes``) of the connected
            sessions' queues at which reading from publishing connections stops.
        backpressure_low_fraction: fill at which it resumes (below ``backpressure_high_fraction``).
        max_write_buffer_bytes: bytes waiting to be written to one client before it is disconnected.
        max_retained_messages: retained topics kept (``$SYS`` excluded).
        max_retained_bytes: topic + payload bytes of retained messages kept (``$SYS`` excluded).
        match_cache_entries: topic names whose subscribers a node keeps matched (cleared on subscription changes).
        receive_maximum: MQTT 5 CONNACK Receive Maximum: unacknowledged QoS 1/2 PUBLISHes from one client.
        topic_alias_maximum: MQTT 5 CONNACK Topic Alias Maximum: aliases one client may set (0 = none).
        max_keepalive_ms: MQTT 5 Server Keep Alive cap (0 = the client's keep alive stands).
        send_topic_aliases: MQTT 5: alias topics in PUBLISHes to clients that announced a Topic Alias Maximum.
    """

    vehicle_client_id: re.Pattern[str]
    host: str
    port: int
    anonymous_role: str
    cert_role: str
    dev_platform_login: bool
    users: tuple[UserConfig, ...]
    acl: tuple[AclRule, ...]
    max_connect_size_bytes: int
    max_packet_size_bytes: int
    max_platform_packet_size_bytes: int
    max_topic_levels: int
    max_topic_length_bytes: int
    max_subscriptions_per_client: int
    sys_interval_ms: int
    connect_timeout_ms: int
    max_connections: int
    max_sessions: int
    session_expiry_ms: int
    takeover_window_ms: int
    takeover_limit: int
    max_inflight: int
    max_offline_messages: int
    offline_drop: str
    auth_fail_limit_per_host: int
    auth_fail_limit_total: int
    auth_fail_window_ms: int
    auth_threads: int
    auth_queue: int
    max_session_bytes: int
    max_queued_bytes: int
    offline_queued_fraction: float
    backpressure_high_fraction: float
    backpressure_low_fraction: float
    max_write_buffer_bytes: int
    max_retained_messages: int
    max_retained_bytes: int
    match_cache_entries: int
    receive_maximum: int
    topic_alias_maximum: int
    max_keepalive_ms: int
    send_topic_aliases: bool


__all__ = ["MQTTSettings", "UserConfig", "AclRule", "ConfigError"]
