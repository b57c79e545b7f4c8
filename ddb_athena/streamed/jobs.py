"""The streamed tables' jobs: the long-lived sync of every streamed table (books_sync), and per table the bootstrap
(recovery from a stream gap), the daily key parity check and maintenance on demand; the upkeep of every streamed table
beside the sync (expiry, orphans: streamed_upkeep). Every writer but the sync is in its table's writers' pool (`<name>_writer`), which dagster.yaml limits to
one run at a time; sync runs hand the tables over to each other and give a table up to those (streamed/handover.py).
The upkeep runs write no row and move no branch: each table's op is in a pool of its own (`<name>_upkeep`), and the sync keeps
its table while they run."""

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dagster import AssetSelection, JobDefinition, OpDefinition, OpExecutionContext, define_asset_job, in_process_executor, job, op
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from ddb_athena.lake.change_merge import table_exists, warm_up
from ddb_athena.lake.maintenance import maintenance_state
from ddb_athena.lake.writer_branch import retried_when_main_moved
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases
from ddb_athena.lib.upkeep import maintain, trim
from ddb_athena.lib.writer_pools import warn_unless_writers_queue
from ddb_athena.streamed import assets as streamed_assets
from ddb_athena.streamed.assets import (
    STREAMED,
    SYNC_ASSETS,
    StreamedAssets,
    SyncConfig,
    evaluation,
    maintenance_observation,
    sync_cycles,
    writer_branch_of,
)
from ddb_athena.streamed.check_results import files_compact_result
from ddb_athena.streamed.checks import CHECKS
from ddb_athena.streamed.handover import (
    EXIT_SECONDS,
    HANDOVER_GRACE_SECONDS,
    STOP_TIMEOUT_SECONDS,
    SYNC_JOB_NAME,
    SYNC_RUN_SLACK_MINUTES,
    SyncHandover,
    planned_end,
)
from ddb_athena.streamed.run_loop import StopRequest


@op(
    description="Captures every streamed table's stream and MERGEs it into its Iceberg table every merge_interval_seconds "
    "for run_minutes (the sync resource's sync_run_minutes), then hands over to the next sync run. Records the tables' "
    "materializations and evaluates their checks in its cycles.",
)
def keep_books_in_sync(
    context: OpExecutionContext,
    config: SyncConfig,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    leases: WriterLeases,
) -> None:
    tables = list(STREAMED.values())
    handover = SyncHandover(context.instance, context.run)
    # Everything that takes time before the first cycle happens while the previous sync run still cycles.
    for assets in tables:
        warm_up(spark.spark_session, sync.iceberg_table_of(assets.table))
    handover.announce_ready()
    context.log.info(
        f"Ready to sync {', '.join(sync.iceberg_table_of(assets.table) for assets in tables)}; taking the writer leases as soon as the "
        "running sync, if any, gives them up"
    )
    run_minutes = sync.sync_run_minutes if config.run_minutes is None else config.run_minutes
    ends_at = planned_end(context.instance.get_run_record_by_id(context.run_id), run_minutes)
    # The planned end (a wall time: from the run record's start) on the run's clock, which paces its cycles.
    clock = streamed_assets.RUN_CLOCK
    started, until_planned_end = clock(), max(0.0, ends_at - time.time())

    def rides_out(number: int) -> bool:
        if not handover.rides_out(number):
            return False
        context.log.warning(
            "SIGTERM with no Terminate: ECS is stopping this run's task (a Spot interruption, or the task replaced). It syncs on "
            f"while its successor, launched now, starts, and ends when that one is ready or {EXIT_SECONDS} s before the kill"
        )
        return True

    sync_cycles(
        context,
        config,
        aws,
        spark,
        sync,
        leases,
        tables,
        run_seconds=until_planned_end + HANDOVER_GRACE_SECONDS,
        end_reason=lambda: handover.end_reason(time_is_up=clock() - started >= until_planned_end),
        # The running sync gives the leases up after its cycle; a hung one is ended by run monitoring within its slack.
        lease_wait_seconds=SYNC_RUN_SLACK_MINUTES * 60 + 2 * leases.ttl_seconds,
        stop=StopRequest(rides_out, grace_seconds=STOP_TIMEOUT_SECONDS - EXIT_SECONDS),
        clock=clock,
    )


@job(name=SYNC_JOB_NAME, description="The long-lived sync of every streamed table: capture each stream and MERGE it into Iceberg every few seconds.")
def sync_job():
    keep_books_in_sync()


@dataclass(frozen=True)
class StreamedJobs:
    bootstrap: UnresolvedAssetJobDefinition
    key_parity: UnresolvedAssetJobDefinition
    maintenance: JobDefinition


def streamed_jobs(assets: StreamedAssets) -> StreamedJobs:
    table = assets.table
    sync_asset = SYNC_ASSETS[table.name]
    # The recovery from a stream gap, queued like any writer of the table (its priority puts it ahead of the others).
    # The running sync gives the table up after its cycle and takes it back after the bootstrap.
    bootstrap = define_asset_job(
        f"{table.name}_bootstrap",
        selection=AssetSelection.assets(sync_asset).without_checks(),
        config={"ops": {sync_asset.op.name: {"config": {"bootstrap": True, "run_minutes": 0}}}},
        tags={"dagster/priority": "10"},
        description=f"Rebuilds <namespace>.{table.iceberg_table} from a scan of the DynamoDB table and the stream after it: the "
        "recovery from a stream gap. The running sync gives the table up after its cycle and takes it back after.",
    )
    # The checks that read a whole table, the user's DynamoDB table (a paced key scan) and the Iceberg table (every key
    # once): a run of their own, once a day by its schedule, never in the sync's cycles (a cycle would wait for them).
    key_parity = define_asset_job(
        f"{table.name}_key_parity",
        selection=AssetSelection.checks(CHECKS[table.name].parity, CHECKS[table.name].unique_key),
        description=f"Compares the keys of <namespace>.{table.iceberg_table} with the DynamoDB table's (a scan paced to a share "
        "of its read capacity), and checks that no key appears twice in it.",
    )

    @op(
        name=f"maintain_{table.name}_table",
        description=f"Compacts <namespace>.{table.iceberg_table}, expires old snapshots, removes orphan files and prunes old tombstones.",
        pool=table.writer_pool,
    )
    def maintain_table(context: OpExecutionContext, spark: IcebergSparkResource, sync: SyncSettings, aws: AwsClientsResource, leases: WriterLeases) -> None:
        warn_unless_writers_queue(context, table.writer_pool)
        target = sync.iceberg_table_of(table)
        lease = leases.hold(context, aws.client("s3"), sync.bucket, target, progress=spark.tasks_in_progress)
        # Fenced first: a sync that lost its lease to this job publishes nothing after it.
        writer = writer_branch_of(spark, sync, lease.token, lease.epoch, table)
        writer.take_all()
        try:
            result = retried_when_main_moved(lambda: maintain(spark, sync, table, writer=writer), warn=context.log.warning)
            context.log_event(maintenance_observation(result, assets))
        finally:
            writer.drop()

    # The whole pass (compaction and tombstone pruning too, which need the writer's fence), for a table whose sync is
    # stopped. In the table's writers' pool, it waits for a running writer instead of competing with it.
    @job(name=f"{table.name}_maintenance", description=f"Iceberg maintenance of <namespace>.{table.iceberg_table}, on demand.")
    def maintenance():
        maintain_table()

    return StreamedJobs(bootstrap, key_parity, maintenance)


JOBS = {name: streamed_jobs(assets) for name, assets in STREAMED.items()}


def trim_history_op(assets: StreamedAssets) -> OpDefinition:
    table = assets.table

    @op(
        name=f"trim_{table.name}_history",
        description=f"Expires the snapshots of <namespace>.{table.iceberg_table} and its tombstones past their retention and, "
        "once orphan_sweep_interval_hours has gone by, removes their orphan files. Neither changes a row or moves main: it "
        "runs beside the sync, which keeps the table.",
        pool=table.upkeep_pool,
    )
    def trim_table_history(context: OpExecutionContext, spark: IcebergSparkResource, sync: SyncSettings) -> None:
        target = sync.iceberg_table_of(table)
        if not table_exists(spark.spark_session, target):
            context.log.info(f"{target} does not exist yet (its first sync creates it): nothing to expire")
            return
        now = datetime.now(UTC)
        sweep = maintenance_state(spark.spark_session, target).orphan_sweep_due(timedelta(hours=sync.orphan_sweep_interval_hours), now)
        result = trim(spark, sync, table, now, remove_orphans=sweep)
        swept = f", removed {result.orphan_files_removed} orphan files" if sweep else " (no orphan sweep due)"
        context.log.info(f"Expired {result.expired_snapshots} snapshots of {target}{swept}")
        context.log_event(maintenance_observation(result, assets))
        context.log_event(evaluation(files_compact_result(result.after), f"{table.name}_files_compact", assets))

    return trim_table_history


UPKEEP_JOB_NAME = "streamed_upkeep"
_TRIM_OPS = [trim_history_op(assets) for assets in STREAMED.values()]


# Launched every maintenance_interval_minutes by the upkeep_when_due sensor (streamed/schedules.py). One run, one process
# (in_process: one SparkSession) for every streamed table: on ECS one short task per interval, not one per table.
@job(
    name=UPKEEP_JOB_NAME,
    executor_def=in_process_executor,
    description="Snapshot expiry and the orphan sweep of every streamed table, one after the other, beside the sync.",
)
def upkeep_job():
    for trim_table_history in _TRIM_OPS:
        trim_table_history()
