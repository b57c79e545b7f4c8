"""One sync run's state across its cycles, no Dagster: the pace (an idle cycle is recorded at most once a minute; the
log says when cycles back off), the cadence of the checks, and the upkeep that needs the writer's fence, between merges
(compaction of the table and its tombstones once their files call for it, their deleted rows rewritten out a slice at a
time in what is left of a cycle's interval, the tombstones past their retention pruned once a day; never beside a
merge). Expiry and the orphan sweep need no writer: the `streamed_upkeep` runs do them beside
the sync (streamed/jobs.py), and no cycle waits for them. The books asset turns each CycleReport into Dagster events; a
benchmark runs the same object.

What a run needs from its predecessor is read from one place, the table: when its tombstones were last looked at for
pruning (its properties, `maintenance_state`).
"""

import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeVar

from ddb_athena.lake.maintenance import CompactionResult, MaintenanceState
from ddb_athena.streamed.cycle import CycleOutcome, StreamSync

# An idle cycle is recorded at most this often: enough for freshness and the plots, little for the event log.
IDLE_RECORD_SECONDS = 60.0

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class SyncCadence:
    interval_seconds: float
    # After idle cycles the interval doubles up to this (run_cycles); said in the log.
    longest_interval_seconds: float
    # The checks that list S3 or read the table run with every this many recorded merges.
    table_checks_every_cycles: int
    tombstone_pruning_interval: timedelta


@dataclass
class TableCadence:
    """When a table's next cycle is due in a run whose cycles come every `run_interval` seconds: once its own `interval`
    has gone by (to within half the run's interval: the run's cycles are that far apart), or, for a table of a longer
    interval, at the run's interval as soon as its changes come fast enough to reach `buffer_changes` by then (size or
    time, whichever first, as Firehose's buffering hints): quiet, it commits once its interval; busy, it merges with the
    run. Its first cycle counts as `phase` seconds earlier, so tables of one long interval take turns in the run's
    cycles instead of all coming due in the same one."""

    interval: float
    run_interval: float
    buffer_changes: int
    phase: float = 0.0
    _last_start: float | None = None
    _changes_per_second: float = 0.0
    _last_seconds: float | None = None

    def due(self, now: float, at_once: bool = False) -> bool:
        if at_once or self._last_start is None:
            return True
        elapsed, slack = now - self._last_start, self.run_interval / 2
        if elapsed >= self.interval - slack:
            return True
        return elapsed >= self.run_interval - slack and self._changes_per_second * elapsed >= self.buffer_changes

    def fits(self, now: float, run_cycle_started: float, at_once: bool = False) -> bool:
        """Whether a table of a longer interval, due, starts its cycle `now` in the run's cycle that started at
        `run_cycle_started`: when a cycle as long as its last ends within the run's interval (it takes what is left of
        it, as Firehose's buffer waits; the run's next cycle is not held), or it is late by half its interval (its
        freshness bound is two of them at least), or every table cycles `at_once`. Its first cycle in the run starts at
        once; its length is no estimate, so the second waits to be late, and the run's cycles are never held on a guess."""
        if at_once or self._last_start is None or run_cycle_started - self._last_start >= 1.5 * self.interval:
            return True
        return self._last_seconds is not None and now + self._last_seconds <= run_cycle_started + self.run_interval

    def cycled(self, started: float, report: "CycleReport | None", seconds: float = 0.0) -> None:
        """After a cycle that started at `started` and took `seconds` (its report, None when it failed): its changes over
        the time since the one before are the table's rate. A table's first cycle in a run is no estimate of the next
        ones' length (`fits`): it starts the session's and the table's work (a bootstrap reads the whole table)."""
        if self._last_start is not None:
            self._last_seconds = seconds
        self._last_start = started - (self.phase if self._last_start is None else 0.0)
        self._changes_per_second = 0.0
        if report is not None and report.seconds_since_previous_cycle > 0:
            changes = report.outcome.source.get("records_captured") or report.outcome.merged.get("records_consumed") or 0
            self._changes_per_second = changes / report.seconds_since_previous_cycle


def table_cadences(intervals: list[float], buffer_changes: int) -> list[TableCadence]:
    """The cadences of a run's tables, given their intervals in order: the run cycles at the shortest; the k-th table of
    a longer interval has its first cycle count k run intervals early (modulo its own), so they take turns."""
    run_interval, longer, cadences = min(intervals), 0, []
    for interval in intervals:
        phase = 0.0
        if interval > run_interval:
            phase, longer = (longer * run_interval) % interval, longer + 1
        cadences.append(TableCadence(interval, run_interval, buffer_changes, phase))
    return cadences


def cycle_in_turns(
    due: list[T],
    cadence_of: Callable[[T], TableCadence],
    cycle_one: Callable[[T], R],
    started: float,
    clock: Callable[[], float],
    side_by_side: Executor | None = None,
    at_once: bool = False,
) -> list[R]:
    """Cycles the tables `due` in the run's cycle that started at `started`, in two turns, and returns what each
    `cycle_one` returned: first those that merge at the run's own interval (the tightest freshness bound), in
    `side_by_side`'s threads when there are several; once all of them are done, those that declared a longer one, one
    after the other, each only if its cycle fits what is left of the interval by `clock` (`TableCadence.fits`; one
    that does not stays due). A table bound to the run's pace never shares the task's CPU with a slower one's cycle,
    nor waits for one (measured: docs/performance-log.md, 3 December)."""
    first = [table for table in due if cadence_of(table).interval <= cadence_of(table).run_interval]
    then = [table for table in due if cadence_of(table).interval > cadence_of(table).run_interval]
    done = list(side_by_side.map(cycle_one, first)) if side_by_side is not None and len(first) > 1 else [cycle_one(table) for table in first]
    return done + [cycle_one(table) for table in then if cadence_of(table).fits(clock(), started, at_once=at_once)]


class TableUpkeep(Protocol):
    def state(self) -> MaintenanceState: ...

    def prune_tombstones(self, now: datetime) -> int:
        """Prunes the tombstones past their retention (how many), and records the pass on the table."""

    def compact(self, spare_seconds: float) -> dict[str, CompactionResult]:
        """Compacts the table and its tombstones, each if its files call for it, rewriting deleted rows out only as
        many as fit `spare_seconds` (unless overdue): by table, those compacted."""


# The checks a cycle evaluates: (stream_lag_seconds, list_s3, quarantined) -> results by check name.
CycleChecks = Callable[[float | None, bool, bool], dict]


@dataclass
class CycleReport:
    outcome: CycleOutcome
    # False for an idle cycle within a minute of the last recorded one: nothing to record.
    recorded: bool
    seconds_since_previous_cycle: float
    checks: dict = field(default_factory=dict)
    # None: this cycle did not look for tombstones to prune.
    pruned_tombstones: int | None = None
    messages: list[str] = field(default_factory=list)


class SyncRun:
    def __init__(
        self,
        syncer: StreamSync,
        cadence: SyncCadence,
        checks: CycleChecks,
        upkeep: TableUpkeep,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self._syncer, self._cadence, self._checks, self._upkeep = syncer, cadence, checks, upkeep
        self._clock, self._now = clock, now
        self._previous_start: float | None = None
        self._recorded_at: float | None = None
        self._recorded_merges = 0
        self._backing_off = False
        # Read from the table at the run's first upkeep, then kept: no catalog read or Spark job per cycle.
        self._upkeep_state: MaintenanceState | None = None

    def close(self) -> None:
        self._syncer.close()

    def cycle(self, batch: str, bootstrap: bool = False) -> CycleReport:
        started, previous = self._clock(), self._previous_start
        self._previous_start = started
        outcome = self._syncer.cycle(batch, bootstrap=bootstrap)
        report = CycleReport(outcome, recorded=True, seconds_since_previous_cycle=started - previous if previous is not None else 0.0)
        if outcome.idle != self._backing_off:
            self._backing_off = outcome.idle
            report.messages.append(
                f"Nothing to merge: cycles back off, up to {max(self._cadence.interval_seconds, self._cadence.longest_interval_seconds):g} s apart"
                if outcome.idle
                else f"Changes again: a cycle every {self._cadence.interval_seconds:g} s"
            )
        if outcome.idle and self._recorded_at is not None and self._clock() - self._recorded_at < IDLE_RECORD_SECONDS:
            report.recorded = False
            return report
        # The checks that list S3: after the run's first merge, then every few, and on an idle table's recorded cycles
        # (a minute apart); at once when the cycle found trouble. None reads the table: no cycle waits for a scan of it.
        periodic = self._recorded_merges % self._cadence.table_checks_every_cycles == 0
        behind = None if outcome.source.get("stream_caught_up", True) else outcome.source["capture_lag_seconds"]
        quarantined = any(outcome.merged.get(name) for name in ("records_quarantined", "records_type_mismatched", "foreign_files_quarantined"))
        report.checks = self._checks(behind, periodic or outcome.idle, quarantined)
        self._recorded_at = self._clock()
        self._recorded_merges += not outcome.idle
        # What needs the fence runs inside the loop, between merges, never beside them. Idle tables need none.
        if not outcome.idle:
            self._keep_up(report, spare_seconds=self._cadence.interval_seconds - (self._clock() - started))
        return report

    def _keep_up(self, report: CycleReport, spare_seconds: float) -> None:
        if self._upkeep_state is None:
            self._upkeep_state = self._upkeep.state()
        now = self._now()
        if self._upkeep_state.tombstone_pruning_due(self._cadence.tombstone_pruning_interval, now):
            report.pruned_tombstones = self._upkeep.prune_tombstones(now)
            self._upkeep_state = replace(self._upkeep_state, tombstones_pruned_at=now)
            report.messages.append(f"Tombstones past their retention pruned: {report.pruned_tombstones}")
            return
        for table, compaction in self._upkeep.compact(spare_seconds).items():
            report.messages.append(
                f"Compaction of {table}: {compaction.rewritten_data_files} data files rewritten into {compaction.added_data_files} "
                f"({compaction.deleted_rows_files} of them for their deleted rows), {compaction.rewritten_delete_files} delete files merged"
            )
