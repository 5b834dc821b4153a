"""Request status and cancel over MQTT: the topics, their validation and the reply (platform client <-> node).

The platform publishes (QoS 1) on ``$SDV-FANOUT/requests/<request_id>/status`` or ``.../cancel`` a JSON
object ``{"id": "<correlation id>"}`` (or an empty payload). The node asks every shard (one batched call per
dispatcher per ingest round), and, once the answer is known (for a cancel: once it is durable on every shard),
acknowledges the PUBLISH and publishes on ``$SDV-FANOUT/replies/<client_id>`` (QoS 1)::

    {"id": "<correlation id>", "op": "status", "request_id": "r1", "status": {...} | null}
    {"id": "...", "op": "cancel", "request_id": "r1", "error": "unavailable", "reason": "..."}

A consumer group's explicit commit travels the same way (:data:`TOPIC_ACK`): ``$SDV-FANOUT/requests/<topic>/topic-ack``
with ``{"id": "...", "group": "g", "partition": 3, "upto": 41}``; the shard of the partition writes the commit
(durable when answered) and the reply is ``{"id", "op": "topic-ack", "topic", "group", "partition", "committed"}``
(``committed``: the group's position after it; a commit never moves a group back). ``.../<topic>/topic-info``
(payload ``{"id"}`` or nothing) answers ``{"id", "op": "topic-info", "topic", "filter", "partitions"}`` (from
shard 0's catalog; ``error`` when there is no such topic): what a consumer subscribes to. Between the node and the
dispatchers the op is ``(TOPIC_ACK, encode_topic_ack(...))`` like the other ``(verb, request_id)`` pairs.

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
TOPIC_ACK = "topic-ack"
TOPIC_INFO = "topic-info"
VERBS = (STATUS, CANCEL, TOPIC_ACK, TOPIC_INFO)
MAX_CORRELATION_LEN = 128
MAX_NAME_LEN = 256  # a topic or group name in a topic-ack
_SEP = "\x1f"  # joins a topic-ack's fields into the op's one string (never in a topic or group name)


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


def encode_topic_ack(topic: str, group: str, partition: int, upto: int) -> str:
    """The op string of a topic-ack (the second field of its ``(TOPIC_ACK, ...)`` op)."""
    return _SEP.join((topic, group, str(partition), str(upto)))


def decode_topic_ack(op: str) -> tuple[str, str, int, int]:
    """Inverse of :func:`encode_topic_ack`."""
    topic, group, partition, upto = op.split(_SEP)
    return topic, group, int(partition), int(upto)


def _check_name(field: str, value: Any, request_id: str | None) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LEN or _SEP in value \
            or any(c in value for c in "/+#\x00"):
        raise TriggerError(field, f"must be a non-empty name of at most {MAX_NAME_LEN} characters without / + #",
                           request_id=request_id)
    return value


def _parse_topic_ack(topic_name: str, body: dict[str, Any]) -> str:
    """The op string of a topic-ack body ``{"id", "group", "partition", "upto"}`` (TriggerError when invalid)."""
    if set(body) - {"id", "group", "partition", "upto"}:
        raise TriggerError("payload", 'expected {"id", "group", "partition", "upto"}')
    group = _check_name("group", body.get("group"), None)
    partition, upto = body.get("partition"), body.get("upto")
    for field, value in (("partition", partition), ("upto", upto)):
        if type(value) is not int or not 0 <= value < 1 << 63:
            raise TriggerError(field, "must be an integer >= 0")
    return encode_topic_ack(topic_name, group, partition, upto)  # type: ignore[arg-type]


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
    if verb in (TOPIC_ACK, TOPIC_INFO):
        _check_name("topic", request_id, None)
    else:
        check_id("request_id", request_id, DEFAULT_MAX_ID_LEN)
    correlation = None
    if payload.strip():
        try:
            body = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise TriggerError("payload", "not a JSON object", request_id=request_id) from None
        if verb == TOPIC_ACK and isinstance(body, dict):
            request_id = _parse_topic_ack(request_id, body)
        elif not isinstance(body, dict) or set(body) - {"id"}:
            raise TriggerError("payload", 'expected {"id": "<correlation id>"} or nothing', request_id=request_id)
        correlation = body.get("id")
        if correlation is not None and (not isinstance(correlation, str) or len(correlation) > MAX_CORRELATION_LEN):
            raise TriggerError("payload", f"id must be a string of at most {MAX_CORRELATION_LEN} characters",
                               request_id=request_id)
    elif verb == TOPIC_ACK:
        raise TriggerError("payload", 'a topic-ack needs {"group", "partition", "upto"}')
    return Control(verb, request_id, correlation)


def reply(control: Control, parts: list[Any]) -> Reply:
    """The reply to ``control`` from every shard's answer (None: the shard does not know the request; an
    exception: the shard did not answer)."""
    body: dict[str, Any] = {"id": control.correlation, "op": control.verb}
    if control.verb == TOPIC_ACK:
        topic, group, partition, _upto = decode_topic_ack(control.request_id)
        body.update(topic=topic, group=group, partition=partition)
    elif control.verb == TOPIC_INFO:
        body["topic"] = control.request_id
    else:
        body["request_id"] = control.request_id
    failed = [p for p in parts if isinstance(p, BaseException)]
    if failed:
        body.update(error="unavailable", reason=f"{len(failed)} shard(s) did not answer: {failed[0]!r}"[:300])
        return Reply(body)
    if control.verb == TOPIC_INFO:  # shard 0 answers
        info = next((p for p in parts if p is not None), None)
        if info is None:
            body.update(error="unknown", reason=f"no durable topic {control.request_id!r}")
        else:
            body.update(filter=info["filter"], partitions=info["partitions"])
        return Reply(body)
    if control.verb == TOPIC_ACK:  # only the partition's shard answers
        answer = next((p for p in parts if p is not None), None)
        if answer is None or "error" in answer:
            body.update(error="unknown", reason=(answer or {}).get("error", "no shard serves this topic partition"))
        else:
            body["committed"] = answer["committed"]
        return Reply(body)
    known = [p for p in parts if p is not None]
    body["status"] = merge(known) if known else None
    return Reply(body)


__all__ = ["REQUESTS_TOPIC_PREFIX", "REPLIES_TOPIC_PREFIX", "STATUS", "CANCEL", "TOPIC_ACK", "TOPIC_INFO", "encode_topic_ack",
           "decode_topic_ack", "Control", "Reply", "parse_control",
           "reply", "request_topic", "replies_topic", "is_request_topic"]
