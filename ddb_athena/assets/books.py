"""Books assets: capture of the DynamoDB stream (books_source) and the minute MERGE (books_iceberg)."""

import time
from datetime import datetime, timezone

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field

from ddb_athena.capture.bootstrap import bootstrap_snapshot, pending_snapshot
from ddb_athena.capture.change_files import ChangeFileNamer, list_change_files
from ddb_athena.capture.commit_manifests import write_commit_manifest
from ddb_athena.capture.quarantine import quarantine_foreign_files
from ddb_athena.capture.stream_reader import StreamCapture
from ddb_athena.resources import AwsClientsResource, IcebergSparkResource, SyncSettings
from ddb_athena.spark.change_merge import merge_change_files, table_exists
from ddb_athena.table_spec import BOOKS_SPEC


class BooksSourceConfig(Config):
    bootstrap: bool = Field(
        default=False,
        description="Scan the whole table and replay the stream after it: the recovery from a stream gap.",
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


@asset(
    group_name="books",
    kinds={"dynamodb", "s3"},
    description="DynamoDB stream changes of the books table, captured as change files under s3://<bucket>/books_source/.",
)
def books_source(
    context: AssetExecutionContext,
    config: BooksSourceConfig,
    aws: AwsClientsResource,
    spark: IcebergSparkResource,
    sync: SyncSettings,
) -> MaterializeResult:
    started = time.monotonic()
    s3, dynamodb = aws.client("s3"), aws.client("dynamodb")
    layout = sync.books_layout
    namer = ChangeFileNamer()
    capture = StreamCapture(dynamodb, aws.client("dynamodbstreams"), s3, sync.books_table, layout, namer=namer, log=context.log.info)
    metadata: dict = {"bootstrap_items": 0}
    table_missing = not table_exists(spark.spark_session, sync.books_iceberg_table)
    if config.bootstrap or (table_missing and not pending_snapshot(s3, layout)):
        reason = "requested" if config.bootstrap else f"{sync.books_iceberg_table} does not exist yet"
        context.log.info(f"Bootstrap ({reason}): scanning {sync.books_table}, then replaying the stream from its start")
        # The whole retained stream is replayed after the scan; that ordering is what makes the scan exact.
        capture.reset_checkpoints()
        snapshot = bootstrap_snapshot(dynamodb, s3, sync.books_table, BOOKS_SPEC.key.attribute, layout, namer)
        metadata.update(bootstrap_items=snapshot.items, bootstrap_file=snapshot.change_file)

    result = capture.capture()
    pending = list_change_files(s3, layout)
    newest = datetime.fromisoformat(result.newest_change_at.replace("Z", "+00:00")) if result.newest_change_at else None
    metadata.update(
        records_captured=result.records,
        inserts=result.events.get("INSERT", 0),
        modifies=result.events.get("MODIFY", 0),
        removes=result.events.get("REMOVE", 0),
        change_files_written=len(result.change_files),
        change_files_pending=len(pending),
        shards_read=result.shards_read,
        stream_arn=result.stream_arn,
        capture_lag_seconds=(datetime.now(timezone.utc) - newest).total_seconds() if newest else 0.0,
        duration_seconds=time.monotonic() - started,
        source=MetadataValue.url(layout.uri(layout.changes_prefix)),
    )
    return MaterializeResult(metadata=metadata)


@asset(
    deps=[books_source],
    group_name="books",
    kinds={"spark", "iceberg"},
    description="library.books: the books table in Iceberg, kept in sync by one MERGE INTO per run.",
)
def books_iceberg(
    context: AssetExecutionContext, aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings
) -> MaterializeResult:
    started = time.monotonic()
    s3 = aws.client("s3")
    layout = sync.books_layout
    batch = context.run.run_id
    # A file the merge cannot take would otherwise sit in the prefix forever, its changes lost in silence.
    foreign = quarantine_foreign_files(s3, layout, batch)
    if foreign:
        context.log.warning(f"Quarantined {len(foreign)} files that are not change files: {', '.join(r.source_file for r in foreign)}")
    # Exactly the files present now: later arrivals wait for the next run, none is skipped.
    files = list_change_files(s3, layout)
    context.log.info(f"Merging {len(files)} change files into {sync.books_iceberg_table}")
    result = merge_change_files(
        spark.spark_session,
        BOOKS_SPEC,
        sync.books_iceberg_table,
        [layout.uri(key, spark.source_scheme) for key in files],
        layout.uri(f"{layout.quarantine_prefix}{batch}", spark.source_scheme),
    )
    manifest = write_commit_manifest(s3, layout, batch, files, sync.books_iceberg_table, result.snapshot_id) if files else None
    if result.records_quarantined:
        context.log.warning(f"Quarantined {result.records_quarantined} records: {result.quarantine_reasons}")
    now = datetime.now(timezone.utc)
    return MaterializeResult(
        metadata={
            "rows_inserted": result.inserted,
            "rows_updated": result.updated,
            "rows_deleted": result.deleted,
            "keys_changed": result.changes,
            "changes_stale_skipped": result.stale_skipped,
            "files_consumed": len(files),
            "records_consumed": result.records_read,
            "records_quarantined": result.records_quarantined,
            "foreign_files_quarantined": len(foreign),
            "records_superseded_by_bootstrap": result.records_superseded,
            "snapshot_id": result.snapshot_id,
            "lag_seconds": (now - result.newest_change_at).total_seconds() if result.newest_change_at else 0.0,
            "newest_change_at": _iso(result.newest_change_at),
            "duration_seconds": time.monotonic() - started,
            "bootstrap_file": result.bootstrap_file,
            "commit_manifest": manifest,
        }
    )
