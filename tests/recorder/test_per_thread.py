"""A per-thread helper is built once per thread and never shared between threads."""

from __future__ import annotations

import threading

from openenv_harness.recorder.per_thread import per_thread


def test_each_thread_gets_its_own_instance_built_once() -> None:
    built: list[object] = []

    def factory() -> object:
        built.append(object())
        return built[-1]

    get = per_thread(factory)
    mine = get()
    assert get() is mine and len(built) == 1
    theirs: list[object] = []
    workers = [threading.Thread(target=lambda: theirs.extend([get(), get()])) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(built) == 4  # one here, one per worker thread
    assert all(theirs[i] is theirs[i + 1] for i in range(0, 6, 2))
    assert len({id(x) for x in theirs} | {id(mine)}) == 4
