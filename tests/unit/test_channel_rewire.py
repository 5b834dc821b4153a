"""actors.channels.rewire: callers (and their open channels) are kept while their actor is the same."""
from __future__ import annotations

from types import SimpleNamespace

from actors.channels import rewire


class Caller:
    def __init__(self, key, handle):
        self.key, self.handle, self.closed = key, handle, False

    def close(self):
        self.closed = True


def _handle(actor_id: bytes):
    return SimpleNamespace(_ray_actor_id=actor_id)  # an actor handle's identity is its actor id


def test_same_actor_keeps_its_caller_a_new_actor_gets_a_new_one_and_gone_keys_are_closed():
    a, b, c = _handle(b"a"), _handle(b"b"), _handle(b"c")
    first = rewire({}, {"n0": a, "n1": b}, Caller)
    kept, replaced = first["n0"], first["n1"]
    second = rewire(first, {"n0": _handle(b"a"), "n1": c, "n2": b}, Caller)
    assert second["n0"] is kept and not kept.closed  # same actor id: channel kept
    assert second["n1"] is not replaced and replaced.closed and second["n1"].handle is c  # restarted as a new actor
    assert second["n2"].handle is b
    third = rewire(second, {}, Caller)
    assert third == {} and all(x.closed for x in second.values())
