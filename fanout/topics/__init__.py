"""Durable topics (issue 14): consumer groups over the store's per-partition topic logs."""
