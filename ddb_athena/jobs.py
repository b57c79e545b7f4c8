"""Jobs: the books sync, the daily orders export and load, the cleanup of consumed source files,
and table maintenance.

Every job that writes a table or its source carries that table's concurrency tag, which
dagster.yaml limits to one run at a time per table: runs queue behind each other, never overlap.
"""

from datetime import timedelta

from dagster import AssetObservation, AssetSelection, Config, OpExecutionContext, define_asset_job, job, op
from pydantic import Field

from ddb_athena.assets.books import books_iceberg, sync_books
from ddb_athena.assets.orders import orders_athena, orders_export
from ddb_athena.capture.commit_manifests import delete_committed_files
from ddb_athena.resources import AwsClientsResource, IcebergSparkResource, SyncSettings
from ddb_athena.spark.maintenance import maintain_table

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


@op(description="Compacts library.books, expires old snapshots (past the retention) and prunes old tombstones.")
def maintain_books_table(context: OpExecutionContext, spark: IcebergSparkResource, sync: SyncSettings) -> None:
    result = maintain_table(
        spark.spark_session,
        spark.catalog,
        sync.books_iceberg_table,
        snapshot_retention=timedelta(hours=sync.snapshot_retention_hours),
        retain_last=sync.snapshot_retain_last,
        tombstone_retention=timedelta(days=sync.tombstone_retention_days),
    )
    # Shown on the books_iceberg asset page beside its materializations.
    context.log_event(AssetObservation(asset_key=books_iceberg.key, metadata={f"maintenance_{k}": v for k, v in vars(result).items()}))


@job(tags=BOOKS_CONCURRENCY_TAG, description="Hourly Iceberg maintenance of library.books.")
def books_maintenance():
    maintain_books_table()
