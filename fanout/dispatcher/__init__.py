"""The Ray-free core of a Dispatcher (one store shard): :class:`fanout.dispatcher.core.DispatcherCore`
composes the per-VIN state machine (``machine``, its records in ``state``), the tick's row reads (``rows``), the takeover registry
(``takeover``), the blob cache (``blobs``), the ingest write batches (``ingest_batch``), the per-node tick
output (``output``) and what status/inspect read (``introspection``). ``actors.dispatcher`` wraps it."""
from fanout import native as _native

_native.extend_path(__path__, "fanout.dispatcher")  # noqa: F821 -- compiled modules (make native) before the sources
