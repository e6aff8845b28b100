"""The store's read gate: readers share it, a WAL reset closes it for a moment (``read_gate.py``)."""

from __future__ import annotations

import threading

from openenv_harness.recorder.store.read_gate import ReadGate


def test_a_reset_waits_for_readers_inside_and_holds_new_ones_back() -> None:
    gate = ReadGate()
    inside, leave = threading.Event(), threading.Event()
    entered_late = threading.Event()

    def long_reader() -> None:
        with gate.reading():
            inside.set()
            leave.wait(30)

    def late_reader() -> None:
        with gate.reading():
            entered_late.set()

    first = threading.Thread(target=long_reader)
    first.start()
    assert inside.wait(30)
    with gate.alone(timeout_s=0.05) as emptied:
        assert emptied is False, "a reader still inside: the wait ran out"
    leave.set()
    first.join(30)
    assert gate.readers == 0

    with gate.alone(timeout_s=30) as emptied:
        assert emptied is True
        late = threading.Thread(target=late_reader)
        late.start()
        late.join(0.2)
        assert not entered_late.is_set(), "a reader arriving during the reset waits for it"
    late.join(30)
    assert entered_late.is_set(), "and gets in once it is done"


def test_a_read_inside_a_read_is_not_held_back_by_a_waiting_reset() -> None:
    gate = ReadGate()
    outer_in, reset_waiting, nested_done = threading.Event(), threading.Event(), threading.Event()

    def reader() -> None:
        with gate.reading():
            outer_in.set()
            reset_waiting.wait(30)
            with gate.reading():  # would deadlock if the reset, waiting for this thread, held it back
                nested_done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert outer_in.wait(30)

    def reset() -> None:
        with gate.alone(timeout_s=30):
            pass

    resetter = threading.Thread(target=reset)
    resetter.start()
    while not gate._closed:  # the reset has closed the gate and waits for the reader
        threading.Event().wait(0.001)
    reset_waiting.set()
    thread.join(30)
    resetter.join(30)
    assert nested_done.is_set() and not thread.is_alive() and not resetter.is_alive()
    assert gate.readers == 0
