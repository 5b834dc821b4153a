"""MQTT 5 subscription options as they apply to one message: No Local, Retain As Published, Subscription
Identifiers (3.8.3.1, 3.3.4).

Strategy: a session keeps a :class:`SubOpts` only for its filters that have an option set (``Session.opts``),
so the ordinary case costs nothing. For a message to such a session, :func:`apply_options` looks at every
filter of the session that matches the topic: a No Local subscription does not count for the session's own
messages (MQTT-3.8.3-3); the rest give the QoS (the best granted), the RETAIN flag (set when one of them has
Retain As Published and the message was published with RETAIN, MQTT-3.3.1-12/13) and the Subscription
Identifiers of all of them, once each (MQTT-3.3.4-3, -4).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .topics import topic_matches


@dataclass(frozen=True, slots=True)
class SubOpts:
    """The MQTT 5 options of one subscription that change what its messages look like."""

    no_local: bool = False
    retain_as_published: bool = False
    sub_id: int | None = None


def apply_options(s: Any, topic: str, sender: str | None, published_retain: bool) -> tuple[int, bool, tuple[int, ...]]:
    """(granted QoS or -1 when no subscription takes it, RETAIN flag, Subscription Identifiers) for one
    message to session ``s`` whose ``opts`` is not empty.

    Args:
        s: the :class:`~fanout.mqtt.session.Session`.
        topic: the message's topic.
        sender: the publisher's client id (None for the server's own messages).
        published_retain: the RETAIN flag the message was published with.
    """
    opts = s.opts
    cid = s.client_id
    granted = -1
    retain = False
    ids: list[int] = []
    for f, g in s.subs.items():
        o = opts.get(f)
        if o is None:
            if g > granted and topic_matches(f, topic):
                granted = g
            continue
        if not topic_matches(f, topic) or (o.no_local and sender == cid):
            continue
        if g > granted:
            granted = g
        if o.retain_as_published and published_retain:
            retain = True
        if o.sub_id:
            ids.append(o.sub_id)
    return granted, retain, tuple(sorted(set(ids))) if ids else ()


__all__ = ["SubOpts", "apply_options"]
