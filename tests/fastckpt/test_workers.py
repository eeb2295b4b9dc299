"""fastckpt.workers: tasks handed to warm threads (no thread start on the caller's path once one
is idle), each worker one task at a time, and retire() leaving no thread behind."""
from __future__ import annotations

import threading

import pytest

from fastckpt.workers import Workers


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_a_task_runs_and_joins_as_a_thread():
    workers = Workers("w-join")
    ran = threading.Event()
    task = workers.run(ran.set, "w-join-one")
    task.join(10)
    assert ran.is_set() and not task.is_alive()
    workers.retire()
    assert not _threads("w-join")


def test_an_idle_worker_takes_the_next_task_without_a_new_thread():
    workers = Workers("w-warm")
    idents = []
    workers.run(lambda: idents.append(threading.get_ident()), "w-warm-a").join(10)
    started = []
    real_start = threading.Thread.start
    threading.Thread.start = lambda self: (started.append(self.name), real_start(self))[1]
    try:
        workers.run(lambda: idents.append(threading.get_ident()), "w-warm-b").join(10)
    finally:
        threading.Thread.start = real_start
    assert [n for n in started if n.startswith("w-warm")] == [] and idents[0] == idents[1]
    workers.retire()


def test_busy_workers_are_never_handed_a_second_task():
    workers = Workers("w-busy")
    release = threading.Event()
    inside = [threading.Event(), threading.Event()]
    names = []

    def hold(i):
        names.append(threading.current_thread().name)
        inside[i].set()
        release.wait(10)

    tasks = [workers.run(lambda i=i: hold(i), f"w-busy-{i}") for i in range(2)]
    assert inside[0].wait(10) and inside[1].wait(10)  # both run at once: two threads
    assert sorted(names) == ["w-busy-0", "w-busy-1"]  # each worker is named after its task
    release.set()
    for t in tasks:
        t.join(10)
    assert not any(t.is_alive() for t in tasks)
    workers.retire()
    assert not _threads("w-busy")


def test_a_worker_busy_at_retire_ends_after_its_task_and_new_tasks_get_new_workers():
    workers = Workers("w-retire")
    release, inside = threading.Event(), threading.Event()
    task = workers.run(lambda: (inside.set(), release.wait(10)), "w-retire-busy")
    assert inside.wait(10)
    workers.retire()  # the busy one is not waited for
    release.set()
    task.join(10)
    for t in _threads("w-retire"):
        t.join(10)
    assert not _threads("w-retire")  # it ended rather than waiting idle for ever
    ran = threading.Event()
    workers.run(ran.set, "w-retire-after").join(10)
    assert ran.is_set()
    workers.retire()
    assert not _threads("w-retire")


def test_a_task_that_raises_reaches_the_excepthook_and_leaves_its_worker_usable(monkeypatch):
    workers = Workers("w-raise")
    said = []
    monkeypatch.setattr(threading, "excepthook", lambda args: said.append((args.exc_type, args.thread.name)))

    def boom():
        raise RuntimeError("planted")

    workers.run(boom, "w-raise-boom").join(10)
    assert said == [(RuntimeError, "w-raise-boom")]
    ran = threading.Event()
    workers.run(ran.set, "w-raise-next").join(10)
    assert ran.is_set()
    workers.retire()
    assert not _threads("w-raise")


def test_a_worker_idle_past_its_time_ends_and_the_next_task_starts_another():
    workers = Workers("w-idle", idle_s=0.05)
    workers.run(lambda: None, "w-idle-a").join(10)
    for t in _threads("w-idle"):
        t.join(10)  # it ends by itself
    assert not _threads("w-idle")
    ran = threading.Event()
    workers.run(ran.set, "w-idle-b").join(10)
    assert ran.is_set()
    workers.retire()
    assert not _threads("w-idle")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_task_ending_its_thread_is_done_and_the_next_task_gets_a_live_worker():
    workers = Workers("w-exit")
    first = workers.run(lambda: (_ for _ in ()).throw(SystemExit), "w-exit-first")  # ends its thread, silently
    first.join(10)
    assert not first.is_alive()
    ran = threading.Event()
    workers.run(ran.set, "w-exit-next").join(10)
    assert ran.is_set()
    workers.retire()
    for t in _threads("w-exit"):  # the first one's thread may still be ending (its exception said)
        t.join(10)
    assert not _threads("w-exit")


def test_a_task_joining_itself_raises_as_a_thread_would():
    workers = Workers("w-self")
    box = {}

    def me():
        try:
            box["task"].join(1)
        except RuntimeError as e:
            box["said"] = str(e)

    ready = threading.Event()
    box["task"] = workers.run(lambda: (ready.wait(10), me()), "w-self-task")
    ready.set()
    box["task"].join(10)
    assert box.get("said") == "w-self-task cannot join itself"
    workers.retire()


def test_an_idle_worker_holds_nothing_of_its_last_task():
    import gc
    import weakref

    class Held:
        pass

    workers = Workers("w-hold")
    held = Held()
    ref = weakref.ref(held)
    workers.run(lambda h=held: None, "w-hold-a").join(10)
    del held
    gc.collect()
    assert ref() is None  # the idle worker let go of the task and what its closure held
    workers.retire()
