"""The books jobs: the long-lived sync, the bootstrap (recovery from a stream gap), the daily key parity check and
maintenance on demand. Every writer but the sync is in BOOKS_WRITER_POOL, which dagster.yaml limits to one run at a
time; sync runs hand the table over to each other and give way to those (streamed/handover.py)."""

import time

from dagster import AssetSelection, OpExecutionContext, define_asset_job, job, op

from ddb_athena.lake.change_merge import warm_up
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases
from ddb_athena.lib.upkeep import maintain
from ddb_athena.lib.writer_lease import BOOKS_WRITER_POOL
from ddb_athena.lib.writer_pools import warn_unless_writers_queue
from ddb_athena.streamed.assets import BooksSyncConfig, books_writer_branch, maintenance_observation, sync_books, sync_books_cycles
from ddb_athena.streamed.checks import books_row_count_parity
from ddb_athena.streamed.handover import HANDOVER_GRACE_SECONDS, SYNC_JOB_NAME, SYNC_RUN_SLACK_MINUTES, SyncHandover, planned_end, waiting_writer

BOOTSTRAP_JOB_NAME = "books_bootstrap"


@op(
    description="Captures the books stream and MERGEs it into library.books every merge_interval_seconds for run_minutes "
    "(the sync resource's sync_run_minutes), then hands over to the next sync run. Records materializations of books_source "
    "and books_iceberg and evaluates their checks in its cycles.",
)
def keep_books_in_sync(
    context: OpExecutionContext,
    config: BooksSyncConfig,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
    leases: WriterLeases,
) -> None:
    table = sync.books_iceberg_table
    waiting = waiting_writer(context.instance)
    if waiting is not None:
        context.log.info(f"Not syncing {table}: run {waiting.run_id} ({waiting.job_name}) writes it; the schedule starts the sync after it")
        return
    handover = SyncHandover(context.instance, context.run)
    # Everything that takes time before the first cycle happens while the previous sync run still cycles.
    warm_up(spark.spark_session, table)
    handover.announce_ready()
    context.log.info(f"Ready to sync {table}; taking the writer lease as soon as the running sync, if any, gives it up")
    run_minutes = sync.sync_run_minutes if config.run_minutes is None else config.run_minutes
    ends_at = planned_end(context.instance.get_run_record_by_id(context.run_id), run_minutes)
    sync_books_cycles(
        context,
        config,
        aws,
        spark,
        sync,
        leases,
        run_seconds=max(0.0, ends_at - time.time()) + HANDOVER_GRACE_SECONDS,
        end_reason=lambda: handover.end_reason(time_is_up=time.time() >= ends_at),
        # The running sync gives the lease up after its cycle; a hung one is ended by run monitoring within its slack.
        lease_wait_seconds=SYNC_RUN_SLACK_MINUTES * 60 + 2 * leases.ttl_seconds,
    )


@job(name=SYNC_JOB_NAME, description="The long-lived books sync: capture the stream and MERGE it into library.books every few seconds.")
def books_sync_job():
    keep_books_in_sync()


# The recovery from a stream gap, queued like any books writer (its priority puts it ahead of the others). The running
# sync gives way to it after its cycle, and the schedule starts none beside it (streamed/handover.py, waiting_writer).
books_bootstrap = define_asset_job(
    BOOTSTRAP_JOB_NAME,
    selection=AssetSelection.assets(sync_books).without_checks(),
    config={"ops": {"sync_books": {"config": {"bootstrap": True, "run_minutes": 0}}}},
    tags={"dagster/priority": "10"},
    description="Rebuilds library.books from a scan of the DynamoDB table and the stream after it: the recovery from a stream "
    "gap. The running sync ends after its cycle; the schedule resumes it after the bootstrap.",
)

# The one check that reads the user's DynamoDB table (a paced key scan): a run of its own, once a day by its schedule.
books_key_parity = define_asset_job(
    "books_key_parity",
    selection=AssetSelection.checks(books_row_count_parity),
    description="Compares the keys of library.books with the DynamoDB table's (a scan paced to a share of its read capacity).",
)


@op(
    description="Compacts library.books, expires old snapshots, removes orphan files and prunes old tombstones.",
    pool=BOOKS_WRITER_POOL,
)
def maintain_books_table(context: OpExecutionContext, spark: IcebergSparkResource, sync: SyncSettings, aws: AwsClientsResource, leases: WriterLeases) -> None:
    warn_unless_writers_queue(context, BOOKS_WRITER_POOL)
    lease = leases.hold(context, aws.client("s3"), sync.bucket, sync.books_iceberg_table, progress=spark.tasks_in_progress)
    # Fenced first: a sync that lost its lease to this job publishes nothing after it.
    writer = books_writer_branch(spark, sync, lease.token)
    writer.take_all()
    try:
        context.log_event(maintenance_observation(maintain(spark, sync, sync.books_iceberg_table, with_tombstones=True, writer=writer)))
    finally:
        writer.drop()


# The sync run maintains the table itself every maintenance_interval_minutes; this job is for a table whose
# sync is stopped. In the books writers' pool, it waits for a running sync instead of competing with it.
@job(description="Iceberg maintenance of library.books, on demand.")
def books_maintenance():
    maintain_books_table()
