"""docs/configuration.md lists every key of ``fanout.config.SCHEMA`` (``python -m scripts.config_docs --write``
adds the rows a new key needs)."""
from __future__ import annotations

from scripts.config_docs import PAGE, describe, missing, row
from fanout.config import SCHEMA


def test_every_config_key_is_documented() -> None:
    gone = [f"{s}.{k}" for s, k, _ in missing(PAGE.read_text())]
    assert gone == [], f"docs/configuration.md lacks {gone}: run python -m scripts.config_docs --write"


def test_a_generated_row_names_the_key_its_default_and_the_parsers_range() -> None:
    field = SCHEMA["mqtt"]["port"]
    assert describe(field) == ("integer", "0-65535")
    assert row("mqtt", "port", field).startswith("| `mqtt.port` | `1883` | integer | 0-65535 | `port` |")
    assert describe(SCHEMA["mqtt"]["max_topic_length"]) == ("size (bytes)", ">= 1B, <= 65535B")
    assert describe(SCHEMA["mqtt"]["tls_client_auth"])[1] == "none, optional, required"
