"""Plain methods for an actor's own hot calls, past the tracing shim Ray puts on every method of an actor class.

Why: ``ray.remote`` wraps every method of the class (private ones too) in a function that checks whether tracing
is on and repacks the arguments with a ``_ray_trace_ctx`` keyword, even with tracing off: one more Python frame
per call. An actor calling its own methods per packet (``_schedule_flush``), or a direct channel calling its
handlers per call, pays that on every call (py-spy: 2 µs per heartbeat on the node, the shim's own frame). Ray's
remote calls keep the wrapped methods (they may carry a trace context); only the actor's own calls and its
channel handlers take the plain ones.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable


def plain(obj: Any, name: str) -> Callable[..., Any]:
    """``obj.name`` bound without Ray's tracing shim (for handlers the actor hands out, e.g. to a channel)."""
    return inspect.unwrap(getattr(type(obj), name)).__get__(obj)


def unwrap_private_methods(obj: Any) -> None:
    """Bind every private method of ``obj``'s class on the instance without the shim, so ``self._x()`` calls the
    plain function. Only private ones: those Ray never invokes remotely (public methods keep the shim there)."""
    for name, member in inspect.getmembers(type(obj), inspect.isfunction):
        if name.startswith("_") and not name.startswith("__") and hasattr(member, "__wrapped__"):
            setattr(obj, name, inspect.unwrap(member).__get__(obj))


__all__ = ["plain", "unwrap_private_methods"]
