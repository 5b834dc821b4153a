"""Request status and cancel from the platform client: a question over MQTT, its reply matched by id.

Strategy (:mod:`fanout.request_control` has the topics): the client publishes ``{"id": <n>}`` (QoS 1) on
``$SDV-FANOUT/requests/<request_id>/status|cancel`` and waits for the reply with that id on its own
``$SDV-FANOUT/replies/<client_id>``, which it subscribes to with its errors topic on every connect. A
question is not queued through the outbox: it needs a live connection (:class:`FanoutUnavailable` when there
is none within the timeout) and is asked again on the next connection if the connection drops before the
reply (a status is read-only and a cancel idempotent, so asking twice is harmless).
"""
from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, Awaitable, Callable

import structlog

from fanout.client.errors import FanoutUnavailable
from fanout.request_control import CANCEL, STATUS, request_topic
from fanout.trigger import DEFAULT_MAX_ID_LEN, TriggerError, check_id

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S = 30.0


class RequestControl:
    """Outstanding questions of one client, by correlation id.

    Args:
        publish: publishes ``(topic, payload)`` on the current connection (raises when there is none).
        connected: waits until the client is connected.
    """

    def __init__(self, publish: Callable[[str, bytes], Any], connected: Callable[[], Awaitable[Any]]) -> None:
        self._publish = publish
        self._connected = connected
        self._ids = itertools.count(1)
        self._waiting: dict[str, asyncio.Future] = {}

    async def ask(self, verb: str, request_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any] | None:
        """The cluster's status of ``request_id`` after ``verb`` (``status`` or ``cancel``), None if unknown.

        Raises:
            ValueError: ``request_id`` is not a valid request id (nothing is sent).
            FanoutUnavailable: no reply within ``timeout_s``, or the cluster could not ask every shard.
        """
        if verb not in (STATUS, CANCEL):
            raise ValueError(f"verb must be {STATUS!r} or {CANCEL!r}, got {verb!r}")
        try:
            check_id("request_id", request_id, DEFAULT_MAX_ID_LEN)
        except TriggerError as exc:
            raise ValueError(str(exc)) from None
        body = await self.call(request_topic(request_id, verb), {}, timeout_s, f"{verb} of request {request_id!r}")
        if "error" in body:
            raise FanoutUnavailable(f"{verb} of request {request_id!r}: {body.get('error')}: {body.get('reason')}")
        return body.get("status")

    async def call(self, topic: str, fields: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        """Publish ``{"id": <n>, **fields}`` on ``topic`` and return the reply with that id (any question of
        :mod:`fanout.request_control`; ``what`` names it in the error).

        Raises:
            FanoutUnavailable: no reply within ``timeout_s``.
        """
        corr = str(next(self._ids))
        fut = self._waiting[corr] = asyncio.get_running_loop().create_future()
        payload = json.dumps({"id": corr, **fields}).encode()
        try:
            return await asyncio.wait_for(self._until_answered(fut, topic, payload), timeout_s)
        except asyncio.TimeoutError:
            raise FanoutUnavailable(f"no reply to {what} within {timeout_s:.0f}s") from None
        finally:
            self._waiting.pop(corr, None)

    async def _until_answered(self, fut: asyncio.Future, topic: str, payload: bytes) -> dict[str, Any]:
        while True:
            await self._connected()
            try:
                self._publish(topic, payload)
            except Exception as exc:  # connection lost between the two lines: ask on the next one
                log.debug("client.request_control_retry", topic=topic, error=str(exc))
                await asyncio.sleep(0.1)
                continue
            done, _ = await asyncio.wait({fut}, timeout=5.0)
            if done:
                return fut.result()

    def on_reply(self, payload: bytes) -> None:
        """A message on the replies topic: resolve the question it answers (unknown ids are late replies)."""
        try:
            body = json.loads(payload)
        except ValueError:
            log.warning("client.bad_reply", payload=payload[:200])
            return
        fut = self._waiting.get(str(body.get("id"))) if isinstance(body, dict) else None
        if fut is not None and not fut.done():
            fut.set_result(body)


__all__ = ["RequestControl", "DEFAULT_TIMEOUT_S"]
