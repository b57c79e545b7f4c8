"""The bill `make bench-cost` prints: each request priced in the class AWS bills it in and on the line of the files it
touched, what the local stack makes and a deployment does not kept apart, and every price dated and sourced."""

import re

import pytest

from ddb_athena_bench.bill import EMPTY_PAGES, FLOOR_LINES, HANDOVER_OVERLAP_SECONDS, Task, bill, classify, floor_usd, within_target
from ddb_athena_bench.prices import PRICES


@pytest.mark.parametrize(
    ("step", "kind", "expected"),
    [
        ("capture", "s3 PutObject books_source/changes/", ("change files", "PUT")),
        ("merge", "s3 GetObject books_source/changes/", ("change files", "GET")),
        ("capture", "s3 PutObject books_source/_checkpoints/", ("checkpoints", "PUT")),
        ("merge", "s3 PutObject books_source/_manifests/", ("commit manifests", "PUT")),
        ("between", "s3 PutObject _writer_leases/", ("writer lease", "PUT")),
        ("merge", "s3 GetObject books/data", ("Iceberg commits", "GET")),
        ("merge", "s3 PutObject books_tombstones/metadata", ("Iceberg commits", "PUT")),
        ("compaction", "s3 GetObject books/data", ("compaction", "GET")),
        ("maintenance", "s3 PutObject books/metadata", ("maintenance", "PUT")),
        ("checks", "s3 ListObjects books_source/changes/", ("checks", "PUT")),
        # Hadoop's catalog and S3A on the warehouse: a deployment's Glue catalog and S3FileIO make none of these.
        ("merge", "s3 CopyObject books/metadata", ("Iceberg commits", "not on AWS")),
        ("merge", "s3 HeadObject books/data", ("Iceberg commits", "not on AWS")),
        ("merge", "s3 ListObjects books/metadata", ("Iceberg commits", "not on AWS")),
        ("merge", "s3 PutObject books/metadata version-hint", ("Iceberg commits", "not on AWS")),
        ("merge", "s3 PutObject books/data marker", ("Iceberg commits", "not on AWS")),
        # S3A reads the change files on AWS too: its probes there are billed.
        ("merge", "s3 HeadObject books_source/changes/", ("change files", "GET")),
        ("merge", "s3 DeleteObjects (bucket)", ("deletes", "free")),
        ("capture", "dynamodbstreams GetRecords", ("Streams", "GetRecords")),
        ("capture", EMPTY_PAGES, ("Streams", "free")),
        ("capture", "dynamodbstreams GetShardIterator", ("Streams", "free")),
        ("checks", "dynamodb DescribeTable", ("dynamodb", "free")),
    ],
)
def test_each_request_is_priced_in_its_class_on_the_line_of_its_files(step, kind, expected):
    assert classify(step, kind) == expected


def _measurement(**changes) -> dict:
    measurement = {
        "measured_seconds": 3600.0,
        "shards": 4,
        "requests_by_step": {
            "capture": {"s3 PutObject books_source/changes/": 1000, "dynamodbstreams GetRecords": 2000, EMPTY_PAGES: 500},
            "merge": {"s3 GetObject books/data": 10_000, "s3 CopyObject books/metadata": 360},
        },
        "iceberg_commits": 720,
        "recorded_cycles": 360,
        "stored_bytes": 2e9,
        "table_bytes": 1e9,
    }
    return {**measurement, **changes}


def test_an_hour_measured_is_priced_for_a_month_line_by_line():
    result = bill(_measurement(), Task(1, 3))
    lines = {name: usd for name, usd, _ in result.lines}
    # 730 hours a month: an hour's 1,000 PUTs are 730,000, at 0.005 USD a thousand.
    assert lines["S3 PUT requests: change files"] == pytest.approx(730_000 * 0.005 / 1000)
    assert lines["S3 GET requests: Iceberg commits"] == pytest.approx(7_300_000 * 0.0004 / 1000)
    assert lines["Streams GetRecords"] == pytest.approx(1_460_000 * 0.02 / 100_000)
    assert lines["S3 storage"] == pytest.approx(2 * 0.023)
    # The rename of a commit's metadata is the Hadoop catalog's: shown, not billed.
    assert result.not_on_aws == {"Iceberg commits": pytest.approx(262_800)}
    assert not any("CopyObject" in name for name in lines)
    # 730 hours, and at each hourly handover the next run's task beside it (HANDOVER_OVERLAP_SECONDS, measured).
    hours = 730 * (1 + HANDOVER_OVERLAP_SECONDS / 3600)
    assert result.task_options["on demand, Graviton"] == pytest.approx((0.03238 + 3 * 0.00356) * hours)
    assert result.task_options["Spot, Graviton"] == pytest.approx(0.3 * (0.03238 + 3 * 0.00356) * hours)
    assert result.total("on demand, x86") == pytest.approx(result.without_task + (0.04048 + 3 * 0.004445) * hours)
    assert lines["public IPv4 (the task's address)"] == pytest.approx(0.005 * hours)


def test_with_the_capture_lambda_the_stream_reads_and_the_runs_change_files_give_way_to_the_lambdas():
    lines = {name: usd for name, usd, _ in bill(_measurement(), Task(1, 3), capture="lambda").lines}
    assert "Streams GetRecords" not in lines and "S3 PUT requests: change files" not in lines
    invocations = 4 * 730 * 3600 / 5  # one per shard per 5-s batching window
    assert lines["S3 PUT requests: change files (the Lambda's)"] == pytest.approx(invocations * 0.005 / 1000)
    assert lines["capture Lambda"] > invocations * 0.2 / 1e6


def test_the_floor_is_the_task_and_the_lines_a_cycle_cannot_do_without():
    measurement = _measurement()
    measurement["requests_by_step"]["maintenance"] = {"s3 GetObject books/metadata": 50_000}
    measurement["requests_by_step"]["between"] = {"s3 PutObject _writer_leases/": 360}
    result = bill(measurement, Task(0.5, 2))
    lines = {name: usd for name, usd, _ in result.lines}
    floor = floor_usd(result, "on demand, Graviton")
    assert floor == pytest.approx(result.task_options["on demand, Graviton"] + sum(lines[name] for name in FLOOR_LINES if name in lines))
    # Upkeep and the lease are above the floor: what tuning them could save.
    assert result.total("on demand, Graviton") - floor == pytest.approx(
        lines["S3 GET requests: maintenance"] + lines["S3 PUT requests: writer lease"] + lines["CloudWatch Logs"] + lines["S3 PUT requests: change files"]
    )


def test_a_task_is_a_size_fargate_offers():
    assert Task(0.5, 3).label == "0.5 vCPU / 3 GB"
    with pytest.raises(ValueError, match="no task of 0.5 vCPU and 8 GB"):
        Task(0.5, 8)


def test_targets_are_the_firehose_quote_at_30_seconds_and_20_usd_at_2_minutes():
    assert within_target(33.0, 29.0) == "meets"
    assert within_target(34.0, 29.0) == "misses"
    assert within_target(21.0, 100.0) == "misses"
    assert within_target(19.0, 100.0) == "meets"
    assert within_target(5.0, 130.0) == "too slow"


def test_every_price_says_where_it_was_read_and_when():
    for name, item in PRICES.items():
        assert item.usd > 0, name
        assert item.source.startswith("https://aws.amazon.com/"), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", item.as_of), name


def test_tables_beside_books_add_their_catalog_loads_logs_and_streams_to_the_bill():
    alone, beside = _measurement(), _measurement(tables_beside=[{"table": f"small_{n}", "rate": 2, "writes": 7200} for n in (1, 2, 3)])
    lines = [{name: usd for name, usd, _ in bill(measured, Task(0.5, 3), capture="lambda").lines} for measured in (alone, beside)]
    # Four tables (each with its tombstones) loaded from the catalog instead of one; the same commits counted.
    assert lines[1]["Glue Data Catalog"] > lines[0]["Glue Data Catalog"]
    assert lines[1]["CloudWatch Logs"] == pytest.approx(4 * lines[0]["CloudWatch Logs"])
    # Each table beside has a stream of its own: one shard more each for the Lambda.
    assert lines[1]["S3 PUT requests: change files (the Lambda's)"] == pytest.approx(lines[0]["S3 PUT requests: change files (the Lambda's)"] * 7 / 4)
