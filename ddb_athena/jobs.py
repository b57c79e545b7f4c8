"""Jobs: the books sync, the daily orders export and load, the cleanup of consumed source files,
and table maintenance.

Every job that writes a table or its source carries that table's concurrency tag, which
dagster.yaml limits to one run at a time per table: runs queue behind each other, never overlap.
"""

from dagster import AssetSelection, Config, OpExecutionContext, define_asset_job, job, op
from pydantic import Field

from ddb_athena.assets.books import maintenance_observation, sync_books
from ddb_athena.assets.orders import orders_athena, orders_export
from ddb_athena.assets.upkeep import maintain
from ddb_athena.capture.commit_manifests import delete_committed_files
from ddb_athena.resources import AwsClientsResource, IcebergSparkResource, SyncSettings

BOOKS_CONCURRENCY_TAG = {"ddb_athena/writer": "books"}
ORDERS_CONCURRENCY_TAG = {"ddb_athena/writer": "orders"}
# Cleanup runs only delete files a commit has consumed: they need not wait for a writer, one per table at a time.
CLEANUP_TAG = "ddb_athena/cleanup"

books_sync_job = define_asset_job(
    "books_sync",
    # The run evaluates the books checks in its cycles; their stand-alone steps stay out of it.
    selection=AssetSelection.assets(sync_books).without_checks(),
    tags=BOOKS_CONCURRENCY_TAG,
    description="The long-lived books sync: capture the stream and MERGE it into library.books every few seconds.",
)


orders_daily = define_asset_job(
    "orders_daily",
    selection=AssetSelection.assets(orders_export, orders_athena),
    tags=ORDERS_CONCURRENCY_TAG,
    description="Export one day of orders from DynamoDB and load it into library.orders.",
)


class CleanupConfig(Config):
    bucket: str = Field(description="bucket of the manifests")
    manifest_keys: list[str] = Field(description="commit manifests written by the materializations, oldest first")


@op(description="Deletes exactly the source files that successful materializations consumed.")
def delete_committed_source_files(context: OpExecutionContext, config: CleanupConfig, aws: AwsClientsResource) -> int:
    deleted = 0
    for manifest_key in config.manifest_keys:
        deleted += delete_committed_files(aws.client("s3"), config.bucket, manifest_key)
    context.log.info(f"Deleted {deleted} committed files listed in {len(config.manifest_keys)} manifests in s3://{config.bucket}/")
    return deleted


@job(description="Cleanup requested by the cleanup sensor (tagged with the table whose files it deletes).")
def source_cleanup():
    delete_committed_source_files()


@op(description="Compacts library.books, expires old snapshots, removes orphan files and prunes old tombstones.")
def maintain_books_table(context: OpExecutionContext, spark: IcebergSparkResource, sync: SyncSettings) -> None:
    context.log_event(maintenance_observation(maintain(spark, sync, sync.books_iceberg_table, with_tombstones=True)))


# The sync run maintains the table itself every maintenance_interval_minutes; this job is for a table whose
# sync is stopped. It carries the writer tag, so it waits for a running sync instead of competing with it.
@job(tags=BOOKS_CONCURRENCY_TAG, description="Iceberg maintenance of library.books, on demand.")
def books_maintenance():
    maintain_books_table()
