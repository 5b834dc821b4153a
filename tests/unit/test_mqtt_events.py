"""The broker's event classes (fanout.mqtt.events): value semantics as the frozen dataclasses they replaced had,
on the compiled classes and (test_native) on the Python sources."""
from __future__ import annotations

import copy
import pickle

import pytest

from fanout.mqtt import events, hooks

SAMPLES = [
    events.ClientConnected("VIN1", 3, True, "u", "vehicle", (b"t",), (), vehicle=True),
    events.ClientDisconnected("VIN1", 3, "takeover", False, True, (b"t",)),
    events.Subscribed("VIN1", 3, (("agent/VIN1/#", 1),), (("k", "v"),)),
    events.Unsubscribed("VIN1", 3, ("agent/VIN1/#",)),
    events.Heartbeat("VIN1", 3, "ecp/VIN1/online", b"hb"),
    events.Delivered("VIN1", ("VIN1", "r1"), 1),
    events.DeliveryDropped("VIN1", b"t", True),
    events.IngestTicket("p", 1, 7, "$SDV-FANOUT/trigger", b"{}", 1, False, False, None, True),
    events.LocalPublish("p", "a/b", b"x", 0, True, None),
]


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_an_event_is_a_value(event: events.ClientConnected) -> None:
    cls = type(event)
    twin = cls(*event.values())
    assert twin == event and not (twin != event) and hash(twin) == hash(event)
    assert twin is not event and len({twin, event}) == 1
    assert pickle.loads(pickle.dumps(event)) == event
    assert copy.copy(event) == event and copy.deepcopy(event) == event
    assert repr(event).startswith(f"{cls.__name__}(") and all(f"{name}=" in repr(event) for name in cls.FIELDS)
    assert event.values() == tuple(getattr(event, name) for name in cls.FIELDS)


def test_events_differ_by_field_and_by_class() -> None:
    assert events.Delivered("V", "t", 1) != events.Delivered("V", "t", 2)
    assert events.Delivered("V", "t", True) != events.DeliveryDropped("V", "t", True)  # same values, another class
    assert events.Delivered("V", "t", 1) != ("V", "t", 1)
    assert events.DeliveryDropped("V", "t") == events.DeliveryDropped("V", "t", False)  # the defaults


def test_defaults_and_field_order_are_the_constructors() -> None:
    c = events.ClientConnected("c", 1, False, None, "client")
    assert (c.resent_tags, c.queued_tags, c.vehicle) == ((), (), False)
    t = events.IngestTicket("c", 1, None, "t", b"", 0, False, False)
    assert (t.properties, t.routed) == (None, False)
    assert events.LocalPublish(None, "t", b"", 0, False).properties is None
    assert events.Subscribed("c", 1, ()).user_properties == ()
    assert events.ClientDisconnected("c", 1, "disconnect", False, False).unacked_tags == ()


def test_hooks_re_exports_every_event_class() -> None:
    for name in events.__all__:
        assert getattr(hooks, name) is getattr(events, name)
