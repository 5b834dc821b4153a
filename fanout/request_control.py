"""Request status and cancel over MQTT: the topics, their validation and the reply (platform client <-> node).

The platform publishes (QoS 1) on ``$SDV-FANOUT/requests/<request_id>/status`` or ``.../cancel`` a JSON
object ``{"id": "<correlation id>"}`` (or an empty payload). The node asks every shard (one batched call per
dispatcher per ingest round), and, once the answer is known (for a cancel: once it is durable on every shard),
acknowledges the PUBLISH and publishes on ``$SDV-FANOUT/replies/<client_id>`` (QoS 1)::

    {"id": "<correlation id>", "op": "status", "request_id": "r1", "status": {...} | null}
    {"id": "...", "op": "cancel", "request_id": "r1", "error": "unavailable", "reason": "..."}

``status`` is the request's status summed over the shards (:func:`fanout.dispatcher.lifecycle.merge`), or
null when no shard knows the request. An invalid topic or payload is invalid input like an invalid trigger
(``TriggerError``: an error on ``$SDV-FANOUT/errors/<client_id>``, connection closed).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fanout.dispatcher.lifecycle import merge
from fanout.trigger import DEFAULT_MAX_ID_LEN, TriggerError, check_id

REQUESTS_TOPIC_PREFIX = "$SDV-FANOUT/requests/"
REPLIES_TOPIC_PREFIX = "$SDV-FANOUT/replies/"
STATUS = "status"
CANCEL = "cancel"
VERBS = (STATUS, CANCEL)
MAX_CORRELATION_LEN = 128


def request_topic(request_id: str, verb: str) -> str:
    """The topic to publish a ``verb`` (``status`` or ``cancel``) of ``request_id`` on."""
    return f"{REQUESTS_TOPIC_PREFIX}{request_id}/{verb}"


def replies_topic(client_id: str) -> str:
    """Where the cluster publishes the replies to ``client_id``."""
    return REPLIES_TOPIC_PREFIX + client_id


def is_request_topic(topic: str) -> bool:
    return topic.startswith(REQUESTS_TOPIC_PREFIX)


@dataclass(frozen=True, slots=True)
class Control:
    """A validated status or cancel question."""

    verb: str
    request_id: str
    correlation: str | None


@dataclass(frozen=True, slots=True)
class Reply:
    """An ingest-round outcome: acknowledge the PUBLISH, then publish ``body`` on the replies topic."""

    body: dict[str, Any]

    def payload(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":"), default=str).encode()


def parse_control(topic: str, payload: bytes) -> Control:
    """Validate a ``$SDV-FANOUT/requests/<request_id>/<verb>`` publish.

    Raises:
        TriggerError: ``field="topic"`` (not ``<request_id>/<verb>``, unknown verb), ``"request_id"`` or
            ``"payload"`` (not empty and not a JSON object with at most a string ``id``).
    """
    rest = topic[len(REQUESTS_TOPIC_PREFIX):]
    request_id, _, verb = rest.rpartition("/")
    if verb not in VERBS or not request_id or "/" in request_id:
        raise TriggerError("topic", f"expected {REQUESTS_TOPIC_PREFIX}<request_id>/{'|'.join(VERBS)}, got {topic[:80]!r}")
    check_id("request_id", request_id, DEFAULT_MAX_ID_LEN)
    correlation = None
    if payload.strip():
        try:
            body = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise TriggerError("payload", "not a JSON object", request_id=request_id) from None
        if not isinstance(body, dict) or set(body) - {"id"}:
            raise TriggerError("payload", 'expected {"id": "<correlation id>"} or nothing', request_id=request_id)
        correlation = body.get("id")
        if correlation is not None and (not isinstance(correlation, str) or len(correlation) > MAX_CORRELATION_LEN):
            raise TriggerError("payload", f"id must be a string of at most {MAX_CORRELATION_LEN} characters",
                               request_id=request_id)
    return Control(verb, request_id, correlation)


def reply(control: Control, parts: list[Any]) -> Reply:
    """The reply to ``control`` from every shard's answer (None: the shard does not know the request; an
    exception: the shard did not answer)."""
    body: dict[str, Any] = {"id": control.correlation, "op": control.verb, "request_id": control.request_id}
    failed = [p for p in parts if isinstance(p, BaseException)]
    if failed:
        body.update(error="unavailable", reason=f"{len(failed)} shard(s) did not answer: {failed[0]!r}"[:300])
        return Reply(body)
    known = [p for p in parts if p is not None]
    body["status"] = merge(known) if known else None
    return Reply(body)


__all__ = ["REQUESTS_TOPIC_PREFIX", "REPLIES_TOPIC_PREFIX", "STATUS", "CANCEL", "Control", "Reply", "parse_control",
           "reply", "request_topic", "replies_topic", "is_request_topic"]
