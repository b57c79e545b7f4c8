"""The loop of a long-lived sync run: one cycle every interval until the run's time is up or it is asked to stop.

A stop (SIGINT from Ctrl-C, SIGTERM from a terminating run launcher) that arrives during a cycle is
held until the cycle has finished, then delivered again with the previous handlers back in place, so
whatever the process does on that signal (Dagster: end the run as canceled) happens between cycles.
No Dagster here.
"""

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_WAIT_STEP_SECONDS = 0.2


class StopRequest:
    """The first stop signal received while held, if any, or the loop's owner asking it to end after this cycle."""

    def __init__(self):
        self.signal: int | None = None
        self.ending = False

    @property
    def requested(self) -> bool:
        return self.signal is not None or self.ending

    def end_after_cycle(self) -> None:
        """The loop ends after the running cycle, as at its deadline (no signal is delivered)."""
        self.ending = True

    @contextmanager
    def held(self) -> Iterator[None]:
        """Within the block, a stop signal is recorded instead of acted on (main thread only: elsewhere
        Python cannot set handlers, and signals reach the main thread anyway)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}

        def record(number, _frame):
            self.signal = self.signal or number

        for number in STOP_SIGNALS:
            signal.signal(number, record)
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def deliver(self) -> None:
        """Acts on a held stop now, with the handlers that were in place before."""
        if self.signal is not None:
            signal.raise_signal(self.signal)


def run_cycles(
    cycle: Callable[[int], bool],
    interval_seconds: float,
    run_seconds: float,
    stop: StopRequest | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    idle_interval_seconds: float | None = None,
) -> int:
    """Calls `cycle(1)`, `cycle(2)`, ... one `interval_seconds` apart (start to start; back to back when a
    cycle takes longer) while the next one would start within `run_seconds` (0: a single cycle) and no stop
    is requested. Returns right after the last cycle (a successor queued behind this run starts sooner)
    with how many cycles ran; a held stop is delivered then.

    `cycle` returns whether it found work: after each idle one the interval doubles, up to `idle_interval_seconds`,
    and the first cycle that finds work brings it back (a quiet table costs fewer requests; a busy one keeps the
    interval)."""
    if interval_seconds <= 0 or run_seconds < 0:
        raise ValueError(f"interval must be positive and run time not negative, got {interval_seconds} and {run_seconds}")
    longest = max(interval_seconds, idle_interval_seconds or interval_seconds)
    stop = stop or StopRequest()
    deadline = clock() + run_seconds
    number, wait = 0, interval_seconds
    with stop.held():
        while True:
            number += 1
            started = clock()
            busy = cycle(number)
            wait = interval_seconds if busy else min(longest, wait * 2)
            next_start = max(started + wait, clock())
            if stop.requested or next_start >= deadline:
                break
            while not stop.requested and clock() < next_start:
                sleep(min(_WAIT_STEP_SECONDS, max(0.0, next_start - clock())))
            if stop.requested:
                break
    stop.deliver()
    return number
