"""A sync run's state across cycles (no Spark, no Dagster): what is recorded, when the checks and the upkeep run."""

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from ddb_athena.lake.maintenance import CompactionResult, MaintenanceState
from ddb_athena.streamed.cycle import CycleOutcome
from ddb_athena.streamed.sync_run import CycleReport, SyncCadence, SyncRun, cycle_in_turns, table_cadences
from ddb_athena_tests.fake_clock import FakeClock

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
CADENCE = SyncCadence(
    interval_seconds=10,
    longest_interval_seconds=20,
    table_checks_every_cycles=3,
    tombstone_pruning_interval=timedelta(hours=24),
)


class Script:
    """The syncer, checks and upkeep a SyncRun drives, answering as told and keeping what it was asked."""

    def __init__(self, clock: FakeClock, tombstones_pruned_at: datetime | None = T0):
        self.clock, self.tombstones_pruned_at = clock, tombstones_pruned_at
        self.next: list[CycleOutcome] = []
        self.checks: list[tuple] = []
        self.upkeep: list[str] = []
        # Which of the table's and its tombstones' files call for compaction, at each of the next asks (after those: none).
        self.compaction_due: list[tuple[str, ...]] = []

    def cycle(self, batch: str, bootstrap: bool = False) -> CycleOutcome:
        self.clock.sleep(3)
        return self.next.pop(0)

    def check(self, *when) -> dict:
        self.checks.append(when)
        return {"checked": when}

    def state(self) -> MaintenanceState:
        self.upkeep.append("state")
        return MaintenanceState(T0, None, self.tombstones_pruned_at)

    def prune_tombstones(self, now: datetime) -> int:
        self.upkeep.append(f"prune at {now:%H:%M}")
        return 2

    def compact(self, spare_seconds: float) -> dict[str, CompactionResult]:
        self.upkeep.append(f"asked to compact in {spare_seconds:g} s")
        return {table: CompactionResult(4, 1) for table in (self.compaction_due.pop(0) if self.compaction_due else ())}


def merged(**source) -> CycleOutcome:
    return CycleOutcome({"stream_caught_up": True, **source}, {"records_quarantined": 0}, idle=False)


IDLE = CycleOutcome({}, {}, idle=True)


def a_run(script: Script, wall: list[datetime]) -> SyncRun:
    return SyncRun(script, CADENCE, checks=script.check, upkeep=script, clock=script.clock, now=lambda: wall[0])


def test_idle_cycles_are_recorded_once_a_minute_and_the_log_says_when_cycles_back_off():
    script, wall = Script(FakeClock()), [T0]
    run = a_run(script, wall)
    script.next = [merged(), IDLE, IDLE, IDLE, merged()]
    reports = [run.cycle("b1")]
    for _ in range(3):
        script.clock.sleep(20)
        reports.append(run.cycle("b"))
    script.clock.sleep(40)
    reports.append(run.cycle("b"))
    # Starts at 0, 23, 46, 69 and 112 s: the idle ones within a minute of the last recorded cycle are not recorded.
    assert [report.recorded for report in reports] == [True, False, False, True, True]
    assert reports[1].messages == ["Nothing to merge: cycles back off, up to 20 s apart"]
    assert reports[4].messages == ["Changes again: a cycle every 10 s"]
    assert reports[1].seconds_since_previous_cycle == 23  # start to start


def test_the_checks_list_s3_every_few_merges_and_at_once_when_behind_or_quarantined_and_never_read_the_table():
    script, wall = Script(FakeClock()), [T0]
    run = a_run(script, wall)
    behind = merged(stream_caught_up=False, capture_lag_seconds=42.0)
    quarantined = CycleOutcome({"stream_caught_up": True}, {"records_quarantined": 3}, idle=False)
    script.next = [merged(), merged(), behind, quarantined, merged()]
    for number in range(5):
        run.cycle(f"b{number}")
    # (stream_lag_seconds, list_s3, quarantined): the first merge and every third after it list S3; none reads the table.
    assert script.checks == [
        (None, True, False),
        (None, False, False),
        (42.0, False, False),
        (None, True, True),
        (None, False, False),
    ]


def test_upkeep_reads_the_tables_state_once_compacts_when_files_call_for_it_and_prunes_tombstones_once_a_day():
    script, wall = Script(FakeClock(), tombstones_pruned_at=T0 - timedelta(hours=23, minutes=55)), [T0]
    run = a_run(script, wall)
    script.next = [merged() for _ in range(5)] + [IDLE]
    script.compaction_due = [(), ("lake.books", "lake.books_tombstones"), (), ()]
    quiet = run.cycle("b0")  # the files do not call for it
    wall[0] = T0 + timedelta(minutes=1)
    compacted = run.cycle("b1")
    wall[0] = T0 + timedelta(minutes=3)
    run.cycle("b2")
    wall[0] = T0 + timedelta(minutes=5)
    pruned = run.cycle("b3")  # a day since the tombstones were last looked at: that cycle's upkeep
    wall[0] = T0 + timedelta(minutes=6)
    run.cycle("b4")
    wall[0] = T0 + timedelta(minutes=30)
    run.cycle("b5")  # idle: no upkeep
    # No expiry, no orphan sweep: those are the upkeep runs', beside the loop.
    # Each asked with what is left of the cycle's 10-s interval after its 3-s merge: the time deleted rows may take.
    assert script.upkeep == ["state", *["asked to compact in 7 s"] * 3, "prune at 12:05", "asked to compact in 7 s"]
    assert compacted.messages == [
        "Compaction of lake.books: 4 data files rewritten into 1 (0 of them for their deleted rows), 0 delete files merged",
        "Compaction of lake.books_tombstones: 4 data files rewritten into 1 (0 of them for their deleted rows), 0 delete files merged",
    ]
    assert pruned.pruned_tombstones == 2 and pruned.messages == ["Tombstones past their retention pruned: 2"]
    assert quiet.messages == [] and quiet.pruned_tombstones is None and not script.compaction_due


def test_a_table_whose_tombstones_were_never_looked_at_prunes_them_at_its_first_merge():
    script, wall = Script(FakeClock(), tombstones_pruned_at=None), [T0]
    run = a_run(script, wall)
    script.next = [merged(), merged()]
    first, second = run.cycle("b0"), run.cycle("b1")
    assert first.pruned_tombstones == 2 and second.pruned_tombstones is None
    assert script.upkeep == ["state", "prune at 12:00", "asked to compact in 7 s"]


def report_of(changes: int, seconds_since_previous: float) -> CycleReport:
    return CycleReport(merged(records_captured=changes), recorded=True, seconds_since_previous_cycle=seconds_since_previous)


def test_a_table_of_a_longer_interval_merges_at_it_while_quiet_and_with_the_run_once_busy():
    """Run cycles 20 s apart; a table declared at 120 s. Quiet (2 changes a second: 1,000 would take 500 s) it is due
    only once its 120 s have gone by (within half the run's interval); busy (100 a second) at the run's next cycle."""
    run_table, slow = table_cadences([20.0, 120.0], buffer_changes=1000)
    assert run_table.due(0.0) and slow.due(0.0)  # first cycles: every table
    run_table.cycled(0.0, report_of(50, 0))
    slow.cycled(0.0, report_of(50, 0))
    assert run_table.due(20.0) and not slow.due(20.0) and not slow.due(100.0) and slow.due(110.0)
    slow.cycled(110.0, report_of(220, 110.0))  # 2 a second
    assert not slow.due(130.0) and not slow.due(200.0) and slow.due(220.0)
    slow.cycled(220.0, report_of(11_000, 110.0))  # 100 a second: 1,000 in 10 s
    assert not slow.due(225.0) and slow.due(240.0)
    # A failed cycle tells nothing of the rate: the table waits its interval again.
    slow.cycled(240.0, None)
    assert not slow.due(260.0) and slow.due(350.0)
    # Riding out a stop, every table every cycle.
    assert slow.due(241.0, at_once=True)


def test_ten_tables_of_a_longer_interval_take_turns_in_the_runs_cycles():
    """Books at the run's 20 s and ten quiet tables at 120 s: after their first cycle together, no run cycle has more
    than two of them (ten over six turns), and each still merges every 120 s."""
    cadences = table_cadences([20.0] + [120.0] * 10, buffer_changes=1000)
    merges: dict[int, list[float]] = {index: [] for index in range(11)}
    due_per_cycle = []
    for cycle in range(60):
        now = cycle * 20.0
        due = [index for index, cadence in enumerate(cadences) if cadence.due(now)]
        for index in due:
            cadences[index].cycled(now, report_of(10, 20.0))
            merges[index].append(now)
        due_per_cycle.append(len(due) - 1)
    assert due_per_cycle[0] == 10 and max(due_per_cycle[1:]) == 2 and merges[0] == [cycle * 20.0 for cycle in range(60)]
    for index in range(1, 11):
        gaps = {later - earlier for earlier, later in zip(merges[index][1:], merges[index][2:], strict=False)}
        assert gaps == {120.0}, (index, merges[index])


def test_the_tables_of_the_runs_interval_cycle_side_by_side_first_and_the_slower_ones_after_them_as_they_fit():
    """Run cycles 20 s apart: a and c (20 s) side by side, both started before either ends; d (60 s) and b (150 s)
    only once both are done, one after the other, b left due when its last cycle's length no longer fits what is
    left of the interval, taken all the same riding out a stop."""
    cadences = dict(zip("abcd", table_cadences([20.0, 150.0, 20.0, 60.0], buffer_changes=1000), strict=True))
    cadences["b"].cycled(-170.0, report_of(10, 150.0))  # b's first cycle at -170 s; its second took 12 s
    cadences["b"].cycled(-20.0, report_of(10, 150.0), seconds=12.0)
    now, events, both_started = [0.0], [], threading.Barrier(2, timeout=10)

    def cycle_one(table: str) -> str:
        events.append(f"{table} starts")
        if table in "ac":
            both_started.wait()  # fails unless a and c run at once
        now[0] += 5.0  # each cycle takes 5 s of the run's clock
        events.append(f"{table} ends")
        return table

    with ThreadPoolExecutor(max_workers=4) as side_by_side:
        assert cycle_in_turns(list("dabc"), cadences.get, cycle_one, 0.0, lambda: now[0], side_by_side) == ["a", "c", "d"]
        assert set(events[:2]) == {"a starts", "c starts"} and set(events[2:4]) == {"a ends", "c ends"}
        assert events[4:] == ["d starts", "d ends"]  # b at 15 s + 12 s would end after the next cycle's 20 s
        now[0], events[:] = 0.0, []
        assert cycle_in_turns(["b", "d"], cadences.get, cycle_one, 0.0, lambda: now[0], side_by_side, at_once=True) == ["b", "d"]
    assert cycle_in_turns([], cadences.get, cycle_one, 0.0, lambda: now[0]) == []


def test_a_slower_table_starts_only_if_its_cycle_fits_what_is_left_of_the_interval_unless_late_by_half_its_own():
    """Run cycles 30 s apart; a table at 150 s. Its first cycle in the run (90 s: a bootstrap) starts at once and is
    no estimate: the second waits until half its interval late (225 s after the first: the run's cycle at 240 s),
    and takes 8 s. Then, in the run's cycle at 390 s, it starts at 400 s (ends by 408, within the 420 s the next cycle
    starts at), not at 415; once half its interval late again (the cycle at 480 s), whatever is left; riding out a
    stop, always."""
    _, slow = table_cadences([30.0, 150.0], buffer_changes=1000)
    assert slow.fits(5.0, 0.0)
    slow.cycled(0.0, report_of(300, 150.0), seconds=90.0)
    assert slow.due(150.0) and not slow.fits(151.0, 150.0) and not slow.fits(211.0, 210.0) and slow.fits(241.0, 240.0)
    slow.cycled(240.0, report_of(300, 240.0), seconds=8.0)
    assert not slow.due(360.0) and slow.due(390.0)
    assert slow.fits(400.0, 390.0) and slow.fits(412.0, 390.0) and not slow.fits(415.0, 390.0)
    assert slow.fits(415.0, 390.0, at_once=True)
    assert slow.fits(455.0, 450.0) and not slow.fits(475.0, 450.0) and slow.fits(505.0, 480.0)
