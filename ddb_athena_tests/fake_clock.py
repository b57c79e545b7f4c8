"""Clocks the test moves: `clock()` reads one, `clock.sleep(s)` moves it on."""

import time
from collections.abc import Callable


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SkippingClock:
    """Monotonic time, moved on by `sleep(s)` instead of waiting: a loop paced by it runs its cycles back to back, each
    in its real time, and reaches its deadlines as it would have (a sync run's `RUN_CLOCK`). What happens in the world
    while the loop waits is `during_each_wait`'s (e.g. a writer's change): it runs once in each skipped wait."""

    def __init__(self):
        self.skipped = 0.0
        self.during_each_wait: Callable[[], None] = lambda: None

    def __call__(self) -> float:
        return time.monotonic() + self.skipped

    def sleep(self, seconds: float) -> None:
        self.during_each_wait()
        self.skipped += seconds


class FastClock:
    """Monotonic time running `speed` times as fast (its sleeps as much shorter): a loop paced by it sees every piece of
    its work take `speed` times as long, as on a host that much slower, whatever this one's speed."""

    def __init__(self, speed: float):
        self.speed, self._origin = speed, time.monotonic()

    def __call__(self) -> float:
        return self._origin + (time.monotonic() - self._origin) * self.speed

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / self.speed)


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}"
        time.sleep(0.02)


class CountedProbe:
    """A writer's progress probe (answering `answer()`) that counts the looks of its lease's renewer: one a renewal
    period while it renews. A test moves the writer's clock, then waits for the renewer to have looked."""

    def __init__(self, answer: Callable[[], object] = lambda: None):
        self.looks, self._answer = 0, answer

    def __call__(self) -> object:
        self.looks += 1
        return self._answer()

    def wait(self, looks: int = 1) -> None:
        """Until `looks` more looks: each one's renewal is done by the next."""
        wanted = self.looks + looks
        wait_for(lambda: self.looks >= wanted, f"{looks} more looks of the lease's renewer")
