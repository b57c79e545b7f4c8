"""Streamed tables' assets: a table's stream captured as change files (<name>_source, books_source) and MERGEd into
Iceberg (<name>_iceberg, books_iceberg), for every streamed table declared in ddb_athena/tables.toml. One long-lived
sync run keeps every streamed table in sync in one JVM, cycling every few seconds: a table costs its commits, not a
task. Each table keeps its own lease, writer branch and checks; one table's failure leaves the others syncing.

Every cycle that does something for a table is recorded as a materialization of its two assets (idle cycles once a
minute, so freshness holds and the event log stays small), with the table's checks evaluated beside it: backlog and
quarantine every time, the checks that read the table every few cycles.
"""

import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetExecutionContext,
    AssetMaterialization,
    AssetObservation,
    AssetSpec,
    Config,
    multi_asset,
)
from pydantic import Field

from ddb_athena.lake.change_merge import STREAM_POSITIONS_PROPERTY, tombstone_table
from ddb_athena.lake.maintenance import (
    FIRST_REWRITE_BYTES_PER_SECOND,
    CompactionResult,
    MaintenanceResult,
    MaintenanceState,
    compact_if_due,
    maintenance_state,
    prune_tombstones,
    record_tombstones_pruned,
    table_totals,
)
from ddb_athena.lake.session_config import runs_in_this_process
from ddb_athena.lake.table_spec import TARGET_FILE_BYTES
from ddb_athena.lake.writer_branch import MainMovedError, WriterBranch, WriterFencedError
from ddb_athena.lib.declarations import MAX_MERGE_INTERVAL_SECONDS, MIN_MERGE_INTERVAL_SECONDS, TableDeclaration, declared_tables
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases
from ddb_athena.lib.settings import MAX_SYNC_RUN_MINUTES
from ddb_athena.lib.writer_lease import LeaseHeldError, LeaseLostError
from ddb_athena.lib.writer_pools import warn_unless_writers_queue
from ddb_athena.streamed.check_results import cycle_check_results
from ddb_athena.streamed.cycle import StreamSync
from ddb_athena.streamed.handover import waiting_writers
from ddb_athena.streamed.run_loop import StopRequest, run_cycles
from ddb_athena.streamed.sync_run import SyncCadence, SyncRun, TableCadence, cycle_in_turns, table_cadences


@dataclass(frozen=True)
class StreamedAssets:
    """The two assets of a streamed table. The specs are skippable: each cycle's materializations are logged as events,
    no output is returned."""

    table: TableDeclaration
    source: AssetSpec
    iceberg: AssetSpec


def streamed_assets(table: TableDeclaration) -> StreamedAssets:
    source = AssetSpec(
        table.source_asset,
        group_name=table.name,
        kinds={"dynamodb", "s3"},
        description=f"DynamoDB stream changes of the {table.name} table, captured as change files under s3://<bucket>/{table.source_prefix}/.",
        skippable=True,
    )
    iceberg = AssetSpec(
        table.table_asset,
        deps=[source],
        group_name=table.name,
        kinds={"spark", "iceberg"},
        description=f"<namespace>.{table.iceberg_table}: the {table.name} table in Iceberg, kept in sync by a MERGE INTO every few seconds.",
        skippable=True,
    )
    return StreamedAssets(table, source, iceberg)


STREAMED = {name: streamed_assets(table) for name, table in declared_tables().items() if table.kind == "streamed"}


class SyncConfig(Config):
    bootstrap: bool = Field(
        default=False,
        description="Scan the whole table and replay the stream after it (first cycle): the recovery from a stream gap.",
    )
    run_minutes: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SYNC_RUN_MINUTES,
        description="How long this run keeps syncing; 0: one cycle. Default: the sync resource's sync_run_minutes for a "
        "sync job's run (books_sync: every streamed table), one cycle for any other (Materialize in the UI, a bootstrap).",
    )
    merge_interval_seconds: float | None = Field(
        default=None,
        ge=MIN_MERGE_INTERVAL_SECONDS,
        le=MAX_MERGE_INTERVAL_SECONDS,
        description="Seconds from one cycle's start to the next. Default: the sync resource's merge_interval_seconds.",
    )


def stream_syncer(
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    table: TableDeclaration,
    log: Callable[[str], None],
    warn: Callable[[str], None],
    before_write: Callable[[], None],
    capture_seconds: float | None = None,
    writer: WriterBranch | None = None,
) -> StreamSync:
    """A table's sync cycle state, from the resources (its SparkSession is created by the first cycle that needs it)."""
    return StreamSync(
        aws.client("dynamodb"),
        aws.client("dynamodbstreams"),
        aws.client("s3"),
        lambda: spark.spark_session,
        spark.source_scheme,
        sync.dynamodb_table_of(table),
        sync.iceberg_table_of(table),
        sync.layout_of(table),
        log=log,
        warn=warn,
        capture_stream=sync.capture_of(table) == "run",
        before_write=before_write,
        capture_seconds=capture_seconds,
        writer=writer,
        # Spark reads the driver's local files only when its tasks run in this process.
        hold_changes=runs_in_this_process(spark.master),
        spec=table.spec,
    )


def sync_cadence(sync: SyncSettings, interval_seconds: float) -> SyncCadence:
    return SyncCadence(
        interval_seconds=interval_seconds,
        longest_interval_seconds=sync.longest_merge_interval_seconds,
        table_checks_every_cycles=sync.table_checks_every_cycles,
        tombstone_pruning_interval=timedelta(hours=sync.orphan_sweep_interval_hours),
    )


@dataclass
class StreamedUpkeep:
    """A streamed table's upkeep in a SyncRun, with the sync resource's settings; `before_write` guards each writer.
    Compaction rewrites files on `main` (it never changes a row); the writer's branch then follows it."""

    spark: IcebergSparkResource
    sync: SyncSettings
    table: TableDeclaration
    before_write: Callable[[], None] = lambda: None
    writer: WriterBranch | None = None
    # By table, its data files after this run's last compaction of it (files left near their target are no surplus).
    settled: dict[str, int] = field(default_factory=dict)
    # By table, how fast this run's last compaction that rewrote deleted rows went: what sizes the next slice.
    rewrite_bytes_per_second: dict[str, float] = field(default_factory=dict)

    @property
    def _target(self) -> str:
        return self.sync.iceberg_table_of(self.table)

    def state(self) -> MaintenanceState:
        return maintenance_state(self.spark.spark_session, self._target)

    def prune_tombstones(self, now: datetime) -> int:
        tombstones, spark = tombstone_table(self._target), self.spark.spark_session
        if not table_totals(spark, tombstones).records:
            return 0  # none (its summary says): nothing to read, nor to record, and the next run's look is as cheap
        self.before_write()
        pruned = prune_tombstones(spark, tombstones, now - timedelta(days=self.sync.tombstone_retention_days), self.writer)
        record_tombstones_pruned(spark, self._target, now)
        return pruned

    def compact(self, spare_seconds: float) -> dict[str, CompactionResult]:
        self.before_write()
        compacted, deadline = {}, time.monotonic() + spare_seconds
        for table in (self._target, tombstone_table(self._target)):
            threshold, started, pace = self.sync.compaction_file_threshold, time.monotonic(), self.rewrite_bytes_per_second.get(table)
            budget = int(max(0.0, deadline - started) * (pace or FIRST_REWRITE_BYTES_PER_SECOND))
            if pace is None:
                budget = min(budget, TARGET_FILE_BYTES)  # one file's worth until this run has timed its own slice
            result = compact_if_due(self.spark.spark_session, self.spark.catalog, table, threshold, self._check_fence, self.settled.get(table), budget)
            if result is not None:
                compacted[table] = result
                self.settled[table] = result.data_files_after
                if result.deleted_rows_bytes:
                    self.rewrite_bytes_per_second[table] = result.deleted_rows_bytes / max(time.monotonic() - started, 1e-3)
        if compacted and self.writer is not None:
            for table in self.writer.tables:
                self.writer.follow_main(table)
        return compacted

    def _check_fence(self) -> None:
        # Compaction commits to main itself: only while no newer holding fenced the table.
        if self.writer is not None:
            self.writer.check_fence()


def writer_branch_of(spark: IcebergSparkResource, sync: SyncSettings, token: str, epoch: int, table: TableDeclaration) -> WriterBranch:
    """The branch of a streamed table and its tombstones that a holding of the lease (its `token` and `epoch`) writes
    (created by its first merge)."""
    target = sync.iceberg_table_of(table)
    return WriterBranch(lambda: spark.spark_session, spark.catalog, (target, tombstone_table(target)), token, epoch, carried=(STREAM_POSITIONS_PROPERTY,))


def maintenance_observation(result: MaintenanceResult, assets: StreamedAssets) -> AssetObservation:
    """What maintenance did, shown on the table's asset page beside the materializations."""
    return AssetObservation(asset_key=assets.iceberg.key, metadata={f"maintenance_{k}": v for k, v in result.metadata().items()})


def evaluation(result: AssetCheckResult, check_name: str, assets: StreamedAssets) -> AssetCheckEvaluation:
    """A check's result as an event of the running sync (a check runs in many cycles of one run)."""
    return AssetCheckEvaluation(
        asset_key=assets.iceberg.key,
        check_name=check_name,
        passed=result.passed,
        metadata=result.metadata,
        severity=result.severity,
        description=result.description,
    )


class RunClock:
    """The time a sync run goes by: `clock()` (monotonic seconds) paces its cycles and each table's interval,
    `clock.sleep(seconds)` waits for its next cycle."""

    def __call__(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


# The clock of every sync run (the sync job's, Materialize's, a bootstrap's), read as it starts: a test puts in one that
# skips the waits.
RUN_CLOCK = RunClock()


class RunProgress:
    """Steps of a run's work on any of its tables. Each table's lease watches them (with Spark's tasks) for progress:
    a bootstrap scanning one table for an hour keeps every lease of the run alive, and a run that hangs lets them all
    lapse."""

    def __init__(self, spark: IcebergSparkResource):
        self._spark, self.steps = spark, 0

    def step(self) -> None:
        self.steps += 1

    def seen(self) -> tuple:
        return self.steps, self._spark.tasks_in_progress()


class TableInRun:
    """One streamed table in a sync run: its lease, writer branch, cycle state and asset events."""

    def __init__(
        self, context, assets: StreamedAssets, aws, spark, sync: SyncSettings, leases: WriterLeases, run_interval: float, progress: RunProgress, clock: RunClock
    ):
        self.context, self.assets, self.table = context, assets, assets.table
        self._aws, self._spark, self._sync, self._leases, self._progress, self._clock = aws, spark, sync, leases, progress, clock
        # Its own interval where its declaration sets one, else the run's.
        self.interval = self.table.merge_interval_seconds or run_interval
        self.target = sync.iceberg_table_of(self.table)
        self.run: SyncRun | None = None
        self._writer: WriterBranch | None = None
        # Set by the run, which knows every table's interval (table_cadences).
        self.cadence: TableCadence | None = None

    def due(self, at_once: bool = False) -> bool:
        """Whether the table's cadence has its next cycle due; every cycle `at_once` (a run riding out ECS's stop: its
        last commits as late as they can be)."""
        return self.cadence.due(self._clock(), at_once)

    @property
    def held(self) -> bool:
        return self.run is not None

    def take(self, wait_seconds: float | None = None) -> None:
        """Takes the table's lease (waiting up to `wait_seconds`; LeaseHeldError if another writer keeps it), then its
        writer branch: from here on this run writes the table."""
        lease = self._leases.hold(self.context, self._aws.client("s3"), self._sync.bucket, self.target, progress=self._progress.seen, wait_seconds=wait_seconds)

        def before_write() -> None:
            self._progress.step()
            lease.check()

        self._writer = writer_branch_of(self._spark, self._sync, lease.token, lease.epoch, self.table)
        # A capture reads the stream for at most one interval: behind, the table still moves every cycle.
        syncer = stream_syncer(
            self._aws,
            self._spark,
            self._sync,
            self.table,
            log=self.context.log.info,
            warn=self.context.log.warning,
            before_write=before_write,
            capture_seconds=self.interval,
            writer=self._writer,
        )
        self.run = SyncRun(
            syncer,
            sync_cadence(self._sync, self.interval),
            checks=lambda *when: cycle_check_results(self._aws, self._sync, self.table, *when),
            upkeep=StreamedUpkeep(self._spark, self._sync, self.table, before_write=before_write, writer=self._writer),
            clock=self._clock,
        )

    def give_up(self, reason: str) -> None:
        """Stops writing the table (its branch dropped, its lease released): another writer takes it, or this run later."""
        self.context.log.info(f"Giving {self.target} up: {reason}")
        run, self.run = self.run, None
        try:
            if run is not None:
                run.close()
            if self._writer is not None:
                self._writer.drop()
        finally:
            self._writer = None
            self._leases.release(self.target)

    def cycle(self, number: int, bootstrap: bool, run_cycle_started: float) -> bool:
        """One cycle of the table in the run's cycle that started at `run_cycle_started` (its cadence counts from there:
        a table that waited for another's cycle is not a cycle late), its events logged; whether it found work."""
        report, started = None, self._clock()
        try:
            report = self.run.cycle(f"{self.context.run.run_id}-{number}", bootstrap=bootstrap)
        finally:
            self.cadence.cycled(run_cycle_started, report, self._clock() - started)
        for message in report.messages:
            self.context.log.info(message)
        if report.recorded:
            # How often cycles come: the interval, or more when cycles overrun it or a quiet table backs off.
            pacing = {"seconds_since_previous_cycle": report.seconds_since_previous_cycle, "cycle": number}
            self.context.log_event(AssetMaterialization(asset_key=self.assets.source.key, metadata={**report.outcome.source, "cycle": number}))
            self.context.log_event(AssetMaterialization(asset_key=self.assets.iceberg.key, metadata={**report.outcome.merged, **pacing}))
            for name, result in report.checks.items():
                self.context.log_event(evaluation(result, name, self.assets))
        return not report.outcome.idle


def sync_cycles(
    context,
    config: SyncConfig,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    leases: WriterLeases,
    tables: list[StreamedAssets],
    run_seconds: float,
    end_reason: Callable[[], str | None],
    lease_wait_seconds: float | None = None,
    gives_way: bool = True,
    stop: StopRequest | None = None,
    clock: RunClock | None = None,
) -> None:
    """Takes the leases of `tables`, then cycles every interval for up to `run_seconds` (0: one cycle) by `clock`
    (default RUN_CLOCK), each cycle merging every table it holds, logging their materializations and checks; ends after
    a cycle for which `end_reason()` gave a reason, or a stop signal (`stop` says which signals the run rides out).

    With `gives_way` (the sync, which is in no pool), a table another writer waits for (its pool) is given up after its
    cycle and taken again once that writer is done; a run of the table's pool (Materialize, a bootstrap) is ahead of
    the writers queued behind it, and ends by its `end_reason`. A table whose cycle fails, or whose lease was lost, is
    logged and tried again at the next cycle while the others go on. Alone in the run, such a failure fails the run, as
    it always did (Materialize, a bootstrap, a one-table sync: the schedule starts the next)."""
    run_interval = sync.merge_interval_seconds if config.merge_interval_seconds is None else config.merge_interval_seconds
    progress, clock = RunProgress(spark), clock or RUN_CLOCK
    in_run = [TableInRun(context, assets, aws, spark, sync, leases, run_interval, progress, clock) for assets in tables]
    # The run cycles at its tables' shortest interval; each table merges at its own cadence.
    for table, cadence in zip(in_run, table_cadences([table.interval for table in in_run], sync.merge_buffer_changes), strict=True):
        table.cadence = cadence
    interval = in_run[0].cadence.run_interval
    alone = len(in_run) == 1
    waiting = waiting_writers(context.instance, other_than=context.run.run_id) if gives_way else {}
    for table in in_run:
        if table.table.writer_pool in waiting:
            writer = waiting[table.table.writer_pool]
            context.log.info(f"Not syncing {table.target} for now: run {writer.run_id} ({writer.job_name}) writes it")
            continue
        try:
            table.take(lease_wait_seconds)
        except LeaseHeldError as error:
            if alone:
                raise
            context.log.warning(f"{error}; the other tables sync meanwhile, and this run takes it as soon as it is free")
    if not any(table.held for table in in_run):
        context.log.info("Not syncing: every table has another writer; the schedule starts the sync after them")
        return
    stop = stop or StopRequest()

    def cycle(number: int) -> bool:
        reason = None if stop.requested else end_reason()
        if reason is not None:
            context.log.info(f"Ending the sync of {', '.join(table.target for table in in_run)} after this cycle: {reason}")
            stop.end_after_cycle()
        waiting = waiting_writers(context.instance, other_than=context.run.run_id) if gives_way else {}
        # A table another writer waits for is not taken again; one held is given up after its cycle.
        started = clock()
        due = [table for table in in_run if (table.table.writer_pool not in waiting or table.held) and table.due(at_once=stop.riding_out)]
        # Threads once the session exists (the first cycle creates it in the main thread).
        threads = side_by_side if spark.session_started else None
        in_thread = spark.activate_in_this_thread if threads else lambda: None
        cycle_one = functools.partial(cycle_table, number=number, started=started, in_thread=in_thread)
        found_work = cycle_in_turns(due, lambda table: table.cadence, cycle_one, started, clock, threads, at_once=stop.riding_out)
        busy = any(found_work)
        for table in in_run:
            writer = waiting.get(table.table.writer_pool)
            if writer is not None and table.held:
                table.give_up(f"run {writer.run_id} ({writer.job_name}) waits to write it")
        if waiting and all(table.table.writer_pool in waiting for table in in_run):
            context.log.info(f"Ending the sync after this cycle: every table it syncs has another writer ({', '.join(sorted(waiting))})")
            stop.end_after_cycle()
        return busy

    def cycle_table(table: TableInRun, number: int, started: float, in_thread: Callable[[], None]) -> bool:
        try:
            in_thread()
            if not table.held:
                table.take(wait_seconds=0)
            return table.cycle(number, config.bootstrap and number == 1, started)
        except LeaseHeldError:
            return False
        except MainMovedError as error:
            # Still this run's table: the cycle's changes are merged again by the next one (they stayed staged).
            context.log.warning(str(error))
            return False
        except (LeaseLostError, WriterFencedError) as error:
            if alone:
                raise
            context.log.warning(f"{table.target}: {error}; the other tables go on, and this run takes it again when it is free")
            table.give_up("its lease was lost")
            return False
        except Exception as error:
            if alone:
                raise
            # A bad batch, a failed request, a bootstrap that failed: this table's next cycle reads it again.
            context.log.error(f"{table.target}: its cycle failed ({type(error).__name__}: {error}); the other tables go on, this one tries again")
            return False

    # The tables of the first turn run side by side, each in a thread of its own, in the one SparkSession (created first,
    # in the main thread: PySpark sets signal handlers as it starts): their waits on S3 and the catalog overlap, their
    # CPU still shares the task's (docs/performance-log.md, 3 December). The turn ends when the last of them is done.
    side_by_side = ThreadPoolExecutor(max_workers=len(in_run), thread_name_prefix="table-cycle")
    try:
        cycles = run_cycles(cycle, interval, run_seconds, stop=stop, clock=clock, sleep=clock.sleep, idle_interval_seconds=sync.longest_merge_interval_seconds)
    finally:
        side_by_side.shutdown(wait=True)
        for table in in_run:
            if table.held:
                table.give_up("the run ends")
    context.log.info(f"Sync run done after {cycles} cycles (one every {interval:g} s or more)")


def sync_table_asset(assets: StreamedAssets):
    """Materialize (one cycle of this table), the bootstrap's job, a backfill: a run in the table's writers' pool."""
    table = assets.table

    @multi_asset(
        name=f"sync_{table.name}",
        specs=[assets.source, assets.iceberg],
        pool=table.writer_pool,
        description=f"Captures the {table.name} stream and MERGEs it into <namespace>.{table.iceberg_table}: one cycle "
        "(Materialize, the bootstrap), or every merge_interval_seconds for run_minutes. The long-lived sync of every "
        "streamed table is the sync job (books_sync).",
    )
    def sync_table(
        context: AssetExecutionContext,
        config: SyncConfig,
        aws: AwsClientsResource,
        spark: IcebergSparkResource,
        sync: SyncSettings,
        leases: WriterLeases,
    ):
        # Unless the table's writers queue one run at a time, two of them start at once and the second waits for the lease.
        warn_unless_writers_queue(context, table.writer_pool)
        run_minutes = config.run_minutes or 0.0

        def end_reason() -> str | None:
            writer = waiting_writers(context.instance, other_than=context.run.run_id).get(table.writer_pool)
            return None if writer is None else f"run {writer.run_id} ({writer.job_name}) waits to write"

        sync_cycles(context, config, aws, spark, sync, leases, [assets], run_minutes * 60, end_reason, gives_way=False)
        yield from ()

    return sync_table


SYNC_ASSETS = {name: sync_table_asset(assets) for name, assets in STREAMED.items()}
