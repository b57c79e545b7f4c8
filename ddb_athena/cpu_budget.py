"""The books sync's CPU budget: a token bucket over the CPU-seconds of a sync run's processes (this one, the JVM
it starts, Spark's Python workers). No Dagster here.

The bucket fills at the budget's rate, less the share set aside for bursts, and holds at most that share of an
hour's budget: any hour of syncing spends at most `per_minute * 60`, however its cycles vary, as long as the
bucket is handed from each run to the next (`inherit`), so a run's start draws on what its predecessor left
instead of on a fresh burst. The bursts are a run's start (its JVM, the first minutes of JIT compilation) and
maintenance. When the bucket is empty, the loop waits until the refill has paid the deficit before the next
cycle starts: merges come less often on a slow host, up to the longest interval the freshness target allows
(past it, the loop starts the cycle anyway, and the sync spends more than its budget). On a host fast enough
for the budget, the bucket never empties and every cycle keeps the configured interval.
"""

import math
import time
from typing import Callable

import psutil

# Of an hour's budget: what a run's start and a maintenance pass cost beyond warm cycles (README "A sync run's
# CPU budget").
BURST_SHARE = 0.1


class ProcessTreeCpu:
    """CPU-seconds used by a process and its descendants since this meter was made. A descendant that has
    ended keeps what it was last seen to use: the count never goes back."""

    def __init__(self, root: psutil.Process | None = None):
        self._root = root or psutil.Process()
        self._start: dict[tuple[int, float], float] = dict(self._sample())
        self._last = dict(self._start)

    def _sample(self) -> list[tuple[tuple[int, float], float]]:
        sampled = []
        for process in [self._root, *self._root.children(recursive=True)]:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    # (pid, start time): a pid the system reuses is another process.
                    sampled.append(((process.pid, process.create_time()), times.user + times.system))
            except psutil.NoSuchProcess:
                continue
        return sampled

    def __call__(self) -> float:
        for process, used in self._sample():
            self._last[process] = used
        return sum(used - self._start.get(process, 0.0) for process, used in self._last.items())


class CpuBudget:
    """`per_minute` CPU-seconds a minute on average over any hour, with a tenth of the hour's budget for bursts.
    `cpu` counts the CPU-seconds spent so far, `clock` the wall seconds."""

    def __init__(self, per_minute: float, cpu: Callable[[], float] | None = None, clock: Callable[[], float] = time.monotonic):
        if per_minute <= 0:
            raise ValueError(f"a CPU budget needs a positive rate, got {per_minute}")
        self.per_minute = per_minute
        self.refill_per_second = per_minute * (1 - BURST_SHARE) / 60
        self.burst = per_minute * 60 * BURST_SHARE
        self._cpu = cpu or ProcessTreeCpu()
        self._clock = clock
        # Waits the caller would not make in full (freshness first): each let a cycle start the refill had not paid for.
        self.cut_waits = 0
        self.restart()

    def restart(self) -> None:
        """A full bucket from now, and the average counted from now: what was spent before is not charged."""
        self._started = self._updated = self._clock()
        self._spent = self._spent_at_start = self._cpu()
        self.balance = self.burst

    def inherit(self, balance: float, seconds_since: float) -> None:
        """Starts from the bucket a previous run left (`balance`, negative while it owed), refilled for the
        `seconds_since` it was recorded: a run's start is paid from it, not from a bucket of its own."""
        self.balance = min(self.burst, balance + max(0.0, seconds_since) * self.refill_per_second)
        self._updated = self._clock()

    def _update(self) -> None:
        now, spent = self._clock(), self._cpu()
        self.balance = min(self.burst, self.balance + (now - self._updated) * self.refill_per_second) - (spent - self._spent)
        self._updated, self._spent = now, spent

    def wait_seconds(self, longest_wait: float = math.inf) -> float:
        """How long from now the refill takes to pay what the bucket owes (0 when it has credit). A wait longer
        than `longest_wait`, the most the caller will wait, is counted in `cut_waits`."""
        self._update()
        wait = max(0.0, -self.balance) / self.refill_per_second
        self.cut_waits += wait > max(0.0, longest_wait)
        return wait

    def average_per_minute(self) -> float:
        """CPU-seconds a minute since the budget started."""
        self._update()
        elapsed = self._clock() - self._started
        return (self._spent - self._spent_at_start) * 60 / elapsed if elapsed > 0 else 0.0
