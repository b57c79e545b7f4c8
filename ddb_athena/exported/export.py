"""Requests a DynamoDB export for one daily partition, idempotently, and waits for it.

What a partition exports depends on the full export the table was loaded from (taken at T): a day
that ends by T is covered by it (nothing to export); the day that contains T exports only
[T, day end); every later day exactly [day start, day end). Every precondition that AWS would only
report after billing (or never) is checked first: point-in-time recovery on, the bucket present,
the window closed, at least 15 minutes long and still within the PITR retention. A partition's export is recorded in S3 (`<prefix>/<partition>/_export.json`)
and re-used by a retry or a re-run; the ClientToken, derived from the partition, makes the
request itself idempotent for the 8 hours AWS keeps it, so a crash between the request and
the record does not pay twice either.
"""

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta

from botocore.exceptions import ClientError

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_keys

FULL_EXPORT = "FULL_EXPORT"
INCREMENTAL_EXPORT = "INCREMENTAL_EXPORT"
# The view of the incremental export: the document as it is after the change.
EXPORT_VIEW = "NEW_IMAGE"
EXPORT_FORMAT = "DYNAMODB_JSON"
RECORD_NAME = "_export.json"
# The record of a day that a full export already covers: no export was requested for it.
COVERED = "COVERED_BY_FULL_EXPORT"
# DynamoDB's limits on an incremental export's window.
MIN_INCREMENTAL_WINDOW = timedelta(minutes=15)
MAX_INCREMENTAL_WINDOW = timedelta(hours=24)


def utc_now() -> datetime:
    return datetime.now(UTC)


class ExportError(RuntimeError):
    """An export cannot be requested, failed, or did not finish in time."""


@dataclass(frozen=True)
class ExportWindow:
    """What an export covers: a full export is the table as of `end`; an incremental one [start, end)."""

    export_type: str
    start: datetime | None
    end: datetime

    def __post_init__(self):
        if self.export_type not in (FULL_EXPORT, INCREMENTAL_EXPORT):
            raise ValueError(f"unknown export type {self.export_type!r}")
        if self.export_type == INCREMENTAL_EXPORT and (self.start is None or self.start >= self.end):
            raise ValueError(f"an incremental export needs start < end, got [{self.start}, {self.end})")

    @property
    def too_short(self) -> bool:
        """Shorter than DynamoDB allows an incremental export to be."""
        return self.export_type == INCREMENTAL_EXPORT and self.end - self.start < MIN_INCREMENTAL_WINDOW

    def describe(self) -> str:
        if self.export_type == FULL_EXPORT:
            return f"the whole table as of {self.end.isoformat()}"
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


@dataclass(frozen=True)
class FullExportCoverage:
    """The full export a table was loaded from: it holds every item as of `export_time`."""

    export_arn: str
    export_time: datetime


def partition_window(day_start: datetime, day_end: datetime, full: bool, coverage: FullExportCoverage | None, now: datetime) -> ExportWindow | None:
    """What the partition of [day_start, day_end) exports; None when the table's full export covers the day.

    A full export is taken now: it covers everything up to now, so no later day can fall in a gap.
    The day that contains the full export's time T exports only [T, day end) (before T there may be
    no point-in-time recovery: a new deployment turns it on just before its first full export)."""
    if full:
        return ExportWindow(FULL_EXPORT, None, now)
    if coverage is not None and coverage.export_time >= day_end:
        return None
    start = max(day_start, coverage.export_time) if coverage is not None else day_start
    return ExportWindow(INCREMENTAL_EXPORT, start, day_end)


def widen_to_minimum(window: ExportWindow, earliest_restorable: datetime | None) -> ExportWindow:
    """An incremental window shorter than DynamoDB's 15 minutes, widened backwards as far as point-in-time
    recovery reaches, then forwards if it is still short. The load skips the orders it already has."""
    start = min(window.start, max(window.end - MIN_INCREMENTAL_WINDOW, earliest_restorable or window.start))
    return ExportWindow(INCREMENTAL_EXPORT, start, max(window.end, start + MIN_INCREMENTAL_WINDOW))


@dataclass(frozen=True)
class ExportRecord:
    """What was requested for a partition, and (once done) which files it produced."""

    partition: str
    attempt: int
    export_arn: str
    export_type: str
    window_start: str | None
    window_end: str
    s3_prefix: str
    client_token: str
    status: str = "IN_PROGRESS"
    item_count: int | None = None
    data_files: list[str] = field(default_factory=list)
    # Items in each data file, from the export's manifest (None without one).
    data_file_items: list[int] | None = None
    all_files: list[str] = field(default_factory=list)
    data_bytes: int = 0
    from_manifest: bool = False
    export_time: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def export_prefix(layout: SourceLayout, partition: str) -> str:
    return f"{layout.prefix}/{partition}/"


def record_key(layout: SourceLayout, partition: str) -> str:
    return export_prefix(layout, partition) + RECORD_NAME


def load_record(s3, layout: SourceLayout, partition: str) -> ExportRecord | None:
    try:
        body = s3.get_object(Bucket=layout.bucket, Key=record_key(layout, partition))["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    except s3.exceptions.NoSuchBucket:
        raise ExportError(_missing_bucket(layout.bucket)) from None
    return ExportRecord(**json.loads(body))


def _missing_bucket(bucket: str) -> str:
    return f"S3 bucket {bucket!r} does not exist; create it (ddb-athena init) or set DDB_ATHENA_BUCKET"


def save_record(s3, layout: SourceLayout, record: ExportRecord) -> None:
    s3.put_object(Bucket=layout.bucket, Key=record_key(layout, record.partition), Body=record.to_json().encode(), ContentType="application/json")


def client_token(table_arn: str, partition: str, export_type: str, attempt: int) -> str:
    """The same partition, type and attempt always make the same token (AWS allows 64 characters)."""
    return hashlib.sha256(f"{table_arn}|{partition}|{export_type}|{attempt}".encode()).hexdigest()


def _error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def point_in_time_recovery(dynamodb, table_name: str) -> dict:
    """The table's PointInTimeRecoveryDescription (status, EarliestRestorableDateTime)."""
    backups = dynamodb.describe_continuous_backups(TableName=table_name)["ContinuousBackupsDescription"]
    return backups.get("PointInTimeRecoveryDescription", {})


def check_preconditions(dynamodb, s3, table_name: str, layout: SourceLayout, window: ExportWindow, now: datetime) -> str:
    """Raises ExportError with the fix for anything that would make the export fail; returns the table ARN."""
    try:
        table_arn = dynamodb.describe_table(TableName=table_name)["Table"]["TableArn"]
    except ClientError as error:
        if _error_code(error) == "ResourceNotFoundException":
            raise ExportError(f"DynamoDB table {table_name!r} does not exist") from None
        raise
    pitr = point_in_time_recovery(dynamodb, table_name)
    if pitr.get("PointInTimeRecoveryStatus") != "ENABLED":
        raise ExportError(
            f"Point-in-time recovery is off for DynamoDB table {table_name!r}, and exports need it. Turn it on with: "
            f"aws dynamodb update-continuous-backups --table-name {table_name} "
            "--point-in-time-recovery-specification PointInTimeRecoveryEnabled=true "
            "(incremental exports can then cover changes from that moment on)"
        )
    try:
        # A listing of the export prefix, not a HEAD of the bucket: IAM checks HeadBucket as s3:ListBucket with no
        # prefix, which the runs' role (listing only its own prefixes) does not have.
        s3.list_objects_v2(Bucket=layout.bucket, Prefix=f"{layout.prefix}/", MaxKeys=1)
    except ClientError as error:
        if _error_code(error) in ("404", "NoSuchBucket", "NotFound"):
            raise ExportError(_missing_bucket(layout.bucket)) from None
        raise
    if window.export_type == INCREMENTAL_EXPORT:
        if not MIN_INCREMENTAL_WINDOW <= window.end - window.start <= MAX_INCREMENTAL_WINDOW:
            raise ExportError(f"the window {window.describe()} is not between 15 minutes and 24 hours long, as DynamoDB requires")
        if window.end > now:
            raise ExportError(f"the window {window.describe()} has not closed yet (it is {now.isoformat()})")
        earliest = pitr.get("EarliestRestorableDateTime")
        if earliest is not None and window.start < earliest:
            raise ExportError(
                f"the window {window.describe()} starts before {earliest.isoformat()}, the earliest time point-in-time "
                "recovery still holds (its retention is at most 35 days, and it covers nothing before it was turned on). "
                "Load this partition from a full export instead: materialize it with the orders_export config "
                '{"bootstrap": true}.'
            )
    return table_arn


def request_export(dynamodb, table_arn: str, bucket: str, s3_prefix: str, window: ExportWindow, token: str) -> dict:
    arguments = {
        "TableArn": table_arn,
        "S3Bucket": bucket,
        "S3Prefix": s3_prefix.rstrip("/"),
        "ExportFormat": EXPORT_FORMAT,
        "ExportType": window.export_type,
        "ClientToken": token,
    }
    if window.export_type == INCREMENTAL_EXPORT:
        arguments["IncrementalExportSpecification"] = {
            "ExportFromTime": window.start,
            "ExportToTime": window.end,
            "ExportViewType": EXPORT_VIEW,
        }
    return dynamodb.export_table_to_point_in_time(**arguments)["ExportDescription"]


def wait_for_export(
    dynamodb,
    export_arn: str,
    timeout: timedelta,
    poll_seconds: float,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Polls until the export completes; FAILED raises with AWS's reason, and so does the timeout."""
    started = clock()
    while True:
        description = dynamodb.describe_export(ExportArn=export_arn)["ExportDescription"]
        status, elapsed = description["ExportStatus"], clock() - started
        log(f"export {export_arn}: {status} after {elapsed:.0f} s")
        if status == "COMPLETED":
            return description
        if status == "FAILED":
            raise ExportError(f"export {export_arn} failed: {description.get('FailureCode') or 'no code'}: {description.get('FailureMessage') or 'no message'}")
        if elapsed >= timeout.total_seconds():
            raise ExportError(
                f"export {export_arn} is still {status} after {elapsed:.0f} s (timeout {timeout.total_seconds():.0f} s); "
                "a re-run of the partition picks it up where it is, without a second export"
            )
        sleep(poll_seconds)


@dataclass(frozen=True)
class ExportFiles:
    data_files: list[str]
    data_file_items: list[int] | None
    all_files: list[str]
    item_count: int | None
    data_bytes: int
    from_manifest: bool


def _objects(s3, bucket: str, prefix: str) -> dict[str, int]:
    """{key: size} of every object under `prefix`."""
    return {obj["Key"]: obj["Size"] for obj in list_keys(s3, bucket, prefix)}


def _summary_key(objects: dict[str, int], description: dict) -> str | None:
    """The manifest-summary.json of this export: AWS writes it under AWSDynamoDB/<export id>/, the id
    being the last part of the export's ARN. (A prefix can hold two exports when a request was repeated
    after its ClientToken expired.)"""
    summaries = sorted(key for key in objects if key.endswith("/manifest-summary.json"))
    export_id = description["ExportArn"].rsplit("/", 1)[-1]
    own = [key for key in summaries if f"/{export_id}/" in key]
    if own or len(summaries) <= 1:
        return (own or summaries or [None])[0]
    raise ExportError(f"{len(summaries)} exports' manifests under one prefix and none of export {description['ExportArn']}")


def export_files(s3, bucket: str, s3_prefix: str, description: dict, log: Callable[[str], None]) -> ExportFiles:
    """The export's data files, item count and bytes, from its manifests (AWS's layout) or, where the
    exporter wrote none, from a listing of its data/ prefix."""
    objects = _objects(s3, bucket, s3_prefix)
    summary_key = _summary_key(objects, description)
    if summary_key:
        summary = json.loads(s3.get_object(Bucket=bucket, Key=summary_key)["Body"].read())
        body = s3.get_object(Bucket=bucket, Key=summary["manifestFilesS3Key"])["Body"].read().decode()
        entries = [json.loads(line) for line in body.splitlines() if line.strip()]
        data_files = [entry["dataFileS3Key"] for entry in entries]
        missing = [key for key in data_files if key not in objects]
        if missing:
            raise ExportError(f"the export's manifest lists {len(missing)} data files that are not in S3, e.g. {missing[0]}")
        export_dir = summary_key.rsplit("/", 1)[0] + "/"
        return ExportFiles(
            data_files=data_files,
            data_file_items=[int(entry["itemCount"]) for entry in entries],
            all_files=sorted(key for key in objects if key.startswith(export_dir)),
            item_count=int(summary["itemCount"]),
            data_bytes=sum(objects[key] for key in data_files),
            from_manifest=True,
        )
    data_files = sorted(key for key in objects if "/data/" in key)
    log(
        f"no manifest-summary.json under s3://{bucket}/{s3_prefix} (the local emulator writes none): "
        f"listed its data/ prefix instead, {len(data_files)} files; the item count is DescribeExport's"
    )
    return ExportFiles(
        data_files=data_files,
        data_file_items=None,
        all_files=sorted(objects),
        item_count=description.get("ItemCount"),
        data_bytes=sum(objects[key] for key in data_files),
        from_manifest=False,
    )


def _usable(s3, layout: SourceLayout, dynamodb, record: ExportRecord) -> dict | None:
    """The export's description if the recorded export can be re-used (running, or done with its files)."""
    description = dynamodb.describe_export(ExportArn=record.export_arn)["ExportDescription"]
    if description["ExportStatus"] == "FAILED":
        return None
    if description["ExportStatus"] == "COMPLETED" and record.data_files:
        present = _objects(s3, layout.bucket, record.s3_prefix)
        if any(key not in present for key in record.data_files):
            return None  # cleaned up after its load: a re-run needs a new export
    return description


def covered_record(layout: SourceLayout, partition: str, day_start: datetime, day_end: datetime, coverage: FullExportCoverage, attempt: int) -> ExportRecord:
    """The record of a day that the table's full export covers: nothing exported, nothing to load."""
    return ExportRecord(
        partition=partition,
        attempt=attempt,
        export_arn=coverage.export_arn,
        export_type=COVERED,
        window_start=day_start.isoformat(),
        window_end=day_end.isoformat(),
        s3_prefix=export_prefix(layout, partition),
        client_token="",
        status="COMPLETED",
        item_count=0,
        export_time=coverage.export_time.isoformat(),
    )


def export_partition(
    dynamodb,
    s3,
    layout: SourceLayout,
    table_name: str,
    partition: str,
    day_start: datetime,
    day_end: datetime,
    full: bool,
    coverage: FullExportCoverage | None,
    timeout: timedelta,
    poll_seconds: float,
    log: Callable[[str], None],
    now: datetime | None = None,
) -> tuple[ExportRecord, bool]:
    """The partition's completed export (or the record that a full export covers its day), re-used where
    possible; (record, reused). `full`: take a full export; `coverage`: the full export the table was loaded from."""
    now = now or utc_now()
    recorded = load_record(s3, layout, partition)
    description = _usable(s3, layout, dynamodb, recorded) if recorded and recorded.export_type != COVERED else None
    # A recorded full export serves any re-run; an incremental one does not serve a requested bootstrap.
    reused = description is not None and (recorded.export_type == FULL_EXPORT or not full)
    if reused:
        log(f"re-using export {recorded.export_arn} of partition {partition} ({description['ExportStatus']})")
        record = recorded
    else:
        if recorded and recorded.export_type != COVERED:
            log(f"the recorded export {recorded.export_arn} cannot be re-used (failed, cleaned up, or of another type)")
        attempt = recorded.attempt + 1 if recorded else 1
        window = partition_window(day_start, day_end, full, coverage, now)
        if window is None:
            log(
                f"no export needed: the day ends by {coverage.export_time.isoformat()}, the time of full export "
                f"{coverage.export_arn}, which holds every item up to then and is loaded"
            )
            record = covered_record(layout, partition, day_start, day_end, coverage, attempt - 1)
            save_record(s3, layout, record)
            return record, False
        if window.export_type == INCREMENTAL_EXPORT and window.start > day_start:
            log(f"the day up to {coverage.export_time.isoformat()} is covered by full export {coverage.export_arn}: exporting the rest of it")
        if window.too_short:
            widened = widen_to_minimum(window, point_in_time_recovery(dynamodb, table_name).get("EarliestRestorableDateTime"))
            log(
                f"{window.describe()} is shorter than the 15 minutes DynamoDB requires of an incremental export: widened to "
                f"{widened.describe()}, within point-in-time recovery; the load skips the items it already has"
            )
            window = widened
        table_arn = check_preconditions(dynamodb, s3, table_name, layout, window, now)
        s3_prefix = f"{export_prefix(layout, partition)}attempt-{attempt}/"
        token = client_token(table_arn, partition, window.export_type, attempt)
        log(f"requesting a {window.export_type} of {table_name}: {window.describe()} into s3://{layout.bucket}/{s3_prefix}")
        description = request_export(dynamodb, table_arn, layout.bucket, s3_prefix, window, token)
        record = ExportRecord(
            partition=partition,
            attempt=attempt,
            export_arn=description["ExportArn"],
            export_type=window.export_type,
            window_start=window.start.isoformat() if window.start else None,
            window_end=window.end.isoformat(),
            s3_prefix=s3_prefix,
            client_token=token,
        )
        save_record(s3, layout, record)
    if description["ExportStatus"] != "COMPLETED":
        description = wait_for_export(dynamodb, record.export_arn, timeout, poll_seconds, log)
    if record.status != "COMPLETED":
        files = export_files(s3, layout.bucket, record.s3_prefix, description, log)
        export_time = description.get("ExportTime")
        record = replace(
            record,
            status="COMPLETED",
            item_count=files.item_count,
            data_files=files.data_files,
            data_file_items=files.data_file_items,
            all_files=files.all_files,
            data_bytes=files.data_bytes,
            from_manifest=files.from_manifest,
            export_time=export_time.isoformat() if export_time else record.window_end,
        )
        save_record(s3, layout, record)
    return record, reused
