"""The loop of a long-lived sync run: one cycle every interval until the run's time is up or it is asked to stop.

A stop (SIGINT from Ctrl-C, SIGTERM from a terminating run launcher) that arrives during a cycle is
held until the cycle has finished, then delivered again with the previous handlers back in place, so
whatever the process does on that signal (Dagster: end the run as canceled) happens between cycles.

A signal the loop's owner chooses to ride out (`rides_out`: ECS stopping a Fargate Spot task, SIGTERM then SIGKILL
a grace later) stops nothing at once: the loop goes on, each cycle followed at once by the next, whether or not it found
work (the successor, starting meanwhile, takes over from the freshest commit), and its last cycle is the last that ends
`grace_seconds` after the signal. No Dagster here.
"""

import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_WAIT_STEP_SECONDS = 0.2
# The cycles whose longest bounds the last start within a grace: the recent ones, not a run's first (a bootstrap, a
# catch-up), which would end a ride-out a minute early.
RECENT_CYCLES = 5


class StopRequest:
    """The first stop signal received while held, if any, or the loop's owner asking it to end after this cycle.

    `rides_out(signal)` (called between cycles, never in the handler) says whether a held signal is ridden out
    instead: then the loop ends by `grace_seconds` after it (`last_start`), and the signal is not delivered."""

    def __init__(self, rides_out: Callable[[int], bool] | None = None, grace_seconds: float = 0.0):
        self.signal: int | None = None
        self.received_at: float | None = None
        self.ending = False
        self.rides_out, self.grace_seconds = rides_out, grace_seconds
        self.ridden_out_at: float | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None or self.ending

    @property
    def riding_out(self) -> bool:
        """A stop signal is being ridden out: the loop ends within its grace."""
        return self.ridden_out_at is not None

    def end_after_cycle(self) -> None:
        """The loop ends after the running cycle, as at its deadline (no signal is delivered)."""
        self.ending = True

    @contextmanager
    def held(self, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
        """Within the block, a stop signal is recorded instead of acted on, with when by `clock` (main thread only:
        elsewhere Python cannot set handlers, and signals reach the main thread anyway)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}

        def record(number, _frame):
            if self.signal is None:
                self.signal, self.received_at = number, clock()

        for number in STOP_SIGNALS:
            signal.signal(number, record)
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def settle(self) -> None:
        """Decides on a held signal: ridden out (the loop goes on, to the grace's end) or a stop."""
        if self.signal is not None and self.ridden_out_at is None and self.rides_out is not None and self.rides_out(self.signal):
            self.signal, self.ridden_out_at = None, self.received_at

    def last_start(self, deadline: float, longest_cycle: float) -> float:
        """The latest start of a cycle: before the run's deadline, and, with a signal ridden out, early enough for a
        cycle as long as `longest_cycle` to end within its grace."""
        if self.ridden_out_at is None:
            return deadline
        return min(deadline, self.ridden_out_at + self.grace_seconds - longest_cycle)

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
    is requested (a ridden-out signal moves that end earlier: `StopRequest.last_start`). Returns right after the
    last cycle (a successor queued behind this run starts sooner) with how many cycles ran; a held stop is
    delivered then.

    `cycle` returns whether it found work: after each idle one the interval doubles, up to `idle_interval_seconds`,
    and the first cycle that finds work brings it back (a quiet table costs fewer requests; a busy one keeps the
    interval)."""
    if interval_seconds <= 0 or run_seconds < 0:
        raise ValueError(f"interval must be positive and run time not negative, got {interval_seconds} and {run_seconds}")
    longest_interval = max(interval_seconds, idle_interval_seconds or interval_seconds)
    stop = stop or StopRequest()
    deadline = clock() + run_seconds
    number, wait, recent = 0, interval_seconds, deque(maxlen=RECENT_CYCLES)

    with stop.held(clock):
        while True:
            number += 1
            started = clock()
            busy = cycle(number)
            recent.append(clock() - started)
            wait = interval_seconds if busy else min(longest_interval, wait * 2)
            if not _wait_for_next(stop, clock, sleep, started + wait, deadline, max(recent)):
                break
    stop.deliver()
    return number


def _wait_for_next(stop: StopRequest, clock, sleep, at_interval: float, deadline: float, longest_cycle: float) -> bool:
    """Waits for the next cycle's start (`at_interval`, or at once riding a stop out); False when the loop ends instead."""
    while True:
        stop.settle()
        # Riding a stop out, every cycle is followed at once, an idle one too (backing off would spend the grace
        # waiting): the run's last commit comes as late as it can, and a change made meanwhile is not left to the
        # successor's first cycle.
        next_start = clock() if stop.riding_out else max(at_interval, clock())
        if stop.requested or next_start >= stop.last_start(deadline, longest_cycle):
            return False
        if clock() >= next_start:
            return True
        sleep(min(_WAIT_STEP_SECONDS, next_start - clock()))
