"""The engine's lock with a fair step boundary (`treesearch.engine.door`): a thread that asks for the
lock while a step runs gets it before the next step, however many steps the stepping thread wants
to run; a thread not asking does not hold a step up; and the lock is reentrant."""

from __future__ import annotations

import threading
import time

from treesearch.engine.door import Door


def _stepper(door: Door, cv: threading.Condition, log: list, steps: int, started: threading.Event) -> None:
    with door:
        started.set()
        for i in range(steps):
            door.wait_turns(cv)
            log.append(f"step {i}")
            while i == 0 and door.waiting == 0:  # step 0 lasts until the caller has asked
                time.sleep(0.001)


def test_a_thread_asking_for_the_lock_during_a_step_gets_it_before_the_next_step():
    door, log = Door(), []
    cv, started = door.cond(), threading.Event()
    stepper = threading.Thread(target=_stepper, args=(door, cv, log, 6, started))
    stepper.start()
    started.wait()
    while not log:  # the first step is under way
        time.sleep(0.001)

    def between_steps() -> None:
        with door:
            log.append("caller")

    caller = threading.Thread(target=between_steps)
    caller.start()
    caller.join(timeout=10)
    stepper.join(timeout=10)
    assert not caller.is_alive() and not stepper.is_alive()
    # it asked during step 0, and ran before step 1 (no barging by the stepping thread)
    assert log == ["step 0", "caller"] + [f"step {i}" for i in range(1, 6)]
    assert door.waiting == 0


class _Turns:
    """A stand-in condition that records each wait and, in it, lets one counted-in thread through."""

    def __init__(self, door: Door) -> None:
        self.door, self.waits = door, 0

    def wait(self, timeout: float) -> None:
        self.waits += 1
        self.door.count_in(-1)


def test_with_no_thread_asking_the_steps_run_back_to_back_and_the_lock_is_reentrant():
    door = Door()
    turns = _Turns(door)
    with door:
        with door:  # reentrant, as the session's and the engine's `with lock` nest
            for _ in range(1000):
                door.wait_turns(turns)  # type: ignore[arg-type]
            assert turns.waits == 0  # nothing was counted in: no step waited
            door.count_in(2)  # two threads asking: the next step waits exactly until both are in
            door.wait_turns(turns)  # type: ignore[arg-type]
            assert turns.waits == 2
    assert door.waiting == 0
