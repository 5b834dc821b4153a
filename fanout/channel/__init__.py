"""Direct channels between actors: an authenticated request/reply connection for the hot calls.

- :mod:`fanout.channel.frames`: the wire format (handshake, frames), sans-I/O.
- :mod:`fanout.channel.peer`: :class:`ChannelServer` and :class:`ChannelClient`, the asyncio ends.
- :mod:`fanout.channel.tls`: the TLS contexts of channels that cross machines.

Ray-free: the actors (``actors/channels.py``) bring the secret and the callee's address.
"""
from .frames import ChannelError, HandshakeError
from . import tls
from .peer import ChannelClient, ChannelServer

__all__ = ["ChannelClient", "ChannelServer", "ChannelError", "HandshakeError"]
