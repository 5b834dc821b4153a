"""benchmarks.instructions: the callgrind count is read from valgrind's summary, two runs give instructions per
event with the set-up cancelled, and a machine without valgrind gets a message naming the fix."""
from __future__ import annotations

import pytest

from benchmarks import instructions as I


def test_collected_reads_the_last_summary_count():
    out = "==123== Callgrind, a call-graph generating cache profiler\n==123== \n==123== Events    : Ir\n" \
          "==123== Collected : 3196399038\n==123== \n==123== I   refs:      3,196,399,038\n"
    assert I.collected(out) == 3_196_399_038


def test_a_run_without_a_summary_is_an_error_with_its_tail():
    with pytest.raises(I.InstructionCountError, match="Traceback"):
        I.collected("Traceback (most recent call last):\n  ...\nRuntimeError: 12 of 1000 vehicles connected\n")


def test_per_event_cancels_the_shared_set_up():
    setup, per = 2_000_000_000, 390_000
    small, large = (setup + 1000 * per, 1000), (setup + 3000 * per, 3000)
    assert I.per_event(small, large) == per
    with pytest.raises(ValueError):
        I.per_event(large, small)


def test_every_subject_makes_more_events_in_its_large_run():
    for name, s in I.SUBJECTS.items():
        small, large = s.sizes
        assert s.events(large) > s.events(small) > 0, name
        assert s.argv(small) != s.argv(large), name


def test_without_valgrind_the_message_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no valgrind on it
    assert I.main(["connect"]) == 2
    assert "make valgrind" in capsys.readouterr().err
