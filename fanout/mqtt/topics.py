"""Topic names and topic filters (MQTT 3.1.1 section 4.7): validation and matching.

Strategy: pure string functions, no state except a small bounded cache of split filters. Topic names
are what PUBLISH carries (no wildcards); topic filters are what SUBSCRIBE carries (``+`` for exactly
one level, ``#`` for any number of trailing levels, including none, so ``a/#`` matches ``a``).
Topics starting with ``$`` are reserved for the server and are not matched by a filter whose first
character is a wildcard (MQTT-4.7.2-1). Validation raises :class:`InvalidTopic` naming the rule;
the broker answers SUBACK 0x80 for a filter that fails it.
"""
from __future__ import annotations

MAX_TOPIC_BYTES = 0xFFFF  # MQTT-4.7.3-3: topics are UTF-8 strings of at most 65535 bytes


class InvalidTopic(ValueError):
    """A topic name or topic filter breaks a rule of MQTT 3.1.1 section 4.7."""


def _not_str(t: object, what: str) -> InvalidTopic:
    return InvalidTopic(f"{what} must be a str, got {type(t).__name__}")


def _check_common(t: str, what: str) -> None:
    if not t:
        raise InvalidTopic(f"{what} must be at least one character long (MQTT-4.7.3-1)")
    if "\x00" in t:
        raise InvalidTopic(f"{what} must not contain U+0000 (MQTT-4.7.3-2)")
    if t.isascii():
        size = len(t)
    else:
        try:
            size = len(t.encode("utf-8"))
        except UnicodeEncodeError:  # lone surrogates cannot go on the wire
            raise InvalidTopic(f"{what} is not encodable as UTF-8 (MQTT-1.5.3-1)") from None
    if size > MAX_TOPIC_BYTES:
        raise InvalidTopic(f"{what} is {size} bytes of UTF-8, the maximum is 65535 (MQTT-4.7.3-3)")


def validate_topic_name(t: object) -> None:
    """Check a topic name (PUBLISH, will topic).

    Args:
        t: the topic name.

    Raises:
        InvalidTopic: empty (MQTT-4.7.3-1), contains U+0000 (MQTT-4.7.3-2), longer than 65535 bytes
            of UTF-8 (MQTT-4.7.3-3), or contains ``+``/``#`` (MQTT-4.7.1-1, MQTT-3.3.2-2).
    """
    if not isinstance(t, str):  # config and JSON hand over whatever they hold: an InvalidTopic, not a TypeError
        raise _not_str(t, "topic name")
    _check_common(t, "topic name")
    if "+" in t or "#" in t:
        raise InvalidTopic(f"topic name {t!r} must not contain wildcards (MQTT-4.7.1-1, MQTT-3.3.2-2)")


def validate_topic_filter(f: object) -> None:
    """Check a topic filter (SUBSCRIBE, UNSUBSCRIBE, ACL rules).

    Args:
        f: the topic filter.

    Raises:
        InvalidTopic: empty (MQTT-4.7.3-1), contains U+0000 (MQTT-4.7.3-2), longer than 65535 bytes
            of UTF-8 (MQTT-4.7.3-3), ``#`` not alone in the last level (MQTT-4.7.1-2), ``+`` not
            alone in its level (MQTT-4.7.1-3).
    """
    if not isinstance(f, str):
        raise _not_str(f, "topic filter")
    _check_common(f, "topic filter")
    if "#" in f:
        # MQTT-4.7.1-2: '#' on its own or after a separator, and the last character.
        if f.index("#") != len(f) - 1 or (len(f) > 1 and f[-2] != "/"):
            raise InvalidTopic(
                f"topic filter {f!r}: '#' must be the last character, alone in its level (MQTT-4.7.1-2)")
    if "+" in f:
        for level in f.split("/"):
            if "+" in level and level != "+":
                raise InvalidTopic(
                    f"topic filter {f!r}: '+' must occupy an entire level (MQTT-4.7.1-3)")


def over_limits(t: str, max_levels: int, max_bytes: int) -> str | None:
    """Which configured limit a topic name or filter exceeds, checked before anything splits it.

    Args:
        t: a topic name or filter (valid or not).
        max_levels: most levels allowed (``mqtt.max_topic_levels``).
        max_bytes: most UTF-8 bytes allowed (``mqtt.max_topic_length``).

    Returns:
        ``"topic_length"``, ``"topic_levels"`` (the names of :data:`fanout.mqtt.caps.CAPS`), or None.
    """
    n = len(t)
    if n > max_bytes or (n * 4 > max_bytes and not t.isascii() and len(t.encode("utf-8", "surrogatepass")) > max_bytes):
        return "topic_length"
    if n >= max_levels and t.count("/") >= max_levels:
        return "topic_levels"
    return None


def is_wildcard_filter(f: str) -> bool:
    """True if the filter contains ``+`` or ``#`` (so it may match other topics than itself)."""
    return "+" in f or "#" in f


def is_sys_topic(topic: str) -> bool:
    """True for topics reserved for the server: those starting with ``$`` (section 4.7.2).

    This covers ``$SYS/...`` and ``$SDV-FANOUT/...``; such topics are not matched by filters starting
    with a wildcard (MQTT-4.7.2-1).

    Args:
        topic: a topic name or filter.
    """
    return topic[:1] == "$"


_SPLIT_CACHE: dict[str, list[str]] = {}
_SPLIT_CACHE_MAX = 4096


def _split_filter(f: str) -> list[str]:
    levels = _SPLIT_CACHE.get(f)
    if levels is None:
        if len(_SPLIT_CACHE) >= _SPLIT_CACHE_MAX:
            _SPLIT_CACHE.clear()  # bounded: ACL filters are few, so clearing is rare
        levels = _SPLIT_CACHE[f] = f.split("/")
    return levels


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Tell whether a topic name matches a topic filter.

    The filter is assumed valid (:func:`validate_topic_filter`); an invalid one simply matches less.

    Args:
        topic_filter: e.g. ``agent/+/proxy/#``.
        topic: a topic name, e.g. ``agent/VIN1/proxy/request/r1``.

    Returns:
        True on a match. ``#`` matches its parent level too (``a/#`` matches ``a``, MQTT-4.7.1-2);
        ``+`` matches exactly one level, possibly empty; a filter starting with ``+`` or ``#`` does
        not match a topic starting with ``$`` (MQTT-4.7.2-1).
    """
    if topic_filter == topic:
        return True
    first = topic_filter[:1]
    if (first == "+" or first == "#") and topic[:1] == "$":
        return False  # MQTT-4.7.2-1
    if "+" not in topic_filter and "#" not in topic_filter:
        return False
    flevels = _split_filter(topic_filter)
    tlevels = topic.split("/")
    n = len(tlevels)
    for i, f in enumerate(flevels):
        if f == "#":
            return True  # covers the parent level too: 'a/#' vs 'a' ends here with i == n
        if i >= n:
            return False
        if f != "+" and f != tlevels[i]:
            return False
    return len(flevels) == n
