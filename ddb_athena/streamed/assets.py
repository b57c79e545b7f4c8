"""Books assets: the stream captured as change files (books_source) and MERGEd into Iceberg (books_iceberg), by one
long-lived sync run that keeps its SparkSession warm and cycles every few seconds.

Every cycle that does something is recorded as a materialization of both assets (idle cycles once a minute,
so freshness holds and the event log stays small), with the books_iceberg checks evaluated beside it:
backlog and quarantine every time, the checks that read the table or DynamoDB every few cycles.
"""

from collections.abc import Callable
from dataclasses import dataclass
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
from ddb_athena.lake.maintenance import CompactionResult, MaintenanceResult, MaintenanceState, compact_if_due, maintenance_state
from ddb_athena.lake.session_config import runs_in_this_process
from ddb_athena.lake.writer_branch import WriterBranch
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases
from ddb_athena.lib.settings import MAX_MERGE_INTERVAL_SECONDS, MAX_SYNC_RUN_MINUTES, MIN_MERGE_INTERVAL_SECONDS
from ddb_athena.lib.upkeep import maintain
from ddb_athena.lib.writer_lease import BOOKS_WRITER_POOL
from ddb_athena.lib.writer_pools import warn_unless_writers_queue
from ddb_athena.streamed.check_results import cycle_check_results, files_compact_result
from ddb_athena.streamed.cycle import BooksSync
from ddb_athena.streamed.handover import waiting_writer
from ddb_athena.streamed.run_loop import StopRequest, run_cycles
from ddb_athena.streamed.sync_run import SyncCadence, SyncRun

# The specs are skippable: each cycle's materializations are logged as events, no output is returned.
books_source = AssetSpec(
    "books_source",
    group_name="books",
    kinds={"dynamodb", "s3"},
    description="DynamoDB stream changes of the books table, captured as change files under s3://<bucket>/books_source/.",
    skippable=True,
)
books_iceberg = AssetSpec(
    "books_iceberg",
    deps=[books_source],
    group_name="books",
    kinds={"spark", "iceberg"},
    description="library.books: the books table in Iceberg, kept in sync by a MERGE INTO every few seconds.",
    skippable=True,
)


class BooksSyncConfig(Config):
    bootstrap: bool = Field(
        default=False,
        description="Scan the whole table and replay the stream after it (first cycle): the recovery from a stream gap.",
    )
    run_minutes: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SYNC_RUN_MINUTES,
        description="How long this run keeps syncing; 0: one cycle. Default: the sync resource's sync_run_minutes for a "
        "books_sync run, one cycle for any other (Materialize in the UI, a bootstrap).",
    )
    merge_interval_seconds: float | None = Field(
        default=None,
        ge=MIN_MERGE_INTERVAL_SECONDS,
        le=MAX_MERGE_INTERVAL_SECONDS,
        description="Seconds from one cycle's start to the next. Default: the sync resource's merge_interval_seconds.",
    )


def books_syncer(
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    log: Callable[[str], None],
    warn: Callable[[str], None],
    before_write: Callable[[], None],
    capture_seconds: float | None = None,
    writer: WriterBranch | None = None,
) -> BooksSync:
    """The sync cycle's state, from the resources (its SparkSession is created by the first cycle that needs it)."""
    return BooksSync(
        aws.client("dynamodb"),
        aws.client("dynamodbstreams"),
        aws.client("s3"),
        lambda: spark.spark_session,
        spark.source_scheme,
        sync.books_table,
        sync.books_iceberg_table,
        sync.books_layout,
        log=log,
        warn=warn,
        capture_stream=sync.books_capture == "run",
        before_write=before_write,
        capture_seconds=capture_seconds,
        writer=writer,
        # Spark reads the driver's local files only when its tasks run in this process.
        hold_changes=runs_in_this_process(spark.master),
        spec=declared("books").spec,
    )


def sync_cadence(sync: SyncSettings, interval_seconds: float) -> SyncCadence:
    return SyncCadence(
        interval_seconds=interval_seconds,
        longest_interval_seconds=sync.longest_merge_interval_seconds,
        table_checks_every_cycles=sync.table_checks_every_cycles,
        maintenance_interval=timedelta(minutes=sync.maintenance_interval_minutes),
        orphan_sweep_interval=timedelta(hours=sync.orphan_sweep_interval_hours),
    )


@dataclass
class BooksUpkeep:
    """library.books' upkeep for a SyncRun, with the sync resource's settings; `before_write` guards each writer. Upkeep
    rewrites files on `main` (compaction never changes a row); the writer's branch then follows it."""

    spark: IcebergSparkResource
    sync: SyncSettings
    before_write: Callable[[], None] = lambda: None
    writer: WriterBranch | None = None

    def state(self) -> MaintenanceState:
        return maintenance_state(self.spark.spark_session, self.sync.books_iceberg_table)

    def maintain(self, now: datetime, remove_orphans: bool) -> MaintenanceResult:
        self.before_write()
        table = self.sync.books_iceberg_table
        result = maintain(self.spark, self.sync, table, with_tombstones=True, now=now, remove_orphans=remove_orphans, writer=self.writer)
        self._follow_main()
        return result

    def compact(self) -> CompactionResult | None:
        self.before_write()
        result = compact_if_due(self.spark.spark_session, self.spark.catalog, self.sync.books_iceberg_table, self.sync.compaction_file_threshold)
        if result is not None:
            self._follow_main()
        return result

    def _follow_main(self) -> None:
        if self.writer is not None:
            for table in self.writer.tables:
                self.writer.follow_main(table)


def books_writer_branch(spark: IcebergSparkResource, sync: SyncSettings, token: str) -> WriterBranch:
    """The branch of library.books and its tombstones that a holding of the lease (its `token`) writes (created by its
    first merge)."""
    target = sync.books_iceberg_table
    return WriterBranch(lambda: spark.spark_session, spark.catalog, (target, tombstone_table(target)), token, carried=(STREAM_POSITIONS_PROPERTY,))


def maintenance_observation(result: MaintenanceResult) -> AssetObservation:
    """What maintenance did, shown on the books_iceberg asset page beside the materializations."""
    return AssetObservation(asset_key=books_iceberg.key, metadata={f"maintenance_{k}": v for k, v in result.metadata().items()})


def evaluation(result: AssetCheckResult, check_name: str) -> AssetCheckEvaluation:
    """A check's result as an event of the running sync (a check runs in many cycles of one run)."""
    return AssetCheckEvaluation(
        asset_key=books_iceberg.key,
        check_name=check_name,
        passed=result.passed,
        metadata=result.metadata,
        severity=result.severity,
        description=result.description,
    )


def sync_books_cycles(
    context,
    config: BooksSyncConfig,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    leases: WriterLeases,
    run_seconds: float,
    end_reason: Callable[[], str | None],
    lease_wait_seconds: float | None = None,
) -> None:
    """Takes the lease of library.books, then cycles every interval for up to `run_seconds` (0: one cycle), logging each
    cycle's materializations and checks; ends after a cycle for which `end_reason()` gave a reason."""
    interval = sync.merge_interval_seconds if config.merge_interval_seconds is None else config.merge_interval_seconds
    lease = leases.hold(context, aws.client("s3"), sync.bucket, sync.books_iceberg_table, progress=spark.tasks_in_progress, wait_seconds=lease_wait_seconds)
    writer = books_writer_branch(spark, sync, lease.token)
    # A capture reads the stream for at most one interval: behind, the table still moves every cycle.
    syncer = books_syncer(aws, spark, sync, log=context.log.info, warn=context.log.warning, before_write=lease.check, capture_seconds=interval, writer=writer)
    run = SyncRun(
        syncer,
        sync_cadence(sync, interval),
        checks=lambda *when: cycle_check_results(aws, spark, sync, *when),
        upkeep=BooksUpkeep(spark, sync, before_write=lease.check, writer=writer),
    )
    stop = StopRequest()

    def cycle(number: int) -> bool:
        reason = None if stop.requested else end_reason()
        if reason is not None:
            context.log.info(f"Ending the sync of {sync.books_iceberg_table} after this cycle: {reason}")
            stop.end_after_cycle()
        report = run.cycle(f"{context.run.run_id}-{number}", bootstrap=config.bootstrap and number == 1)
        for message in report.messages:
            context.log.info(message)
        if report.recorded:
            # How often cycles come: the interval, or more when cycles overrun it or a quiet table backs off.
            pacing = {"seconds_since_previous_cycle": report.seconds_since_previous_cycle, "cycle": number}
            context.log_event(AssetMaterialization(asset_key=books_source.key, metadata={**report.outcome.source, "cycle": number}))
            context.log_event(AssetMaterialization(asset_key=books_iceberg.key, metadata={**report.outcome.merged, **pacing}))
            for name, result in report.checks.items():
                context.log_event(evaluation(result, name))
        if report.maintenance is not None:
            context.log_event(maintenance_observation(report.maintenance))
            context.log_event(evaluation(files_compact_result(report.maintenance.after), "books_files_compact"))
        return not report.outcome.idle

    try:
        cycles = run_cycles(cycle, interval, run_seconds, stop=stop, idle_interval_seconds=sync.longest_merge_interval_seconds)
    finally:
        writer.drop()
    context.log.info(f"Sync run done after {cycles} cycles (one every {interval:g} s or more)")


@multi_asset(
    name="sync_books",
    specs=[books_source, books_iceberg],
    pool=BOOKS_WRITER_POOL,
    description="Captures the books stream and MERGEs it into library.books: one cycle (Materialize, the bootstrap), or "
    "every merge_interval_seconds for run_minutes. The long-lived sync is the books_sync job.",
)
def sync_books(
    context: AssetExecutionContext,
    config: BooksSyncConfig,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    leases: WriterLeases,
):
    # Unless the books writers queue one run at a time, two of them start at once and the second waits for the lease.
    warn_unless_writers_queue(context, BOOKS_WRITER_POOL)
    run_minutes = config.run_minutes or 0.0

    def end_reason() -> str | None:
        waiting = waiting_writer(context.instance, other_than=context.run.run_id)
        return None if waiting is None else f"run {waiting.run_id} ({waiting.job_name}) waits to write"

    sync_books_cycles(context, config, aws, spark, sync, leases, run_minutes * 60, end_reason)
    yield from ()
