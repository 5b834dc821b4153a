"""What the actor modules and the cluster floor share about Ray: names, the node resource, remote errors.

Strategy: every actor module imports this one and this one imports no actor, so the imports among
``actors/`` point one way (controller -> shards -> dispatcher, store_replica -> names); the ``cluster/``
floor finds the running controller through the same two names.
"""
from __future__ import annotations

from typing import Any

import ray

NAMESPACE = "sdv-fanout"
"""The Ray namespace of every fanout actor."""

CONTROLLER_NAME = "fanout-controller"
"""The default name of the Controller actor (``fanout status`` finds it by this name)."""

NODE_RESOURCE = "fanout_node"
"""Custom Ray resource of the nodes that run a listener (one unit per node)."""


def fanout_ray_nodes() -> list[dict[str, Any]]:
    """Alive Ray nodes with the ``fanout_node`` resource, head first, then by node id."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(NODE_RESOURCE, 0) >= 1]
    return sorted(nodes, key=lambda n: (not n.get("is_head_node", False), n["NodeID"]))


def remote_error_text(exc: BaseException) -> str:
    """The last line of a remote error: the original exception's message, not Ray's traceback wrapper.

    A ``RayTaskError`` carries the exception raised inside the actor as ``cause``; its text ends with
    that exception's message. Any other exception gives its own last line (its repr when empty).
    """
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None else exc
    text = str(cause).strip()
    return text.splitlines()[-1] if text else repr(cause)


__all__ = ["NAMESPACE", "CONTROLLER_NAME", "NODE_RESOURCE", "fanout_ray_nodes", "remote_error_text"]
