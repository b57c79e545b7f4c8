"""A sync run's state across cycles (no Spark, no Dagster): what is recorded, when the checks and the upkeep run."""

from datetime import UTC, datetime, timedelta

from ddb_athena.lake.maintenance import CompactionResult, MaintenanceResult, MaintenanceState, TableFiles
from ddb_athena.streamed.cycle import CycleOutcome
from ddb_athena.streamed.sync_run import SyncCadence, SyncRun
from ddb_athena_tests.fake_clock import FakeClock

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
CADENCE = SyncCadence(
    interval_seconds=10,
    longest_interval_seconds=20,
    table_checks_every_cycles=3,
    maintenance_interval=timedelta(minutes=15),
    orphan_sweep_interval=timedelta(hours=24),
)
FILES = TableFiles(data_files=1, delete_files=0, files_bytes=1, metadata_files=1, snapshots=1)


class Script:
    """The syncer, checks and upkeep a SyncRun drives, answering as told and keeping what it was asked."""

    def __init__(self, clock: FakeClock, maintained_at: datetime | None = T0):
        self.clock, self.maintained_at = clock, maintained_at
        self.next: list[CycleOutcome] = []
        self.checks: list[tuple] = []
        self.upkeep: list[str] = []
        # Whether the table's files call for compaction, at each of the next asks (after those: no).
        self.compaction_due: list[bool] = []

    def cycle(self, batch: str, bootstrap: bool = False) -> CycleOutcome:
        self.clock.sleep(3)
        return self.next.pop(0)

    def check(self, *when) -> dict:
        self.checks.append(when)
        return {"checked": when}

    def state(self) -> MaintenanceState:
        self.upkeep.append("state")
        return MaintenanceState(self.maintained_at, None)

    def maintain(self, now: datetime, remove_orphans: bool) -> MaintenanceResult:
        self.upkeep.append(f"maintain sweep={remove_orphans}")
        return MaintenanceResult(FILES, FILES, 0, 0, 0, 0, None, 0)

    def compact(self) -> CompactionResult | None:
        self.upkeep.append("asked to compact")
        return CompactionResult(4, 1) if self.compaction_due and self.compaction_due.pop(0) else None


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


def test_upkeep_reads_the_tables_state_once_compacts_when_its_files_call_for_it_and_maintains_when_due():
    script, wall = Script(FakeClock(), maintained_at=T0 - timedelta(minutes=10)), [T0]
    run = a_run(script, wall)
    script.next = [merged() for _ in range(5)] + [IDLE]
    script.compaction_due = [False, True, False, False]
    quiet = run.cycle("b0")  # the files do not call for it
    wall[0] = T0 + timedelta(minutes=1)
    compacted = run.cycle("b1")
    wall[0] = T0 + timedelta(minutes=3)
    run.cycle("b2")
    wall[0] = T0 + timedelta(minutes=5)
    maintained = run.cycle("b3")  # 15 minutes since the table was last maintained (it compacts too); never swept for orphans
    wall[0] = T0 + timedelta(minutes=6)
    run.cycle("b4")
    wall[0] = T0 + timedelta(minutes=30)
    run.cycle("b5")  # idle: no upkeep
    assert script.upkeep == ["state", "asked to compact", "asked to compact", "asked to compact", "maintain sweep=True", "asked to compact"]
    assert compacted.messages == ["Compaction: 4 data files rewritten into 1, 0 delete files merged"] and maintained.maintenance is not None
    assert quiet.messages == [] and not script.compaction_due
