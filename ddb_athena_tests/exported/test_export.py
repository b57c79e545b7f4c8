"""Export requests: preconditions before any cost, idempotence per partition, waiting, the export's files."""

import random
from datetime import UTC, datetime, timedelta

import pytest

from ddb_athena.dev.simulate import order_item
from ddb_athena.exported.export import (
    COVERED,
    FULL_EXPORT,
    INCREMENTAL_EXPORT,
    ExportError,
    ExportWindow,
    FullExportCoverage,
    check_preconditions,
    client_token,
    export_files,
    export_partition,
    load_record,
    partition_window,
    wait_for_export,
    widen_to_minimum,
)
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena_tests.exported.aws_layout import full_line, write_export
from ddb_athena_tests.exported.helpers import ScriptedExports, pitr_holds_since

NOW = datetime.now(UTC)
YESTERDAY = datetime.combine((NOW - timedelta(days=1)).date(), datetime.min.time(), tzinfo=UTC)
DAY_WINDOW = ExportWindow(INCREMENTAL_EXPORT, YESTERDAY, YESTERDAY + timedelta(days=1))


@pytest.fixture
def layout(settings):
    return SourceLayout(settings.bucket, "orders_export")


def seed_orders(settings, count: int) -> None:
    rng = random.Random(count)
    for _ in range(count):
        settings.client("dynamodb").put_item(TableName=settings.dynamodb_tables["orders"], Item=order_item(rng, NOW))


def export(settings, layout, full, day=YESTERDAY, coverage=None, dynamodb=None, logs=None, now=NOW):
    return export_partition(
        dynamodb or settings.client("dynamodb"),
        settings.client("s3"),
        layout,
        settings.dynamodb_tables["orders"],
        day.date().isoformat(),
        day,
        day + timedelta(days=1),
        full=full,
        coverage=coverage,
        timeout=timedelta(seconds=5),
        poll_seconds=0.01,
        log=(logs if logs is not None else []).append,
        now=now,
    )


def test_windows_full_is_now_a_covered_day_exports_nothing_and_the_day_of_the_full_export_only_its_rest():
    start, end = YESTERDAY, YESTERDAY + timedelta(days=1)
    assert partition_window(start, end, True, None, NOW) == ExportWindow(FULL_EXPORT, None, NOW)
    assert partition_window(start, end, False, None, NOW) == ExportWindow(INCREMENTAL_EXPORT, start, end)

    def full_export_at(moment):
        return FullExportCoverage("arn:full", moment)

    assert partition_window(start, end, False, full_export_at(end), NOW) is None
    assert partition_window(start, end, False, full_export_at(end + timedelta(days=3)), NOW) is None
    taken = start + timedelta(hours=10, minutes=3)
    assert partition_window(start, end, False, full_export_at(taken), NOW) == ExportWindow(INCREMENTAL_EXPORT, taken, end)
    for earlier in (start, start - timedelta(days=2)):
        assert partition_window(start, end, False, full_export_at(earlier), NOW) == ExportWindow(INCREMENTAL_EXPORT, start, end)
    # A requested bootstrap is a full export whatever is loaded.
    assert partition_window(start, end, True, full_export_at(end), NOW) == ExportWindow(FULL_EXPORT, None, NOW)
    with pytest.raises(ValueError):
        ExportWindow(INCREMENTAL_EXPORT, end, start)


def test_a_window_shorter_than_15_minutes_widens_backwards_within_pitr_then_forwards():
    end = YESTERDAY + timedelta(days=1)
    short = ExportWindow(INCREMENTAL_EXPORT, end - timedelta(minutes=5), end)
    assert short.too_short
    # Point-in-time recovery reaches back far enough: backwards only.
    assert widen_to_minimum(short, end - timedelta(hours=2)) == ExportWindow(INCREMENTAL_EXPORT, end - timedelta(minutes=15), end)
    # Turned on 8 minutes before the day's end: back to that moment, then forwards to 15 minutes.
    turned_on = end - timedelta(minutes=8)
    assert widen_to_minimum(short, turned_on) == ExportWindow(INCREMENTAL_EXPORT, turned_on, turned_on + timedelta(minutes=15))
    # Nothing known of its reach: forwards only.
    assert widen_to_minimum(short, None) == ExportWindow(INCREMENTAL_EXPORT, short.start, short.start + timedelta(minutes=15))
    long_enough = ExportWindow(INCREMENTAL_EXPORT, end - timedelta(minutes=15), end)
    assert not long_enough.too_short and widen_to_minimum(long_enough, None) == long_enough


def start_of(moment: datetime) -> datetime:
    return datetime.combine(moment.date(), datetime.min.time(), tzinfo=UTC)


def test_with_pitr_turned_on_today_a_day_the_full_export_covers_requests_nothing(settings, layout):
    # The settings fixture turned PITR on just now, as `ddb-athena init --yes` does; the full export follows.
    coverage = FullExportCoverage("arn:aws:dynamodb:us-east-1:123456789012:table/orders/export/full", datetime.now(UTC))
    dynamodb = ScriptedExports(settings.client("dynamodb"), ["COMPLETED"])
    logs = []
    record, reused = export(settings, layout, False, coverage=coverage, dynamodb=dynamodb, logs=logs)
    assert dynamodb.requests == [] and not reused
    assert (record.export_type, record.status, record.item_count, record.data_files) == (COVERED, "COMPLETED", 0, [])
    assert record.export_arn == coverage.export_arn and record.export_time == coverage.export_time.isoformat()
    assert any("no export needed" in line for line in logs)
    assert load_record(settings.client("s3"), layout, YESTERDAY.date().isoformat()) == record
    # A re-run finds it covered again; a requested bootstrap still takes a full export.
    assert export(settings, layout, False, coverage=coverage, dynamodb=dynamodb)[0] == record and dynamodb.requests == []
    seed_orders(settings, 2)
    bootstrap, _ = export(settings, layout, True, coverage=coverage)
    assert bootstrap.export_type == FULL_EXPORT and bootstrap.attempt == 1 and bootstrap.item_count == 2


def test_with_pitr_turned_on_today_the_day_of_the_full_export_exports_from_its_time_to_the_day_end(settings, layout):
    taken = datetime.now(UTC)  # after PITR was turned on, as on a new deployment
    day = start_of(taken)
    dynamodb = ScriptedExports(settings.client("dynamodb"), ["COMPLETED"])
    logs = []
    next_night = day + timedelta(days=1, hours=2)
    record, _ = export(settings, layout, False, day=day, coverage=FullExportCoverage("arn:full", taken), dynamodb=dynamodb, logs=logs, now=next_night)
    (request,) = dynamodb.requests
    assert request["IncrementalExportSpecification"]["ExportFromTime"] == taken
    assert request["IncrementalExportSpecification"]["ExportToTime"] == day + timedelta(days=1)
    assert (record.window_start, record.window_end) == (taken.isoformat(), (day + timedelta(days=1)).isoformat())
    assert any("covered by full export arn:full: exporting the rest of it" in line for line in logs)


def test_a_full_export_minutes_before_the_day_end_widens_the_window_backwards_and_says_so(settings, layout):
    day = start_of(NOW) + timedelta(days=2)
    taken = day + timedelta(days=1) - timedelta(minutes=5)
    dynamodb = ScriptedExports(settings.client("dynamodb"), ["COMPLETED"])
    logs = []
    export(settings, layout, False, day=day, coverage=FullExportCoverage("arn:full", taken), dynamodb=dynamodb, logs=logs, now=day + timedelta(days=1, hours=2))
    (request,) = dynamodb.requests
    window = request["IncrementalExportSpecification"]
    assert (window["ExportFromTime"], window["ExportToTime"]) == (day + timedelta(days=1) - timedelta(minutes=15), day + timedelta(days=1))
    assert any("shorter than the 15 minutes" in line and "widened" in line for line in logs)


def test_a_full_export_lists_data_when_there_is_no_manifest_and_a_rerun_reuses_it(settings, layout):
    seed_orders(settings, 7)
    logs = []
    record, reused = export(settings, layout, True, logs=logs)
    assert not reused and record.status == "COMPLETED" and record.item_count == 7 and not record.from_manifest
    assert len(record.data_files) == 1 and record.data_bytes > 0 and record.data_files[0].startswith(record.s3_prefix)
    assert any("no manifest-summary.json" in line for line in logs)
    assert load_record(settings.client("s3"), layout, YESTERDAY.date().isoformat()) == record

    again, reused = export(settings, layout, True)
    assert reused and again == record
    # A full export serves a re-run even once the table is loaded (it would now ask for an incremental one).
    assert export(settings, layout, False)[1]
    assert len(settings.client("dynamodb").list_exports(TableArn=table_arn(settings))["ExportSummaries"]) == 1


def table_arn(settings):
    return settings.client("dynamodb").describe_table(TableName=settings.dynamodb_tables["orders"])["Table"]["TableArn"]


def test_an_incremental_request_covers_the_day_with_new_images_and_a_token_derived_from_the_partition(settings, layout):
    pitr_holds_since(settings, NOW - timedelta(days=30))
    dynamodb = ScriptedExports(settings.client("dynamodb"), ["COMPLETED"])
    record, _ = export(settings, layout, False, dynamodb=dynamodb)
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
        export(settings, layout, True, dynamodb=failing)
    # The retry finds the recorded export FAILED, then its own new export completes.
    retry = ScriptedExports(settings.client("dynamodb"), ["FAILED", "COMPLETED"])
    record, reused = export(settings, layout, True, dynamodb=retry)
    assert not reused and record.attempt == 2 and record.s3_prefix.endswith("attempt-2/") and len(retry.requests) == 1
    assert record.client_token != failing.requests[0]["ClientToken"]


def test_a_rerun_after_cleanup_requests_a_new_export(settings, layout):
    seed_orders(settings, 2)
    record, _ = export(settings, layout, True)
    for key in record.all_files:
        settings.client("s3").delete_object(Bucket=settings.bucket, Key=key)
    again, reused = export(settings, layout, True)
    assert not reused and again.attempt == 2 and again.item_count == 2


def test_waiting_logs_status_and_elapsed_time_and_gives_up_at_the_timeout(settings, layout):
    seed_orders(settings, 1)
    slow = ScriptedExports(settings.client("dynamodb"), ["IN_PROGRESS", "IN_PROGRESS", "COMPLETED"])
    logs = []
    record, _ = export(settings, layout, True, dynamodb=slow, logs=logs)
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
        export(settings, layout, False)
    today = datetime.combine(NOW.date(), datetime.min.time(), tzinfo=UTC)
    with pytest.raises(ExportError, match="has not closed yet"):
        export(settings, layout, False, day=today)
    with pytest.raises(ExportError, match="not between 15 minutes and 24 hours"):
        check_preconditions(
            dynamodb,
            settings.client("s3"),
            settings.dynamodb_tables["orders"],
            layout,
            ExportWindow(INCREMENTAL_EXPORT, YESTERDAY, YESTERDAY + timedelta(minutes=10)),
            NOW,
        )
    with pytest.raises(ExportError, match="not between 15 minutes and 24 hours"):
        check_preconditions(
            dynamodb,
            settings.client("s3"),
            settings.dynamodb_tables["orders"],
            layout,
            ExportWindow(INCREMENTAL_EXPORT, YESTERDAY - timedelta(days=1), YESTERDAY + timedelta(minutes=1)),
            NOW,
        )
    dynamodb.update_continuous_backups(TableName=settings.dynamodb_tables["orders"], PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": False})
    with pytest.raises(ExportError, match="Point-in-time recovery is off.*update-continuous-backups"):
        export(settings, layout, True)
    with pytest.raises(ExportError, match="bucket 'missing-bucket' does not exist"):
        export(settings, SourceLayout("missing-bucket", "orders_export"), True)
    with pytest.raises(ExportError, match="table 'nope' does not exist"):
        export_partition(dynamodb, settings.client("s3"), layout, "nope", "2026-11-01", YESTERDAY, NOW, True, None, timedelta(1), 1, print)
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
