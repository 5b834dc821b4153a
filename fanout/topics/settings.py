"""The ``[[topics]]`` tables of the configuration: durable topics, validated at start.

Strategy: each table becomes a :class:`storage.topics.TopicSpec` (the store's catalog row), so the rest of the
code never sees the TOML form; every error names the table and key (``topics[1].filter: ...``) as the other
config errors do. Rules:

- ``name``: ``[A-Za-z0-9._-]{1,64}``, unique. The built-in ``receipts`` topic may appear only to set its
  ``retention`` / ``retention_bytes`` (its filter and partitions are the store's).
- ``filter``: a valid MQTT topic filter, not ``$share/...`` (a consumer group subscribes to it that way), not
  under ``$SDV-FANOUT/`` or ``$SYS/`` (the cluster's own topics), and not the filter of another topic (a
  ``$share/<group>/<filter>`` subscription names the topic by its filter).
- ``partitions``: 0 (the default) = one per store shard.
- ``retention`` (default 7d), ``retention_bytes`` (default 1GiB per partition).
- ``key_level``: the topic level holding the partition key; default the level of the filter's first ``+``
  (``ecp/+/response`` -> 1, the VIN), none when the filter has no ``+`` (the publishing client id is the key).

The store checks the spec again (:func:`storage.topics.check_spec`); its message then names the table only.
"""
from __future__ import annotations

import re
from typing import Any

from fanout.mqtt.settings import ConfigError
from fanout.mqtt.topics import InvalidTopic, validate_topic_filter
from fanout.units import duration_parser, size_parser

NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
RECEIPTS = "receipts"  # storage.topics.RECEIPTS (not imported here: the storage package costs ~0.2 s to import)
DEFAULT_RETENTION = "7d"
DEFAULT_RETENTION_BYTES = "1GiB"
MAX_PARTITIONS = 4096
RESERVED_PREFIXES = ("$SDV-FANOUT/", "$SYS/")
KEYS = ("name", "filter", "partitions", "retention", "retention_bytes", "key_level")


def check_name(name: Any) -> str:
    """A topic name, or ValueError saying why not."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise ValueError(f"must match [A-Za-z0-9._-]{{1,64}}, got {name!r}")
    return name


def check_filter(topic_filter: Any) -> str:
    """A durable topic's filter, or ValueError saying why not."""
    if not isinstance(topic_filter, str):
        raise ValueError(f"expected a string, got {topic_filter!r}")
    try:
        validate_topic_filter(topic_filter)
    except InvalidTopic as exc:
        raise ValueError(str(exc)) from None
    if topic_filter.startswith("$share/") or topic_filter == "$share":
        raise ValueError(f"{topic_filter!r}: a durable topic's filter is not a shared subscription "
                         "($share/<group>/<filter> is how a consumer group subscribes to it)")
    for prefix in RESERVED_PREFIXES:
        if topic_filter.startswith(prefix) or topic_filter == prefix[:-1]:
            raise ValueError(f"{topic_filter!r}: {prefix} topics are the cluster's own")
    return topic_filter


def check_key_level(level: Any, topic_filter: str) -> int:
    if isinstance(level, bool) or not isinstance(level, int):
        raise ValueError(f"expected an integer, got {level!r}")
    levels = topic_filter.split("/")
    if not 0 <= level < len(levels) or levels[level] == "#":
        raise ValueError(f"must name a level of {topic_filter!r} before any '#' (0-{len(levels) - 1}), got {level}")
    return level


def check_partitions(n: Any) -> int:
    if isinstance(n, str) and n.strip().isdigit():
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"expected an integer, got {n!r}")
    if not 0 <= n <= MAX_PARTITIONS:
        raise ValueError(f"must be 0 (one per store shard) to {MAX_PARTITIONS}, got {n}")
    return n


retention_ms = duration_parser(1000)
retention_bytes = size_parser(1024)


def make_spec(name: Any, topic_filter: Any, partitions: Any = 0, retention: Any = DEFAULT_RETENTION,
              retention_size: Any = DEFAULT_RETENTION_BYTES, key_level: Any = None, *, where: str = "topic") -> Any:
    """A validated :class:`storage.topics.TopicSpec` (``fanout topics create`` and the config share it).

    Raises:
        ConfigError: naming ``<where>.<key>``.
    """
    from storage.topics import TopicSpec, default_key_level

    def named(key: str, check: Any, *args: Any) -> Any:
        try:
            return check(*args)
        except ValueError as exc:
            raise ConfigError(f"{where}.{key}: {exc}") from None

    name = named("name", check_name, name)
    if name == RECEIPTS:
        raise ConfigError(f"{where}.name: {RECEIPTS!r} is built in (only its retention and retention_bytes may be set)")
    topic_filter = named("filter", check_filter, topic_filter)
    level = default_key_level(topic_filter) if key_level is None else named("key_level", check_key_level,
                                                                             key_level, topic_filter)
    try:  # the store's own checks (storage.topics.check_spec)
        return TopicSpec.build(name, topic_filter, named("partitions", check_partitions, partitions),
                               named("retention", retention_ms, retention),
                               named("retention_bytes", retention_bytes, retention_size), key_level=level)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_topics(raw: Any) -> tuple[tuple[Any, ...], dict[str, tuple[int, int]]]:
    """Validate the ``[[topics]]`` array.

    Returns:
        (the TopicSpecs in file order, ``{"receipts": (retention_ms, retention_bytes)}`` when the built-in
        topic's retention is set).

    Raises:
        ConfigError: naming ``topics[i].<key>``.
    """
    if not isinstance(raw, list):
        raise ConfigError("topics: must be an array of [[topics]] tables")
    specs: list[Any] = []
    builtin: dict[str, tuple[int, int]] = {}
    names: dict[str, int] = {}
    filters: dict[str, int] = {}
    for i, table in enumerate(raw):
        where = f"topics[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: must be a table")
        extra = sorted(set(table) - set(KEYS))
        if extra:
            raise ConfigError(f"{where}.{extra[0]}: unknown key (known: {', '.join(KEYS)})")
        if "name" not in table:
            raise ConfigError(f"{where}.name: missing")
        name = table["name"]
        if name in names:
            raise ConfigError(f"{where}.name: {name!r} is also topics[{names[name]}]")
        if name == RECEIPTS:
            other = sorted(set(table) - {"name", "retention", "retention_bytes"})
            if other:
                raise ConfigError(f"{where}.{other[0]}: the built-in {RECEIPTS!r} topic takes only retention "
                                  "and retention_bytes")
            try:
                r_ms = retention_ms(table.get("retention", DEFAULT_RETENTION))
            except ValueError as exc:
                raise ConfigError(f"{where}.retention: {exc}") from None
            try:
                r_bytes = retention_bytes(table.get("retention_bytes", DEFAULT_RETENTION_BYTES))
            except ValueError as exc:
                raise ConfigError(f"{where}.retention_bytes: {exc}") from None
            builtin[RECEIPTS] = (r_ms, r_bytes)
            names[name] = i
            continue
        if "filter" not in table:
            raise ConfigError(f"{where}.filter: missing")
        spec = make_spec(name, table["filter"], table.get("partitions", 0), table.get("retention", DEFAULT_RETENTION),
                         table.get("retention_bytes", DEFAULT_RETENTION_BYTES), table.get("key_level"), where=where)
        if spec.filter in filters:
            raise ConfigError(f"{where}.filter: {spec.filter!r} is also the filter of topics[{filters[spec.filter]}]")
        names[name] = i
        filters[spec.filter] = i
        specs.append(spec)
    return tuple(specs), builtin


def spec_toml(spec: Any) -> dict[str, Any]:
    """A TopicSpec in its ``[[topics]]`` form (``fanout config show``)."""
    from fanout.units import format_duration_ms, format_size_bytes

    out: dict[str, Any] = {"name": spec.name, "filter": spec.filter, "partitions": spec.partitions}
    if spec.retention_ms is not None:
        out["retention"] = format_duration_ms(spec.retention_ms)
    if spec.retention_bytes is not None:
        out["retention_bytes"] = format_size_bytes(spec.retention_bytes)
    if spec.key_level is not None:
        out["key_level"] = spec.key_level
    return out


__all__ = ["parse_topics", "make_spec", "spec_toml", "check_filter", "check_name", "RECEIPTS"]
