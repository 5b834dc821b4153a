"""Durable topics: ``[[topics]]`` settings, the publish matcher, consumer helpers, and the consumer groups over the
store's per-partition topic logs (``groups*.py``)."""
from fanout import native as _native

_native.extend_path(__path__, "fanout.topics")  # noqa: F821 -- compiled modules (make native) before the sources
