"""Sensors: cleanup of the source files each successful materialization consumed.

Books change files are deleted as soon as their merge committed; orders export files after
`export_retention_days` (0: at once). Removing them never affects readers: the Iceberg tables
do not reference source files.
"""

import json
import time

from dagster import AssetKey, AssetRecordsFilter, DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor

from ddb_athena.assets.books import books_iceberg
from ddb_athena.assets.orders import orders_athena
from ddb_athena.jobs import BOOKS_CONCURRENCY_TAG, ORDERS_CONCURRENCY_TAG, source_cleanup
from ddb_athena.resources import SyncSettings

SECONDS_PER_DAY = 86_400


def cleanup_requests(
    context: SensorEvaluationContext, asset_key: AssetKey, bucket: str, tags: dict, after: int | None, retention_seconds: float = 0.0
):
    """One cleanup run per materialization that consumed files, keyed by its event so it never runs twice.
    A materialization younger than the retention stops the scan: it and those after it wait."""
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset_key, after_storage_id=after), limit=100, ascending=True
    ).records
    requests, cursor = [], after
    for record in records:
        if record.timestamp + retention_seconds > time.time():
            break
        manifest = record.asset_materialization.metadata.get("commit_manifest") if record.asset_materialization else None
        if manifest is not None and manifest.value:
            requests.append(
                RunRequest(
                    run_key=f"cleanup-{asset_key.to_user_string()}-{record.storage_id}",
                    run_config={"ops": {"delete_committed_source_files": {"config": {"bucket": bucket, "manifest_key": manifest.value}}}},
                    tags={**tags, "ddb_athena/cleans": record.run_id},
                )
            )
        cursor = record.storage_id
    return requests, cursor


def _cursors(cursor: str | None) -> dict[str, int]:
    if not cursor:
        return {}
    parsed = json.loads(cursor)
    # A bare number is the cursor of the books-only sensor this one grew from.
    return {books_iceberg.key.to_user_string(): parsed} if isinstance(parsed, int) else parsed


@sensor(job=source_cleanup, minimum_interval_seconds=15, default_status=DefaultSensorStatus.RUNNING)
def cleanup_after_materialization(context: SensorEvaluationContext, sync: SyncSettings):
    cursors = _cursors(context.cursor)
    requests = []
    for asset_key, tags, retention_days in (
        (books_iceberg.key, BOOKS_CONCURRENCY_TAG, 0.0),
        (orders_athena.key, ORDERS_CONCURRENCY_TAG, sync.export_retention_days),
    ):
        name = asset_key.to_user_string()
        found, cursor = cleanup_requests(context, asset_key, sync.bucket, tags, cursors.get(name), retention_days * SECONDS_PER_DAY)
        requests += found
        if cursor is not None:
            cursors[name] = cursor
    context.update_cursor(json.dumps(cursors))
    return requests or SkipReason("no new materialization consumed files")
