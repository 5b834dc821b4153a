"""Durable topics: ``[[topics]]`` settings, the publish matcher, consumer helpers, and the consumer groups over the
store's per-partition topic logs (``groups*.py``)."""
