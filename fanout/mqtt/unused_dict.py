"""The shared read-only empty dict that stands for a subscription-trie node's unused dicts (:mod:`trie`)."""
from __future__ import annotations

from typing import Any, NoReturn


class _Unused(dict):
    """What an unused dict of a node holds until its first write (one shared instance, :data:`UNUSED`): most nodes
    need one of their three dicts (a per-vehicle "+/<VIN>/#" makes a node that only ever needs ``multi``), so the
    other empty dicts (64 bytes each, and their allocation per subscribe) are not made. Reads are a plain empty
    dict's; a write raises, so a write site that forgets to make the node's own dict first fails instead of
    changing every node. Pickles (and copies) as the shared instance."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("the trie's shared empty dict is read-only: give the node its own dict first")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return unused, ()


def unused() -> "_Unused":
    return UNUSED


UNUSED: Any = _Unused()
