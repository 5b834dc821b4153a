"""The Ray-free core of a ConnectionNode: :class:`fanout.node.core.NodeCore` turns the broker's events into
dispatcher events and executes deliveries (``core``), ships events by the batching policy
(``event_batching``), runs ingest rounds (``ingest_rounds``), keeps the inter-node route table
(``peer_routes``) and builds delivery topics (``delivery_topic``). ``actors.connection_node`` wraps it."""
from fanout import native as _native

_native.extend_path(__path__, "fanout.node")  # noqa: F821 -- compiled modules (make native) before the sources
