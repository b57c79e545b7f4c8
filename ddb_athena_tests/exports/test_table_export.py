"""Export requests: preconditions before any cost, idempotence per partition, waiting, the export's files."""

import random
from datetime import datetime, timedelta, timezone

import pytest

from ddb_athena.capture.change_files import SourceLayout
from ddb_athena.exports.table_export import (
    FULL_EXPORT,
    INCREMENTAL_EXPORT,
    ExportError,
    ExportWindow,
    client_token,
    export_files,
    export_partition,
    load_record,
    partition_window,
    wait_for_export,
)
from ddb_athena.simulate import order_item
from ddb_athena_tests.exports.aws_layout import full_line, write_export
from ddb_athena_tests.exports.helpers import ScriptedExports, pitr_holds_since

NOW = datetime.now(timezone.utc)
YESTERDAY = datetime.combine((NOW - timedelta(days=1)).date(), datetime.min.time(), tzinfo=timezone.utc)
DAY_WINDOW = ExportWindow(INCREMENTAL_EXPORT, YESTERDAY, YESTERDAY + timedelta(days=1))


@pytest.fixture
def layout(settings):
    return SourceLayout(settings.bucket, "orders_export")


def seed_orders(settings, count: int) -> None:
    rng = random.Random(count)
    for _ in range(count):
        settings.client("dynamodb").put_item(TableName=settings.orders_table, Item=order_item(rng, NOW))


def export(settings, layout, window, dynamodb=None, logs=None, partition=None):
    return export_partition(
        dynamodb or settings.client("dynamodb"),
        settings.client("s3"),
        layout,
        settings.orders_table,
        partition or YESTERDAY.date().isoformat(),
        window,
        timeout=timedelta(seconds=5),
        poll_seconds=0.01,
        log=(logs if logs is not None else []).append,
    )


def test_windows_full_is_now_and_incremental_is_exactly_the_day():
    start, end = YESTERDAY, YESTERDAY + timedelta(days=1)
    assert partition_window(start, end, full=True, now=NOW) == ExportWindow(FULL_EXPORT, None, NOW)
    assert partition_window(start, end, full=False, now=NOW) == ExportWindow(INCREMENTAL_EXPORT, start, end)
    with pytest.raises(ValueError):
        ExportWindow(INCREMENTAL_EXPORT, end, start)


def test_a_full_export_lists_data_when_there_is_no_manifest_and_a_rerun_reuses_it(settings, layout):
    seed_orders(settings, 7)
    logs = []
    record, reused = export(settings, layout, ExportWindow(FULL_EXPORT, None, NOW), logs=logs)
    assert not reused and record.status == "COMPLETED" and record.item_count == 7 and not record.from_manifest
    assert len(record.data_files) == 1 and record.data_bytes > 0 and record.data_files[0].startswith(record.s3_prefix)
    assert any("no manifest-summary.json" in line for line in logs)
    assert load_record(settings.client("s3"), layout, YESTERDAY.date().isoformat()) == record

    again, reused = export(settings, layout, ExportWindow(FULL_EXPORT, None, NOW))
    assert reused and again == record
    # A full export serves a re-run even once the table is loaded (it would now ask for an incremental one).
    assert export(settings, layout, DAY_WINDOW)[1]
    assert len(settings.client("dynamodb").list_exports(TableArn=table_arn(settings))["ExportSummaries"]) == 1


def table_arn(settings):
    return settings.client("dynamodb").describe_table(TableName=settings.orders_table)["Table"]["TableArn"]


def test_an_incremental_request_covers_the_day_with_new_images_and_a_token_derived_from_the_partition(settings, layout):
    pitr_holds_since(settings, NOW - timedelta(days=30))
    dynamodb = ScriptedExports(settings.client("dynamodb"), ["COMPLETED"])
    record, _ = export(settings, layout, DAY_WINDOW, dynamodb=dynamodb)
    (request,) = dynamodb.requests
    assert request["ExportType"] == INCREMENTAL_EXPORT and request["ExportFormat"] == "DYNAMODB_JSON"
    assert request["IncrementalExportSpecification"] == {
        "ExportFromTime": DAY_WINDOW.start,
        "ExportToTime": DAY_WINDOW.end,
        "ExportViewType": "NEW_IMAGE",
    }
    partition = YESTERDAY.date().isoformat()
    assert request["ClientToken"] == client_token(table_arn(settings), partition, INCREMENTAL_EXPORT, 1) == record.client_token
    assert len(request["ClientToken"]) <= 64
    assert client_token(table_arn(settings), "2026-01-02", INCREMENTAL_EXPORT, 1) != request["ClientToken"]
    assert request["S3Prefix"] == f"orders_export/{partition}/attempt-1"


def test_a_failed_export_fails_with_aws_reason_and_the_retry_pays_for_a_new_attempt(settings, layout):
    seed_orders(settings, 2)
    failing = ScriptedExports(settings.client("dynamodb"), ["FAILED"], failure=("S3AccessDenied", "Access Denied to bucket"))
    with pytest.raises(ExportError, match="S3AccessDenied: Access Denied to bucket"):
        export(settings, layout, ExportWindow(FULL_EXPORT, None, NOW), dynamodb=failing)
    # The retry finds the recorded export FAILED, then its own new export completes.
    retry = ScriptedExports(settings.client("dynamodb"), ["FAILED", "COMPLETED"])
    record, reused = export(settings, layout, ExportWindow(FULL_EXPORT, None, NOW), dynamodb=retry)
    assert not reused and record.attempt == 2 and record.s3_prefix.endswith("attempt-2/") and len(retry.requests) == 1
    assert record.client_token != failing.requests[0]["ClientToken"]


def test_a_rerun_after_cleanup_requests_a_new_export(settings, layout):
    seed_orders(settings, 2)
    record, _ = export(settings, layout, ExportWindow(FULL_EXPORT, None, NOW))
    for key in record.all_files:
        settings.client("s3").delete_object(Bucket=settings.bucket, Key=key)
    again, reused = export(settings, layout, ExportWindow(FULL_EXPORT, None, NOW))
    assert not reused and again.attempt == 2 and again.item_count == 2


def test_waiting_logs_status_and_elapsed_time_and_gives_up_at_the_timeout(settings, layout):
    seed_orders(settings, 1)
    slow = ScriptedExports(settings.client("dynamodb"), ["IN_PROGRESS", "IN_PROGRESS", "COMPLETED"])
    logs = []
    record, _ = export(settings, layout, ExportWindow(FULL_EXPORT, None, NOW), dynamodb=slow, logs=logs)
    assert record.status == "COMPLETED"
    progress = [line for line in logs if line.startswith(f"export {record.export_arn}: ")]
    assert [line.split(": ")[1].split(" after ")[0] for line in progress] == ["IN_PROGRESS", "IN_PROGRESS", "COMPLETED"]

    stuck = ScriptedExports(settings.client("dynamodb"), ["IN_PROGRESS"])
    ticks = iter(range(0, 10_000, 60))
    with pytest.raises(ExportError, match="still IN_PROGRESS after 120 s"):
        wait_for_export(stuck, record.export_arn, timedelta(minutes=2), 60, [].append, sleep=lambda _: None, clock=lambda: next(ticks))


def test_preconditions_fail_clearly_before_anything_is_requested(settings, layout):
    dynamodb = settings.client("dynamodb")
    # The window begins before PITR could restore it (moto: PITR holds from the moment it was turned on).
    with pytest.raises(ExportError, match="earliest time point-in-time recovery still holds.*bootstrap"):
        export(settings, layout, DAY_WINDOW)
    today = datetime.combine(NOW.date(), datetime.min.time(), tzinfo=timezone.utc)
    with pytest.raises(ExportError, match="has not closed yet"):
        export(settings, layout, ExportWindow(INCREMENTAL_EXPORT, today, today + timedelta(days=1)))
    dynamodb.update_continuous_backups(TableName=settings.orders_table, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": False})
    with pytest.raises(ExportError, match="Point-in-time recovery is off.*update-continuous-backups"):
        export(settings, layout, ExportWindow(FULL_EXPORT, None, NOW))
    with pytest.raises(ExportError, match="bucket 'missing-bucket' does not exist"):
        export(settings, SourceLayout("missing-bucket", "orders_export"), ExportWindow(FULL_EXPORT, None, NOW))
    with pytest.raises(ExportError, match="table 'nope' does not exist"):
        export_partition(dynamodb, settings.client("s3"), layout, "nope", "2026-11-01", ExportWindow(FULL_EXPORT, None, NOW), timedelta(1), 1, print)
    assert dynamodb.list_exports(TableArn=table_arn(settings))["ExportSummaries"] == []


def test_the_manifests_give_the_data_files_item_count_and_bytes(settings):
    s3 = settings.client("s3")
    rng = random.Random(3)
    files = [[full_line(order_item(rng, NOW)) for _ in range(count)] for count in (3, 4)]
    written = write_export(s3, settings.bucket, "orders_export/2026-11-20/attempt-1", files)
    logs = []
    arn = f"arn:aws:dynamodb:us-east-1:123456789012:table/orders/export/{written['export_dir'].rstrip('/').rsplit('/', 1)[1]}"
    found = export_files(s3, settings.bucket, "orders_export/2026-11-20/attempt-1/", {"ExportArn": arn, "ItemCount": 999}, logs.append)
    assert found.from_manifest and found.item_count == 7 and found.data_files == written["data_files"]
    assert found.data_bytes == sum(s3.head_object(Bucket=settings.bucket, Key=key)["ContentLength"] for key in written["data_files"])
    assert {key.rsplit("/", 1)[1] for key in found.all_files} >= {"manifest-summary.json", "manifest-files.json", "_started"}
    assert logs == []
    # A second export under the same prefix (a request repeated after its token expired): each ARN finds its own.
    other = write_export(s3, settings.bucket, "orders_export/2026-11-20/attempt-1", [[full_line(order_item(rng, NOW))]])
    other_arn = arn.rsplit("/", 1)[0] + "/" + other["export_dir"].rstrip("/").rsplit("/", 1)[1]
    assert export_files(s3, settings.bucket, "orders_export/2026-11-20/attempt-1/", {"ExportArn": other_arn}, logs.append).item_count == 1
    assert export_files(s3, settings.bucket, "orders_export/2026-11-20/attempt-1/", {"ExportArn": arn}, logs.append).item_count == 7
    with pytest.raises(ExportError, match="none of export"):
        export_files(s3, settings.bucket, "orders_export/2026-11-20/attempt-1/", {"ExportArn": arn + "-gone"}, logs.append)
    s3.delete_object(Bucket=settings.bucket, Key=written["data_files"][0])
    with pytest.raises(ExportError, match="lists 1 data files that are not in S3"):
        export_files(s3, settings.bucket, "orders_export/2026-11-20/attempt-1/", {"ExportArn": arn}, logs.append)
