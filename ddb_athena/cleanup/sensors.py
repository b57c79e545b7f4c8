"""Sensors: cleanup of the source files each successful materialization consumed.

A streamed table's change files are deleted as soon as their merge committed; an exported table's export files after
`export_retention_days` (0: at once). Removing them never affects readers: the Iceberg tables
do not reference source files. One cleanup run per table and tick takes every manifest found
since the last tick, every DDB_ATHENA_CLEANUP_INTERVAL_SECONDS (5 minutes by default): a run is a process
of its own, so one per 10-second sync cycle would cost more than the merges. Change file cleanup runs never wait
behind the sync; an export's cleanup runs are in its table's writers' pool (a re-run of a partition re-uses its files).

A manifest is written right after its commit, before the materialization that names it: a run killed between the two
leaves a manifest no materialization names. The sensor also lists each source's manifests (one request a tick) and
cleans up any older than UNCLAIMED_MANIFEST_AGE past the retention: every manifest lists only committed files.
"""

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta

from dagster import AssetKey, AssetRecordsFilter, DefaultSensorStatus, JobDefinition, RunRequest, SensorEvaluationContext, SkipReason, sensor

from ddb_athena.cleanup.jobs import CLEANUP_TAG, EXPORT_CLEANUPS, SOURCE_CLEANUPS
from ddb_athena.exported.assets import EXPORTED
from ddb_athena.lib.resources import AwsClientsResource, SyncSettings
from ddb_athena.lib.run_capacity import capacity_tags
from ddb_athena.lib.settings import Settings
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.assets import STREAMED
from ddb_athena.streamed.capture.change_files import list_keys

SECONDS_PER_DAY = 86_400
# Materializations one cleanup run covers at most (about a quarter of an hour of 10-second cycles).
CLEANUP_BATCH = 100
# A manifest still there this long after its retention was named by no materialization (or its cleanup failed):
# far longer than a tick and a cleanup run take.
UNCLAIMED_MANIFEST_AGE = timedelta(hours=1)


def cleanup_requests(context: SensorEvaluationContext, asset_key: AssetKey, bucket: str, job: JobDefinition, after: int | None, retention_seconds: float = 0.0):
    """At most one cleanup run for the materializations after `after` that consumed files, keyed by the
    events it covers so it never runs twice. A materialization younger than the retention stops the scan:
    it and those after it wait."""
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset_key, after_storage_id=after), limit=CLEANUP_BATCH, ascending=True
    ).records
    manifests, cursor = [], after
    for record in records:
        if record.timestamp + retention_seconds > time.time():
            break
        manifest = record.asset_materialization.metadata.get("commit_manifest") if record.asset_materialization else None
        if manifest is not None and manifest.value:
            manifests.append(manifest.value)
        cursor = record.storage_id
    if not manifests:
        return [], cursor
    return [cleanup_request(asset_key, bucket, job, manifests, f"{after or 0}-{cursor}")], cursor


def cleanup_request(asset_key: AssetKey, bucket: str, job: JobDefinition, manifests: list[str], run_key_suffix: str) -> RunRequest:
    table = asset_key.to_user_string()
    (op_name,) = [node.name for node in job.graph.nodes]
    return RunRequest(
        run_key=f"cleanup-{table}-{run_key_suffix}",
        job_name=job.name,
        run_config={"ops": {op_name: {"config": {"bucket": bucket, "manifest_keys": manifests}}}},
        tags={CLEANUP_TAG: table},
    )


def unclaimed_manifests(s3, layout: SourceLayout, retention: timedelta, now: datetime) -> list[str]:
    """Manifests older than the retention and UNCLAIMED_MANIFEST_AGE: named by no materialization, or whose cleanup failed."""
    oldest = now - retention - UNCLAIMED_MANIFEST_AGE
    return sorted(entry["Key"] for entry in list_keys(s3, layout.bucket, layout.manifests_prefix) if entry["LastModified"] < oldest)


def unclaimed_manifest_requests(s3, layout: SourceLayout, asset_key: AssetKey, job: JobDefinition, retention: timedelta, now: datetime) -> list[RunRequest]:
    """One cleanup of the unclaimed manifests, keyed by them: the same set is never requested twice."""
    manifests = unclaimed_manifests(s3, layout, retention, now)
    if not manifests:
        return []
    digest = hashlib.sha256("\n".join(manifests).encode()).hexdigest()[:16]
    return [cleanup_request(asset_key, layout.bucket, job, manifests, f"unclaimed-{digest}")]


def _cursors(cursor: str | None) -> dict[str, int]:
    if not cursor:
        return {}
    parsed = json.loads(cursor)
    # A bare number is the cursor of the books-only sensor this one grew from.
    return {"books_iceberg": parsed} if isinstance(parsed, int) else parsed


@sensor(
    jobs=[*SOURCE_CLEANUPS.values(), *EXPORT_CLEANUPS.values()],
    minimum_interval_seconds=Settings.from_env().cleanup_interval_seconds,
    default_status=DefaultSensorStatus.RUNNING,
)
def cleanup_after_materialization(context: SensorEvaluationContext, sync: SyncSettings, aws: AwsClientsResource):
    cursors = _cursors(context.cursor)
    requests = []
    consumers = [
        *((assets.iceberg.key, SOURCE_CLEANUPS[name], assets.table, 0.0) for name, assets in STREAMED.items()),
        *((assets.athena.key, EXPORT_CLEANUPS[name], assets.table, sync.export_retention_days) for name, assets in EXPORTED.items()),
    ]
    s3, now = aws.client("s3"), datetime.now(UTC)
    for asset_key, job, table, retention_days in consumers:
        name = asset_key.to_user_string()
        found, cursor = cleanup_requests(context, asset_key, sync.bucket, job, cursors.get(name), retention_days * SECONDS_PER_DAY)
        requests += found
        if cursor is not None:
            cursors[name] = cursor
        requests += unclaimed_manifest_requests(s3, sync.layout_of(table), asset_key, job, timedelta(days=retention_days), now)
    context.update_cursor(json.dumps(cursors))
    # On ECS, in the capacity the deployment chose (an interrupted cleanup is requested again: its manifests stay); the
    # launcher gives a cleanup job's task the cleanups' own role, which may delete source files and never a warehouse one.
    requests = [request.with_replaced_attrs(tags={**request.tags, **capacity_tags(sync.run_capacity)}) for request in requests]
    return requests or SkipReason("no new materialization consumed files, and no manifest is left unclaimed")
