# Over 500 lines: one validated schema for every section of fanout.toml (units, env overrides, the error naming the key), read in one place.
"""Cluster configuration: one TOML file, every key optional, env overrides, validated at start.

Strategy: a declarative schema (section -> key -> ``Field``) drives parsing, env overrides
(``FANOUT_<SECTION>_<KEY>``), defaults and the ``fanout config show`` output, so adding a key is one
line. Human units (``20s``, ``1MiB``) are parsed once here into integers whose attribute names carry
the unit (``sys_interval_ms``); the rest of the code never sees strings. Any unknown section or key,
or a bad value, raises ``ConfigError`` naming it (``mqtt.port: ...``) so start-up stops with a
message the operator can act on.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from fanout.mqtt.settings import AclRule, ConfigError, MQTTSettings, UserConfig
from fanout.topics.settings import parse_topics, spec_toml
from fanout.units import duration_parser, format_duration_ms, format_size_bytes, size_parser

ROLES = ("platform", "vehicle", "client", "admin")
ACL_ACTIONS = ("publish", "subscribe")


# ---------------------------------------------------------------------------------------------
# value parsers: each takes the raw TOML/env value and returns the typed value or raises ValueError


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected an integer, got {v!r}")
        if lo is not None and v < lo:
            raise ValueError(f"must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise ValueError(f"must be <= {hi}, got {v}")
        return v

    return parse


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return v.lower() in ("1", "true", "yes", "on")
    raise ValueError(f"expected true or false, got {v!r}")


def _str(choices: tuple[str, ...] | None = None, nonempty: bool = True) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        if not isinstance(v, str):
            raise ValueError(f"expected a string, got {v!r}")
        if nonempty and not v:
            raise ValueError("must not be empty")
        if choices is not None and v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    return parse


_duration = duration_parser
_size = size_parser


def _fraction(lo: float = 0.0, hi: float = 1.0) -> Callable[[Any], float]:
    def parse(v: Any) -> float:
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise ValueError(f"expected a number, got {v!r}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"expected a number, got {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"must be between {lo} and {hi}, got {v}")
        return float(v)

    return parse


def _topic_prefix(v: Any) -> str:
    s = _str()(v)
    if "{VIN}" not in s:
        raise ValueError(f"must contain the placeholder {{VIN}}, got {s!r}")
    if any(c in s for c in "+#\x00") or s.startswith("/") or s.endswith("/"):
        raise ValueError(f"must be a topic name without wildcards or leading/trailing '/', got {s!r}")
    return s


@dataclass(frozen=True, slots=True)
class Field:
    """One config key: its attribute name (with unit suffix), default (in TOML form) and parser."""

    attr: str
    default: Any
    parse: Callable[[Any], Any]
    doc: str = ""


SCHEMA: dict[str, dict[str, Field]] = {
    "mqtt": {
        "host": Field("host", "127.0.0.1", _str(), "listener address"),
        "port": Field("port", 1883, _int(0, 65535), "listener port (0 = any free port)"),
        "tls_port": Field("tls_port", 0, _int(0, 65535), "MQTT over TLS listener port (0 = off)"),
        "ws_port": Field("ws_port", 0, _int(0, 65535), "MQTT over WebSocket listener port, path /mqtt (0 = off)"),
        "wss_port": Field("wss_port", 0, _int(0, 65535), "MQTT over WebSocket over TLS listener port, path /mqtt (0 = off)"),
        "tls_cert": Field("tls_cert", "", _str(nonempty=False), "PEM server certificate chain of the TLS listeners (reloaded on SIGHUP)"),
        "tls_key": Field("tls_key", "", _str(nonempty=False), "PEM private key of tls_cert"),
        "tls_ca": Field("tls_ca", "", _str(nonempty=False), "PEM CA bundle that client certificates must chain to"),
        "tls_client_auth": Field("tls_client_auth", "none", _str(("none", "optional", "required")), "client certificates: none, optional (verified if presented) or required"),
        "max_tls_handshakes": Field("max_tls_handshakes", 1024, _int(1, 1_000_000), "TLS handshakes in progress at once per listener process (mqtts and wss together; each holds ~50 KiB until done or connect_timeout); a connection past it is closed at once, counted in $SYS/broker/limits/tls_handshakes"),
        "anonymous_role": Field("anonymous_role", "client", _str(ROLES + ("none",)), "role of clients without username ('none' refuses them)"),
        "cert_role": Field("cert_role", "vehicle", _str(ROLES), "role of a verified client certificate whose CN names no [users.NAME] (a vehicle's client id must equal its CN)"),
        "max_connect_size": Field("max_connect_size_bytes", "64KiB", _size(64), "largest CONNECT accepted, before authentication; larger closes the connection"),
        "max_packet_size": Field("max_packet_size_bytes", "1MiB", _size(64), "largest packet accepted; larger closes the connection"),
        "max_platform_packet_size": Field("max_platform_packet_size_bytes", "64MiB", _size(64), "largest packet from platform/admin logins (a 1,000,000-VIN trigger is ~20 MB of JSON)"),
        "max_topic_levels": Field("max_topic_levels", 128, _int(1, 32768), "most levels in a topic or filter: a deeper filter gets SUBACK 0x80, a deeper topic is acknowledged but not delivered"),
        "max_topic_length": Field("max_topic_length_bytes", "4KiB", _size(1, 65535), "longest topic or filter (UTF-8 bytes), treated as max_topic_levels is"),
        "max_subscriptions_per_client": Field("max_subscriptions_per_client", 1000, _int(1), "filters one session may hold; more get SUBACK 0x80"),
        "sys_interval": Field("sys_interval_ms", "10s", _duration(0), "$SYS publish interval (0 = off)"),
        "connect_timeout": Field("connect_timeout_ms", "10s", _duration(100), "drop a connection that sends no CONNECT within this"),
        "max_offline_messages": Field("max_offline_messages", 1000, _int(0), "per-session offline queue bound"),
        "offline_drop": Field("offline_drop", "oldest", _str(("oldest", "newest")), "which message a full offline queue drops (counted and logged)"),
        "max_session_bytes": Field("max_session_bytes", "16MiB", _size(1024), "bytes of messages one session holds, queued + in flight; past it offline_drop applies as past max_offline_messages (a session holding nothing still takes one message)"),
        "max_queued_bytes": Field("max_queued_bytes", "1GiB", _size(1024), "bytes of queued messages of all sessions of a node together; past it offline_drop applies"),
        "offline_queued_fraction": Field("offline_queued_fraction", 0.25, _fraction(0.0, 0.9), "part of max_queued_bytes the queues of disconnected persistent sessions may hold together; past it offline_drop applies (the rest is for connected sessions, watched by the back-pressure)"),
        "backpressure_high_fraction": Field("backpressure_high_fraction", 0.8, _fraction(0.01, 1.0), "when the queues of connected sessions hold this part of what max_queued_bytes leaves them, the node stops reading from publishing connections"),
        "backpressure_low_fraction": Field("backpressure_low_fraction", 0.5, _fraction(0.0, 1.0), "reading from paused publishers resumes when those queues are back below this part (less than backpressure_high_fraction)"),
        "max_write_buffer": Field("max_write_buffer_bytes", "8MiB", _size(64 * 1024), "bytes waiting to be written to a client that does not read; past it the connection is closed (a persistent session stays, within max_session_bytes)"),
        "max_retained_messages": Field("max_retained_messages", 10_000, _int(0), "retained topics kept ($SYS excluded); a new retained topic past it is delivered but not retained"),
        "max_retained_bytes": Field("max_retained_bytes", "64MiB", _size(0), "topic + payload bytes of retained messages kept ($SYS excluded); a retained message that does not fit is delivered but not retained, and removes the topic's previous one"),
        "match_cache_entries": Field("match_cache_entries", 65_536, _int(1, 10_000_000), "topic names whose matching subscribers a node keeps (~200 bytes each; cleared on every subscription change), and apart the durable topics they are appended to; past it the newest is evicted. Size it to the distinct topics published per node (each vehicle's heartbeat, online, response...)"),
        "max_inflight": Field("max_inflight", 32, _int(1, 65535), "unacked outbound QoS 1/2 messages per session before queueing"),
        "max_sessions": Field("max_sessions", 2_000_000, _int(1), "persistent sessions kept"),
        "session_expiry": Field("session_expiry_ms", "2h", _duration(0), "drop a disconnected persistent session after this (0 = never)"),
        "takeover_window": Field("takeover_window_ms", "10s", _duration(0), "window for counting takeovers of one client id"),
        "takeover_limit": Field("takeover_limit", 10, _int(1), "takeovers of one client id per window before connects are throttled"),
        "max_connections": Field("max_connections", 1_000_000, _int(1), "concurrent connections per listener process"),
        "listeners_per_node": Field("listeners_per_node", 1, _int(1, 64), "MQTT listener processes per Ray node sharing the port (SO_REUSEPORT); each holds at most RLIMIT_NOFILE connections"),
        "dev_platform_login": Field("dev_platform_login", True, _bool, "platform/platform login on loopback when no users are configured"),
        "auth_fail_limit_per_host": Field("auth_fail_limit_per_host", 20, _int(1), "failed logins from one address per auth_fail_window before its password logins are refused (CONNACK 3)"),
        "auth_fail_limit_total": Field("auth_fail_limit_total", 200, _int(1), "failed logins overall per auth_fail_window before password logins needing a hash are refused"),
        "auth_fail_window": Field("auth_fail_window_ms", "60s", _duration(1000), "window for counting failed logins"),
        "auth_threads": Field("auth_threads", 1, _int(1, 16), "threads running PBKDF2 verifications (cache hits need none)"),
        "auth_queue": Field("auth_queue", 32, _int(1, 100_000), "PBKDF2 verifications waiting or running before a newcomer is refused (CONNACK 3)"),
        "receive_maximum": Field("receive_maximum", 1024, _int(1, 65535), "MQTT 5: unacknowledged QoS 1/2 PUBLISHes a client may send (CONNACK Receive Maximum); more gets DISCONNECT 0x93"),
        "topic_alias_maximum": Field("topic_alias_maximum", 64, _int(0, 65535), "MQTT 5: topic aliases a client may set per connection (CONNACK Topic Alias Maximum; 0 = none)"),
        "send_topic_aliases": Field("send_topic_aliases", True, _bool, "MQTT 5: give topics aliases in PUBLISHes to a client that announced a Topic Alias Maximum (the first PUBLISH of a topic carries it, later ones only the alias)"),
        "max_keepalive": Field("max_keepalive_ms", "60s", _duration(0), "MQTT 5: the longest keep alive a client gets; a longer (or zero) one is replaced by this in CONNACK Server Keep Alive (0 = no cap; 3.1.1 clients keep theirs)"),
    },
    "fanout": {
        "topic_prefix": Field("topic_prefix", "agent/{VIN}/proxy/request", _topic_prefix, "delivery topic is <prefix>/<request_id>"),
        "dispatchers": Field("dispatchers", 0, _int(0, 4096), "dispatcher pool size = store shards (0 = the data directory's count, else one per 1 + replicas CPUs left by the listeners)"),
        "replicas": Field("replicas", 1, _int(0, 16), "store replicas per shard"),
        "min_replicas_to_ack": Field("min_replicas_to_ack", -1, _int(-1, 16), "replicas that must ack a write (-1 = 1 on multi-node, 0 on one machine)"),
        "data_retention": Field("data_retention_ms", "7d", _duration(1000), "blobs and queued rows older than this are garbage"),
        "gc_interval": Field("gc_interval_ms", "1h", _duration(0), "export + Spark GC period (0 = never)"),
        "max_batch": Field("max_batch", 1_000_000, _int(1, 10_000_000), "most VINs in one trigger"),
        "topic_group_inflight": Field("topic_group_inflight", 256, _int(1, 65535), "consumer groups: messages of one group partition in flight to its member at once (also caps a member's window)"),
        "topic_groups_per_client": Field("topic_groups_per_client", 16, _int(1, 100_000), "consumer groups: $share subscriptions on durable topics one client may hold; past it a subscription is granted but joins nothing (counted, logged)"),
        "topic_group_members": Field("topic_group_members", 1000, _int(1, 1_000_000), "consumer groups: members of one group; a join past it is refused (counted, logged)"),
        "topic_groups": Field("topic_groups", 10_000, _int(1, 10_000_000), "consumer groups: (topic, group) pairs one dispatcher serves at once; a join creating one more is refused (counted, logged)"),
        "max_blob_size": Field("max_blob_size_bytes", "1MiB", _size(1), "largest data blob"),
        "failover_timeout": Field("failover_timeout_ms", "1500ms", _duration(100), "a primary silent this long, on a node that is silent too, is replaced"),
        "heartbeat_interval": Field("heartbeat_interval_ms", "250ms", _duration(10), "how often the controller probes each shard primary"),
        "replica_timeout": Field("replica_timeout_ms", "2s", _duration(10), "a replica slower than this leaves the ack set; a write short of min_replicas_to_ack fails after it"),
        "tick": Field("tick_ms", "2ms", _duration(0), "dispatcher batching tick"),
        "max_pending_appends": Field("max_pending_appends", 10_000, _int(1), "publishes to durable topics one node holds unacknowledged while their appends are written; past it a QoS 0 one is not appended (still routed), a QoS 1/2 one is refused (MQTT 5: PUBACK 0x97; 3.1.1: connection closed, the client resends), counted as appends_refused"),
        "max_pending_append_bytes": Field("max_pending_append_bytes", "64MiB", _size(64 * 1024), "payload bytes of publishes to durable topics one node holds while their appends are written; past it they are treated as past max_pending_appends"),
        "max_forward_queue": Field("max_forward_queue_bytes", "64MiB", _size(64 * 1024), "bytes of publishes queued for one peer node while its previous forward call is in flight; past it further publishes for that peer are dropped (counted as forwards_dropped, logged)"),
    },
    "storage": {
        "data_dir": Field("data_dir", "./var", _str(), "root of the LMDB shard directories"),
        "map_size": Field("map_size_bytes", "256MiB", _size(1 << 16), "initial LMDB map size per shard (grows on demand)"),
        "max_map_size": Field("max_map_size_bytes", "64GiB", _size(1 << 16), "LMDB map size ceiling per shard"),
        "sync": Field("sync", True, _bool, "fsync each commit (durability of acknowledged writes)"),
        "replication_log": Field("replication_log_entries", 10_000, _int(16), "batches kept for replica catch-up"),
        "replication_log_size": Field("replication_log_size_bytes", "64MiB", _size(1 << 16), "bytes of batches kept for replica catch-up (older needs a snapshot)"),
    },
    "gc": {
        "spark_master": Field("spark_master", "local[2]", _str(), "Spark master URL"),
        "dedup_content": Field("dedup_content", False, _bool, "repoint rows of identical blobs to one data id"),
        "export_dir": Field("export_dir", "", _str(nonempty=False), "snapshot export directory (default <data_dir>/export)"),
    },
    "log": {
        "json": Field("json", False, _bool, "JSON log lines (production) instead of console"),
        "level": Field("level", "info", _str(("debug", "info", "warning", "error")), "log level"),
    },
    "cluster": {
        "address": Field("address", "local", _str(), "Ray address: local, auto or HOST:PORT"),
        "num_cpus": Field("num_cpus", 0, _int(0), "CPUs for a local Ray instance (0 = all)"),
        "object_store_memory": Field("object_store_memory_bytes", "256MiB", _size(78 << 20), "object store of a local Ray instance"),
        "ray_observability": Field("ray_observability", False, _bool, "Ray's own task events, handler statistics and metrics (Ray dashboard task list, `ray list tasks`, Ray's Prometheus metrics); off, the fanout actors report no task events and a local Ray instance collects none of the three (their cost: docs/profile.md); sdv-fanout's /metrics, $SYS and console do not use them"),
        "direct_channels": Field("direct_channels", True, _bool, "hot actor calls (replication, ...) over authenticated direct TCP channels instead of Ray calls (~50 µs instead of ~1.8 ms of CPU each)"),
        "channel_host": Field("channel_host", "127.0.0.1", _str(), "address the actors' direct channels listen on: 127.0.0.1 on one machine, 'node' = the Ray node's IP for a cluster spanning machines"),
        "channel_tls": Field("channel_tls", "auto", _str(("auto", "on", "off")), "TLS 1.3 on the direct channels (one self-signed certificate per Ray cluster, pinned): 'auto' = when channel_host is not a loopback address, i.e. the channels cross machines"),
        "channel_max_frame": Field("channel_max_frame_bytes", "80MiB", _size(1 << 20, 1 << 31), "largest message on a direct channel; a larger one closes that connection"),
    },
    # HTTP on the controller's node: /metrics, /api/..., the / console (cluster.http)
    "http": {
        "host": Field("host", "127.0.0.1", _str(), "HTTP listener address (metrics, JSON API, console)"),
        "port": Field("port", 8080, _int(0, 65535), "HTTP listener port (0 = no HTTP listener)"),
    },
}


class Section:
    """Attribute access over one parsed section (``cfg.mqtt.port``)."""

    __slots__ = ("_name", "_values")

    def __init__(self, name: str, values: dict[str, Any]) -> None:
        self._name = name
        self._values = values

    def __getattr__(self, attr: str) -> Any:
        try:
            return self._values[attr]
        except KeyError:
            raise AttributeError(f"config section [{self._name}] has no attribute {attr!r}") from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable (a Config is passed to Ray actors); without this, unpickling recurses in __getattr__.
        return (Section, (self._name, self._values))


@dataclass(frozen=True)
class Config:
    mqtt: Section
    fanout: Section
    storage: Section
    gc: Section
    log: Section
    cluster: Section
    http: Section
    users: dict[str, UserConfig] = field(default_factory=dict)
    acl: tuple[AclRule, ...] = ()
    source: str | None = None
    topics: tuple[Any, ...] = ()  # storage.topics.TopicSpec of each [[topics]] table (fanout.topics.settings)
    builtin_topics: dict[str, tuple[int, int]] = field(default_factory=dict)  # receipts: (retention_ms, bytes)

    def replace(self, section: str, **values: Any) -> "Config":
        """A copy with some keys of one section set (values in TOML form, validated)."""
        raw = {s: {k: v for k, v in getattr(self, s).as_dict().items()} for s in SCHEMA}
        sec = getattr(self, section)
        merged = sec.as_dict()
        for key, value in values.items():
            f = SCHEMA[section].get(key)
            if f is None:
                raise ConfigError(f"{section}.{key}: unknown key")
            merged[f.attr] = _parse_field(section, key, f, value)
        raw[section] = merged
        kwargs = {s: Section(s, raw[s]) for s in SCHEMA}
        return Config(**kwargs, users=self.users, acl=self.acl, source=self.source, topics=self.topics,
                      builtin_topics=self.builtin_topics)

    def to_toml_dict(self) -> dict[str, Any]:
        """The effective configuration in TOML form (for ``fanout config show``); hashes are masked."""
        out: dict[str, Any] = {}
        for section, keys in SCHEMA.items():
            values = getattr(self, section).as_dict()
            out[section] = {key: _display(f, values[f.attr]) for key, f in keys.items()}
        out["users"] = {u.name: {"password_hash": "***", "role": u.role} for u in self.users.values()}
        out["acl"] = [
            {k: v for k, v in (("action", r.action), ("topic", r.topic), ("allow", r.allow), ("role", r.role), ("user", r.user)) if v is not None}
            for r in self.acl
        ]
        out["topics"] = [spec_toml(t) for t in self.topics] + [
            {"name": name, "retention": format_duration_ms(ms), "retention_bytes": format_size_bytes(size)}
            for name, (ms, size) in self.builtin_topics.items()]
        return out


def _display(f: Field, value: Any) -> Any:
    if f.attr.endswith("_ms"):
        return format_duration_ms(value)
    if f.attr.endswith("_bytes"):
        return format_size_bytes(value)
    return value


def _parse_field(section: str, key: str, f: Field, value: Any) -> Any:
    try:
        return f.parse(value)
    except ValueError as exc:
        raise ConfigError(f"{section}.{key}: {exc}") from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Load, merge and validate the configuration.

    Precedence: defaults < TOML file < ``FANOUT_<SECTION>_<KEY>`` environment < ``overrides``
    (command-line flags).

    Args:
        path: TOML file, or None for defaults only.
        env: environment to read overrides from (defaults to ``os.environ``).
        overrides: ``{"mqtt": {"port": 1884}}``-shaped values from the command line.

    Returns:
        The validated Config.

    Raises:
        ConfigError: unreadable file, invalid TOML, unknown section or key, bad value; the
            message names the section and key.
    """
    raw: dict[str, Any] = {}
    source = None
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {p} cannot be read: {exc}") from None
        source = str(p)
    unknown = set(raw) - set(SCHEMA) - {"users", "acl", "topics"}
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown section (known: {', '.join([*SCHEMA, 'users', 'acl', 'topics'])})")

    sections: dict[str, Section] = {}
    env = os.environ if env is None else env
    for section, keys in SCHEMA.items():
        given = raw.get(section, {})
        if not isinstance(given, dict):
            raise ConfigError(f"{section}: must be a table")
        for key in given:
            if key not in keys:
                raise ConfigError(f"{section}.{key}: unknown key (known: {', '.join(keys)})")
        values: dict[str, Any] = {}
        for key, f in keys.items():
            value = given.get(key, f.default)
            env_name = f"FANOUT_{section.upper()}_{key.upper()}"
            if env_name in env:
                value = env[env_name]
            if overrides and key in overrides.get(section, {}) and overrides[section][key] is not None:
                value = overrides[section][key]
            values[f.attr] = _parse_field(section, key, f, value)
        sections[section] = Section(section, values)
    for section in (overrides or {}):
        if section not in SCHEMA:
            raise ConfigError(f"{section}: unknown section")
    _check_listeners(sections["mqtt"])
    topics, builtin = parse_topics(raw.get("topics", []))
    return Config(**sections, users=_parse_users(raw.get("users", {})), acl=_parse_acl(raw.get("acl", [])), source=source,
                  topics=topics, builtin_topics=builtin)


def _check_listeners(m: Section) -> None:
    """Cross-key checks of the TLS/WebSocket keys (the files themselves are read when a listener starts:
    a config may be checked on a machine that does not hold the certificates)."""
    if (m.tls_port or m.wss_port) and not (m.tls_cert and m.tls_key):
        key = "tls_port" if m.tls_port else "wss_port"
        raise ConfigError(f"mqtt.{key}: set, but mqtt.tls_cert and mqtt.tls_key are not")
    if bool(m.tls_cert) != bool(m.tls_key):
        raise ConfigError("mqtt.tls_key: set tls_cert and tls_key together" if m.tls_cert else
                          "mqtt.tls_cert: set tls_cert and tls_key together")
    if m.tls_client_auth != "none" and not m.tls_ca:
        raise ConfigError(f"mqtt.tls_ca: required when mqtt.tls_client_auth is {m.tls_client_auth!r}")
    if m.backpressure_low_fraction >= m.backpressure_high_fraction:
        raise ConfigError(f"mqtt.backpressure_low_fraction: {m.backpressure_low_fraction} must be less than "
                          f"mqtt.backpressure_high_fraction ({m.backpressure_high_fraction})")
    ports = [(k, getattr(m, k)) for k in ("port", "tls_port", "ws_port", "wss_port") if getattr(m, k)]
    for i, (k, v) in enumerate(ports):
        for k2, v2 in ports[:i]:
            if v == v2:
                raise ConfigError(f"mqtt.{k}: {v} is also mqtt.{k2}")


def _parse_users(raw: Any) -> dict[str, UserConfig]:
    if not isinstance(raw, dict):
        raise ConfigError("users: must be a table of [users.<name>] tables")
    users = {}
    for name, spec in raw.items():
        where = f"users.{name}"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: must be a table with password_hash and role")
        extra = set(spec) - {"password_hash", "role"}
        if extra:
            raise ConfigError(f"{where}.{sorted(extra)[0]}: unknown key (known: password_hash, role)")
        if "password_hash" not in spec:
            raise ConfigError(f"{where}.password_hash: missing (create one with `fanout passwd`)")
        pw = spec["password_hash"]
        if not isinstance(pw, str) or not pw.startswith("pbkdf2_sha256$"):
            raise ConfigError(f"{where}.password_hash: not a hash made by `fanout passwd`")
        role = spec.get("role", "client")
        if role not in ROLES:
            raise ConfigError(f"{where}.role: must be one of {', '.join(ROLES)}, got {role!r}")
        users[name] = UserConfig(name, pw, role)
    return users


def _parse_acl(raw: Any) -> tuple[AclRule, ...]:
    if not isinstance(raw, list):
        raise ConfigError("acl: must be an array of [[acl]] tables")
    rules = []
    for i, spec in enumerate(raw):
        where = f"acl[{i}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: must be a table")
        extra = set(spec) - {"action", "topic", "allow", "role", "user"}
        if extra:
            raise ConfigError(f"{where}.{sorted(extra)[0]}: unknown key (known: action, topic, allow, role, user)")
        for key in ("action", "topic", "allow"):
            if key not in spec:
                raise ConfigError(f"{where}.{key}: missing")
        action = spec["action"]
        if action not in ACL_ACTIONS:
            raise ConfigError(f"{where}.action: must be publish or subscribe, got {action!r}")
        topic = spec["topic"]
        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"{where}.topic: must be a non-empty topic filter")
        if not isinstance(spec["allow"], bool):
            raise ConfigError(f"{where}.allow: must be true or false")
        role = spec.get("role")
        if role is not None and role not in ROLES:
            raise ConfigError(f"{where}.role: must be one of {', '.join(ROLES)}, got {role!r}")
        user = spec.get("user")
        if user is not None and not isinstance(user, str):
            raise ConfigError(f"{where}.user: must be a string")
        rules.append(AclRule(action, topic, spec["allow"], role, user))
    return tuple(rules)


def listener_settings(config: Config) -> Any:
    """The node's optional TLS / WebSocket listeners (:class:`fanout.mqtt.tls.ListenerSettings`).

    Raises:
        ConfigError: inconsistent keys (files are checked when the listener is built).
    """
    from fanout.mqtt.tls import ListenerSettings, TLSSettings

    m = config.mqtt
    tls = None
    if m.tls_cert and m.tls_key:
        tls = TLSSettings(cert_file=m.tls_cert, key_file=m.tls_key, ca_file=m.tls_ca or None,
                          client_auth=m.tls_client_auth)
    return ListenerSettings(tls_port=m.tls_port, ws_port=m.ws_port, wss_port=m.wss_port, tls=tls,
                            max_tls_handshakes=m.max_tls_handshakes)


# MQTTSettings fields that do not come from the [mqtt] section of the same name
_NOT_FROM_MQTT_SECTION = frozenset({"vehicle_client_id", "users", "acl"})


def mqtt_settings(config: Config) -> MQTTSettings:
    """The MQTT package's settings (:class:`fanout.mqtt.settings.MQTTSettings`) from a loaded config.

    Every other field is the ``[mqtt]`` value of the same attribute name (already in ms or bytes); the
    vehicle client-id rule is the project's one VIN rule, ``storage.keys.VIN_RE``.

    Args:
        config: the loaded configuration.

    Returns:
        The settings to pass to ``MQTTServer``, ``Broker`` and ``AccessControl``.
    """
    from storage.keys import VIN_RE  # here, not at the top: importing the storage package costs ~0.2 s

    m = config.mqtt
    plain = {f.name: getattr(m, f.name) for f in dataclasses.fields(MQTTSettings) if f.name not in _NOT_FROM_MQTT_SECTION}
    return MQTTSettings(vehicle_client_id=VIN_RE, users=tuple(config.users.values()), acl=config.acl, **plain)


def config_fields_doc() -> list[tuple[str, str, Any, str]]:
    """(section, key, default, doc) rows for documentation."""
    return [(s, k, f.default, f.doc) for s, keys in SCHEMA.items() for k, f in keys.items()]


__all__ = ["Config", "ConfigError", "UserConfig", "AclRule", "load_config", "mqtt_settings", "listener_settings",
           "ROLES", "SCHEMA"]
