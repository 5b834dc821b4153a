"""The MQTT broker, sans I/O (codec, sessions, delivery) with a thin asyncio adapter (``aio``).

The hot-path modules run compiled when ``make`` built them and their sources have not changed since
(:mod:`fanout.mqtt.native`); this must happen before any of them is imported.
"""
from pathlib import Path as _Path

from fanout.mqtt import native as _native

_native.STATUS, _compiled = _native.choose(_Path(__file__).parent)
if _compiled is not None:
    __path__.insert(0, str(_compiled))  # noqa: F821 -- the package's own search path
