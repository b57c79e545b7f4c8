"""Sensors: cleanup of the source files each successful materialization committed."""

from dagster import AssetKey, AssetRecordsFilter, DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor

from ddb_athena.assets.books import books_iceberg
from ddb_athena.jobs import BOOKS_CONCURRENCY_TAG, source_cleanup
from ddb_athena.resources import SyncSettings


def cleanup_requests(context: SensorEvaluationContext, asset_key: AssetKey, bucket: str):
    """One cleanup run per materialization that committed files, keyed by its event so it never runs twice."""
    cursor = int(context.cursor) if context.cursor else None
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset_key, after_storage_id=cursor), limit=100, ascending=True
    ).records
    requests = []
    for record in records:
        manifest = record.asset_materialization.metadata.get("commit_manifest") if record.asset_materialization else None
        if manifest is not None and manifest.value:
            requests.append(
                RunRequest(
                    run_key=f"cleanup-{asset_key.to_user_string()}-{record.storage_id}",
                    run_config={"ops": {"delete_committed_source_files": {"config": {"bucket": bucket, "manifest_key": manifest.value}}}},
                    tags={**BOOKS_CONCURRENCY_TAG, "ddb_athena/cleans": record.run_id},
                )
            )
        cursor = record.storage_id
    return requests, cursor


@sensor(job=source_cleanup, minimum_interval_seconds=15, default_status=DefaultSensorStatus.RUNNING)
def cleanup_after_materialization(context: SensorEvaluationContext, sync: SyncSettings):
    requests, cursor = cleanup_requests(context, books_iceberg.key, sync.bucket)
    if cursor is not None:
        context.update_cursor(str(cursor))
    return requests or SkipReason("no new materialization committed files")
