"""Store errors cross process boundaries (direct channels pickle them): each one round-trips whole."""
from __future__ import annotations

import pickle

from storage.errors import FencedError, SequenceError, StoreError, StoreFullError


def test_errors_with_keyword_fields_pickle_with_their_fields_and_type():
    e = pickle.loads(pickle.dumps(FencedError("deposed", epoch=3, known_epoch=4)))
    assert type(e) is FencedError and isinstance(e, StoreError)
    assert (str(e), e.epoch, e.known_epoch) == ("deposed", 3, 4)
    s = pickle.loads(pickle.dumps(SequenceError("gap", seq=9, applied_seq=7)))
    assert type(s) is SequenceError and (str(s), s.seq, s.applied_seq) == ("gap", 9, 7)


def test_plain_store_errors_pickle():
    e = pickle.loads(pickle.dumps(StoreFullError("map full")))
    assert type(e) is StoreFullError and str(e) == "map full"
