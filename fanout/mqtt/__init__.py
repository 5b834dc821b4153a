"""The MQTT broker, sans I/O (codec, sessions, delivery) with a thin asyncio adapter (``aio``).

The hot-path modules run compiled when ``make`` built them and their sources have not changed since
(:mod:`fanout.native`); this must happen before any of them is imported.
"""
from fanout import native as _native

_native.extend_path(__path__, "fanout.mqtt")  # noqa: F821 -- the package's own search path
