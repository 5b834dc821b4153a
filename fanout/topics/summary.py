"""Offsets and lag of durable topics, as ``fanout topics show|list``, ``fanout status`` and ``$SYS`` show them.

Lag of a group in a partition: ``next - (committed + 1)`` (``committed`` = the last offset it acknowledged), or
``next - low`` (everything retained) before its first commit there. A topic's ``high`` is the number of messages
ever appended (the sum of the partitions' next offsets), ``retained`` what the logs still hold.
"""
from __future__ import annotations

from typing import Any


def lag_of(low: int, nxt: int, committed: int | None) -> int:
    """Messages of a partition a group has not acknowledged (see the module docstring)."""
    return max(0, nxt - (low if committed is None else committed + 1))



def summarize(name: str, t: dict[str, Any]) -> dict[str, Any]:
    """A topic's :meth:`TopicDesk.info` entry as shown by ``fanout topics show`` / ``list`` and in status."""
    parts = {int(p): (int(b[0]), int(b[1])) for p, b in t["partitions"].items()}
    groups = []
    for g, ps in sorted(t["groups"].items()):
        per = []
        for p, (low, nxt) in sorted(parts.items()):
            c = ps.get(p)
            committed = None if c is None else int(c[0])
            per.append({"partition": p, "committed": committed, "lag": lag_of(low, nxt, committed)})
        groups.append({"group": g, "committed": sum(x["committed"] + 1 for x in per if x["committed"] is not None),
                       "lag": sum(x["lag"] for x in per), "partitions": per})
    return {"name": name, **t["spec"],
            "high": sum(nxt for _low, nxt in parts.values()),
            "retained": sum(nxt - low for low, nxt in parts.values()),
            "partitions": [{"partition": p, "low": low, "next": nxt} for p, (low, nxt) in sorted(parts.items())],
            "groups": groups}


def merge_info(parts: Any) -> dict[str, Any]:
    """Merge the per-shard ``topic_info`` answers (:meth:`fanout.topics.log_calls.TopicCatalog.info`) into one."""
    merged: dict[str, Any] = {}
    for part in parts:
        for name, t in part.items():
            m = merged.setdefault(name, {"spec": t["spec"], "partitions": {}, "groups": {}})
            m["partitions"].update(t["partitions"])
            for g, ps in t["groups"].items():
                m["groups"].setdefault(g, {}).update(ps)
    return merged


__all__ = ["summarize", "lag_of", "merge_info"]
