"""``fanout consume TOPIC --group G [--from earliest|latest|OFFSET] [--limit N] [--ack] [--json] [--data-dir D]``.

Reads a durable topic as consumer group ``G`` (:func:`fanout.topics.consume.consume`) and prints one line per
message: with ``--json`` a JSON object ``{"topic", "partition", "offset", "ts_ms", "mqtt_topic", "client_id",
"payload"}`` (``payload_b64`` instead of ``payload`` when it is not UTF-8), else ``topic/partition@offset
mqtt_topic client_id payload``. A group without committed offsets starts where ``--from`` says (default latest);
``--ack`` commits each partition up to the last offset printed (after each page: an interrupted run re-reads at
most one page). Progress goes to stderr during long reads.

Where it reads: the running cluster (its controller, as ``fanout status`` finds it); with ``--data-dir`` of a
stopped cluster, the store files directly (:class:`fanout.topics.local_source.LocalLogSource`, which takes the
data dir lock). A data dir held by a running cluster is read through that cluster; when it cannot be reached the
command refuses, naming the holder. Exit 1 when nothing can be read, 2 for an unknown topic or bad arguments.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from cluster.cli.status import _common
from fanout.topics.records import by_shard, in_order

UNKNOWN_EXIT = 2


def register(sub: Any) -> None:
    p = sub.add_parser("consume", help="read a durable topic as a consumer group (JSON lines with --json)")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--group", required=True, help="consumer group (its committed offsets say where it resumes)")
    p.add_argument("--from", dest="start", default="latest",
                   help="where a group without commits starts: earliest, latest (default) or an offset")
    p.add_argument("--limit", type=int, default=None, help="stop after this many messages")
    p.add_argument("--ack", action="store_true", help="commit each partition up to the last offset printed")
    p.add_argument("--json", action="store_true", help="print JSON lines")
    p.add_argument("--page", type=int, default=1000, help="messages per partition per read call (default 1000)")
    _common(p)
    p.set_defaults(func=_consume)


class ControllerSource:
    """A running cluster as a :class:`fanout.topics.consume.LogSource`: ``info`` through its controller, reads and
    commits straight to the shards' dispatchers (one hop instead of two; the handles come from the controller and
    are fetched again when a primary was replaced). A commit does not wait (:meth:`commit_nowait`): it is written
    while the next page is read."""

    def __init__(self, controller: Any) -> None:
        self._c = controller
        self._dispatchers: list[Any] | None = None

    def _get(self, ref: Any) -> Any:
        import ray

        from actors.names import remote_error_text

        try:
            return ray.get(ref, timeout=60)
        except ray.exceptions.RayTaskError as exc:
            raise RuntimeError(remote_error_text(exc)) from None

    def _call(self, method: str, items: list[tuple],
              partition_of: Callable[[tuple], int]) -> tuple[dict[int, list[int]], list[Any]]:
        """Start ``method`` on each shard's dispatcher with its part of ``items`` (handles from the controller)."""
        if self._dispatchers is None:
            self._dispatchers = self._get(self._c.handles.remote())["dispatchers"]
        ds = self._dispatchers
        per = by_shard((partition_of(i) for i in items), len(ds))
        return per, [getattr(ds[s], method).remote([items[i] for i in idx]) for s, idx in per.items()]

    def info(self, names: list[str] | None = None) -> dict[str, Any]:
        return self._get(self._c.topic_info.remote(names))

    def _nowait(self, method: str, items: list[tuple], partition_of: Callable[[tuple], int],
                combine: Callable[[Any, list], Any], retry_on: tuple[type[BaseException], ...]) -> Callable[[], Any]:
        """Start ``method`` on the shards; returns a callable that waits for the answers (``combine(per, answers)``).
        If the wait fails with ``retry_on`` (a primary was replaced), it asks the controller for the handles again
        and makes the calls once more; a second failure is raised."""
        per, refs = self._call(method, items, partition_of)

        def wait() -> Any:
            try:
                return combine(per, self._get(refs))
            except retry_on:
                self._dispatchers = None
            again, refs_again = self._call(method, items, partition_of)
            return combine(again, self._get(refs_again))

        return wait

    def read_nowait(self, requests: list[tuple]) -> Callable[[], list[tuple]]:
        """Start the reads; returns a callable that waits for their answers."""
        import ray

        return self._nowait("topic_read", requests, lambda r: r[1], lambda per, got: in_order(per, got, len(requests)),
                            (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError))

    def read(self, requests: list[tuple]) -> list[tuple]:
        return self.read_nowait(requests)()

    def commit_nowait(self, items: list[tuple]) -> Callable[[], int]:
        """Start the commits; returns a callable that waits for them (and returns how many were committed)."""
        import ray

        # the primary died: commit again on its successor (a commit never moves a group back, so twice is harmless)
        return self._nowait("topic_commit", items, lambda i: i[2], lambda per, got: sum(got),
                            (ray.exceptions.RayActorError,))

    def commit(self, items: list[tuple]) -> int:
        return self.commit_nowait(items)()


def _source(args: argparse.Namespace, data_dir: str) -> Any:
    """The local stores when ``--data-dir`` names a stopped cluster's dir, else the running cluster."""
    from storage.data_dir_lock import DataDirBusy

    from cluster.runtime import connect, find_address

    if args.data_dir is not None:
        from fanout.topics.local_source import LocalLogSource

        try:
            return LocalLogSource(data_dir, sync=True)
        except DataDirBusy as busy:
            try:
                return ControllerSource(connect(find_address(data_dir, args.address)))
            except RuntimeError as exc:
                raise RuntimeError(f"{busy} and its cluster cannot be reached ({exc}): stop it or try again") from None
    return ControllerSource(connect(find_address(data_dir, args.address)))


def _consume(args: argparse.Namespace) -> int:
    from fanout.config import load_config
    from fanout.topics.consume import UnknownTopic, consume, entry_json, parse_start

    try:
        start = parse_start(args.start)
    except ValueError as exc:
        print(f"fanout: {exc}", file=sys.stderr)
        return UNKNOWN_EXIT
    if args.limit is not None and args.limit < 1 or args.page < 1:
        print("fanout: --limit and --page must be at least 1", file=sys.stderr)
        return UNKNOWN_EXIT
    cfg = load_config(args.config, overrides={"storage": {"data_dir": args.data_dir}})
    try:
        source = _source(args, cfg.storage.data_dir)
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"fanout: consume: {exc}", file=sys.stderr)
        return 1
    out = sys.stdout

    def emit(partition: int, e: tuple) -> None:
        obj = entry_json(args.topic, partition, e)
        if args.json:
            out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        else:
            body = obj["payload"] if "payload" in obj else "base64:" + obj["payload_b64"]
            out.write(f"{args.topic}/{partition}@{obj['offset']} {obj['mqtt_topic']} {obj['client_id']} {body}\n")

    def progress(emitted: int, behind: int) -> None:
        print(f"fanout consume: {emitted} messages, {behind} behind", file=sys.stderr, flush=True)

    try:
        result = consume(source, args.topic, args.group, start=start, limit=args.limit, ack=args.ack, page=args.page,
                         emit=emit, progress=progress)
    except UnknownTopic:
        print(f"fanout: no durable topic {args.topic!r}", file=sys.stderr)
        return UNKNOWN_EXIT
    except (RuntimeError, ValueError) as exc:
        print(f"fanout: consume: {exc}", file=sys.stderr)
        return 1
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    out.flush()
    if result.emitted >= 1000 or args.ack:
        acked = f", committed {len(result.committed)} partition(s)" if args.ack else ""
        print(f"fanout consume: {result.emitted} messages{acked}", file=sys.stderr)
    return 0
