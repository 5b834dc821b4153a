"""Durable topics on the node and the CLI side: ``[[topics]]`` settings, the publish matcher, consumer helpers."""
