"""The sans-I/O modules must not pull in asyncio, socket or ray (STYLE.md, h11 rule)."""
from __future__ import annotations

import json
import subprocess
import sys

MODULES = ["fanout.mqtt.errors", "fanout.mqtt.packets", "fanout.mqtt.codec", "fanout.mqtt.encoder",
           "fanout.mqtt.decoder", "fanout.mqtt.topics", "fanout.mqtt.trie"]
FORBIDDEN = ["asyncio", "socket", "ray", "selectors", "ssl"]


def test_core_imports_no_io():
    code = (
        "import importlib, json, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(n for n in {FORBIDDEN!r} if n in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/tests/", 1)[0])
    assert json.loads(out.stdout) == []
