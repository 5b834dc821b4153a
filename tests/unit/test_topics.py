"""Table tests for topic validation and matching (MQTT 3.1.1 section 4.7)."""
from __future__ import annotations

import pytest

from fanout.mqtt.topics import (
    InvalidTopic, is_sys_topic, is_wildcard_filter, topic_matches, validate_topic_filter,
    validate_topic_name,
)

VALID_NAMES = ["a", "/", "a/b", "/a", "a/", "a//b", "$SYS/broker/uptime", "\u00fc/\U0001F600", " ",
               "x" * 65535, "\u00e9" * 32767]
INVALID_NAMES = ["", "a/+", "+", "#", "a/#", "a+b", "a\x00b", "x" * 65536, "\u00e9" * 32768, "\ud800"]
VALID_FILTERS = ["a", "#", "+", "a/#", "a/+", "+/+", "+/#", "/#", "a/+/b/#", "$SYS/#", "/", "//",
                 "+/", "a//+", "x" * 65535]
INVALID_FILTERS = ["", "a#", "a/#/b", "#/a", "##", "a/b#", "a+", "+a", "a/+b/c", "a/b+", "++",
                   "a\x00", "x" * 65536, "\ud800", "#/"]


@pytest.mark.parametrize("name", VALID_NAMES, ids=lambda s: repr(s[:20]))
def test_valid_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name", INVALID_NAMES, ids=lambda s: repr(s[:20]))
def test_invalid_topic_names(name):
    with pytest.raises(InvalidTopic):
        validate_topic_name(name)


@pytest.mark.parametrize("f", VALID_FILTERS, ids=lambda s: repr(s[:20]))
def test_valid_topic_filters(f):
    validate_topic_filter(f)


@pytest.mark.parametrize("f", INVALID_FILTERS, ids=lambda s: repr(s[:20]))
def test_invalid_topic_filters(f):
    with pytest.raises(InvalidTopic) as info:
        validate_topic_filter(f)
    assert "MQTT-" in str(info.value)


def test_invalid_topic_is_value_error():
    assert issubclass(InvalidTopic, ValueError)
    with pytest.raises(InvalidTopic):
        validate_topic_filter(b"a")
    with pytest.raises(InvalidTopic, match="topic name must be a str, got int"):
        validate_topic_name(5)  # what a config file may hold: an InvalidTopic, compiled or not (not a TypeError)


MATCHES = [
    # (filter, topic, expected)
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
    ("a/b", "a/b/c", False),
    ("a/#", "a", True),  # MQTT-4.7.1-2: '#' includes the parent level
    ("a/#", "a/b", True),
    ("a/#", "a/b/c", True),
    ("a/#", "ab", False),
    ("a/#", "b/a", False),
    ("#", "a", True),
    ("#", "a/b/c", True),
    ("#", "/", True),
    ("/#", "/a", True),
    ("/#", "a", False),
    ("+", "a", True),
    ("+", "a/b", False),
    ("+", "", True),
    ("+", "/", False),
    ("+/+", "/", True),  # two empty levels
    ("a/+", "a/", True),
    ("a/+", "a", False),
    ("a/+/c", "a/b/c", True),
    ("a/+/c", "a/b/d", False),
    ("a/+/#", "a/b", True),
    ("a/+/#", "a", False),
    ("+/b/#", "x/b", True),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    # MQTT-4.7.2-1: a wildcard first level never matches a '$' topic.
    ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False),
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS/x", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/+", "$SYS/x", True),
    ("a/#", "a/$x", True),  # only the first level is special
    ("$SDV-FANOUT/data/+", "$SDV-FANOUT/data/d1", True),
    ("A/b", "a/b", False),  # MQTT-4.7.3-4: case sensitive, no normalisation
    ("a/b ", "a/b", False),
]


@pytest.mark.parametrize("f,topic,expected", MATCHES)
def test_topic_matches(f, topic, expected):
    assert topic_matches(f, topic) is expected


def test_sys_and_wildcard_helpers():
    assert is_sys_topic("$SYS/broker/uptime")
    assert is_sys_topic("$SDV-FANOUT/trigger")
    assert not is_sys_topic("a/$SYS")
    assert not is_sys_topic("")
    assert is_wildcard_filter("a/+") and is_wildcard_filter("#")
    assert not is_wildcard_filter("a/b")
