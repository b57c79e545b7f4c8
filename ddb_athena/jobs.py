"""Jobs: the books sync, the daily orders export and load, the cleanup of consumed source files,
and table maintenance.

Every asset and op that writes a table is in that table's pool (BOOKS_WRITER_POOL, ORDERS_WRITER_POOL), which
dagster.yaml limits to one run at a time: whatever launches it (a schedule, Materialize, a backfill, a re-execution),
a writer queues behind the running one. The writer lease (ddb_athena/writer_lease.py) stops the writers the queue
does not see.
"""

from dagster import AssetSelection, Config, OpExecutionContext, define_asset_job, job, op
from pydantic import Field

from ddb_athena.assets.books import BOOKS_WRITER_POOL, SYNC_JOB_NAME, maintenance_observation, sync_books
from ddb_athena.assets.orders import ORDERS_WRITER_POOL, orders_athena, orders_export
from ddb_athena.assets.upkeep import maintain
from ddb_athena.capture.commit_manifests import delete_committed_files
from ddb_athena.checks.books import books_row_count_parity
from ddb_athena.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases

BOOTSTRAP_JOB_NAME = "books_bootstrap"
WRITER_POOLS = (BOOKS_WRITER_POOL, ORDERS_WRITER_POOL)
# One cleanup run per table at a time (dagster.yaml).
CLEANUP_TAG = "ddb_athena/cleanup"

books_sync_job = define_asset_job(
    SYNC_JOB_NAME,
    # The run evaluates the books checks in its cycles; their stand-alone steps stay out of it.
    selection=AssetSelection.assets(sync_books).without_checks(),
    description="The long-lived books sync: capture the stream and MERGE it into library.books every few seconds.",
)

# The recovery from a stream gap, queued like any books writer. Its priority puts it ahead of a sync successor waiting
# in the same pool, and the running sync gives way to it after its cycle (assets/books.py, waiting_writer).
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


orders_daily = define_asset_job(
    "orders_daily",
    selection=AssetSelection.assets(orders_export, orders_athena),
    description="Export one day of orders from DynamoDB and load it into library.orders.",
)


class CleanupConfig(Config):
    bucket: str = Field(description="bucket of the manifests")
    manifest_keys: list[str] = Field(description="commit manifests written by the materializations, oldest first")


def _delete_committed_source_files(context: OpExecutionContext, config: CleanupConfig, aws: AwsClientsResource) -> int:
    deleted = 0
    for manifest_key in config.manifest_keys:
        deleted += delete_committed_files(aws.client("s3"), config.bucket, manifest_key)
    context.log.info(f"Deleted {deleted} committed files listed in {len(config.manifest_keys)} manifests in s3://{config.bucket}/")
    return deleted


DELETE_DESCRIPTION = "Deletes exactly the source files that successful materializations consumed."
# Books change files are never read again once committed: their cleanup never waits for the hour-long sync.
delete_committed_change_files = op(name="delete_committed_change_files", description=DELETE_DESCRIPTION)(_delete_committed_source_files)
# A re-run of an orders partition re-uses its export's files: their cleanup waits in the orders writers' queue.
delete_loaded_export_files = op(name="delete_loaded_export_files", description=DELETE_DESCRIPTION, pool=ORDERS_WRITER_POOL)(
    _delete_committed_source_files
)


@job(description="Deletes the books change files that commits consumed (requested by the cleanup sensor).")
def books_source_cleanup():
    delete_committed_change_files()


@job(description="Deletes the orders export files that loads consumed, after their retention (requested by the cleanup sensor).")
def orders_export_cleanup():
    delete_loaded_export_files()


@op(
    description="Compacts library.books, expires old snapshots, removes orphan files and prunes old tombstones.",
    pool=BOOKS_WRITER_POOL,
)
def maintain_books_table(
    context: OpExecutionContext, spark: IcebergSparkResource, sync: SyncSettings, aws: AwsClientsResource, leases: WriterLeases
) -> None:
    leases.hold(context, aws.client("s3"), sync.bucket, sync.books_iceberg_table)
    context.log_event(maintenance_observation(maintain(spark, sync, sync.books_iceberg_table, with_tombstones=True)))


# The sync run maintains the table itself every maintenance_interval_minutes; this job is for a table whose
# sync is stopped. In the books writers' pool, it waits for a running sync instead of competing with it.
@job(description="Iceberg maintenance of library.books, on demand.")
def books_maintenance():
    maintain_books_table()
