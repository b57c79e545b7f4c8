"""The books jobs: the long-lived sync, the bootstrap (recovery from a stream gap), the daily key parity check and
maintenance on demand. Each writer is in BOOKS_WRITER_POOL, which dagster.yaml limits to one run at a time."""

from dagster import AssetSelection, OpExecutionContext, define_asset_job, job, op

from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases
from ddb_athena.lib.upkeep import maintain
from ddb_athena.lib.writer_lease import BOOKS_WRITER_POOL
from ddb_athena.lib.writer_pools import warn_unless_writers_queue
from ddb_athena.streamed.assets import SYNC_JOB_NAME, books_writer_branch, maintenance_observation, sync_books
from ddb_athena.streamed.checks import books_row_count_parity

BOOTSTRAP_JOB_NAME = "books_bootstrap"

books_sync_job = define_asset_job(
    SYNC_JOB_NAME,
    # The run evaluates the books checks in its cycles; their stand-alone steps stay out of it.
    selection=AssetSelection.assets(sync_books).without_checks(),
    description="The long-lived books sync: capture the stream and MERGE it into library.books every few seconds.",
)

# The recovery from a stream gap, queued like any books writer. Its priority puts it ahead of a sync successor waiting
# in the same pool, and the running sync gives way to it after its cycle (streamed/assets.py, waiting_writer).
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
