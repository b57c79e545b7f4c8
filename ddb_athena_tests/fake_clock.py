"""Clocks the test moves: `clock()` reads one, `clock.sleep(s)` moves it on."""

import time


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SkippingClock:
    """Monotonic time, moved on by `sleep(s)` instead of waiting: a loop paced by it runs its cycles back to back, each
    in its real time, and reaches its deadlines as it would have (a sync run's `RUN_CLOCK`)."""

    def __init__(self):
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped

    def sleep(self, seconds: float) -> None:
        self.skipped += seconds
