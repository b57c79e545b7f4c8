"""The bill `make bench-cost` prints: each request priced in the class AWS bills it in and on the line of the files it
touched, what the local stack makes and a deployment does not kept apart, and every price dated and sourced."""

import re

import pytest

from ddb_athena_bench.bill import (
    EMPTY_PAGES,
    FLOOR_LINES,
    HANDOVER_OVERLAP_SECONDS,
    SPOT,
    SPOT_WORSE,
    Line,
    Task,
    against_targets,
    bill,
    classify,
    floor_usd,
    free_column,
    nat_alternative,
    platform_bill,
)
from ddb_athena_bench.prices import PRICES, price


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
        "items": 1_000_000,
        "rate": 230.0,
    }
    return {**measurement, **changes}


def test_an_hour_measured_is_priced_for_a_month_line_by_line():
    result = bill(_measurement(), Task(1, 3))
    lines = {line.name: line.usd for line in result.lines}
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
    assert result.task_options[SPOT] == pytest.approx(price("fargate_spot_share") * (0.03238 + 3 * 0.00356) * hours)
    assert result.task_options[SPOT_WORSE] == pytest.approx(0.5 * (0.03238 + 3 * 0.00356) * hours)
    assert result.total("on demand, x86") == pytest.approx(result.without_task + (0.04048 + 3 * 0.004445) * hours)
    assert lines["public IPv4 (the task's address)"] == pytest.approx(0.005 * hours)


def test_with_the_capture_lambda_the_stream_reads_and_the_runs_change_files_give_way_to_the_lambdas():
    lines = {line.name: line.usd for line in bill(_measurement(), Task(1, 3), capture="lambda").lines}
    assert "Streams GetRecords" not in lines and "S3 PUT requests: change files" not in lines
    invocations = 4 * 730 * 3600 / 5  # one per shard per 5-s batching window
    assert lines["S3 PUT requests: change files (the Lambda's)"] == pytest.approx(invocations * 0.005 / 1000)
    assert lines["capture Lambda"] > invocations * 0.2 / 1e6


def test_the_floor_is_the_task_and_the_lines_a_cycle_cannot_do_without():
    measurement = _measurement()
    measurement["requests_by_step"]["maintenance"] = {"s3 GetObject books/metadata": 50_000}
    measurement["requests_by_step"]["between"] = {"s3 PutObject _writer_leases/": 360}
    result = bill(measurement, Task(0.5, 2))
    lines = {line.name: line.usd for line in result.lines}
    floor = floor_usd(result, "on demand, Graviton")
    assert floor == pytest.approx(result.task_options["on demand, Graviton"] + sum(lines[name] for name in FLOOR_LINES if name in lines))
    # Upkeep, the lease, logs and the daily check's task are above the floor: what tuning them could save.
    above = ("S3 GET requests: maintenance", "S3 PUT requests: writer lease", "CloudWatch Logs", "compute logs in S3", "S3 PUT requests: change files")
    assert result.total("on demand, Graviton") - floor == pytest.approx(sum(lines[name] for name in above) + lines["key parity runs' tasks"])


def test_a_task_is_a_size_fargate_offers():
    assert Task(0.5, 3).label == "0.5 vCPU / 3 GB"
    with pytest.raises(ValueError, match="no task of 0.5 vCPU and 8 GB"):
        Task(0.5, 8)


def test_targets_are_the_projects_goals_each_judged_where_the_p95_is_within_it():
    result = bill(_measurement(), Task(0.5, 3))

    def priced(spot: float, on_demand: float):
        return lambda _, option: {SPOT: spot, "on demand, Graviton": on_demand}[option]

    assert against_targets(result, 25.0, priced(19.0, 33.0)) == (
        "meets 20 USD on Spot at p95 <= 60 s; meets 30 USD on Spot at p95 <= 30 s; meets 33.46 USD on demand at p95 <= 60 s"
    )
    assert against_targets(result, 45.0, priced(25.0, 34.0)) == "misses 20 USD on Spot at p95 <= 60 s; misses 33.46 USD on demand at p95 <= 60 s"
    assert against_targets(result, 25.0, priced(29.0, 40.0)).split("; ")[1] == "meets 30 USD on Spot at p95 <= 30 s"
    assert against_targets(result, 61.0, priced(1.0, 1.0)) == "too slow for every target (p95 over 60 s)"
    # By default, the cell's whole bill.
    assert against_targets(result, 45.0).startswith("meets" if result.total(SPOT) <= 20 else "misses")


def test_every_price_says_where_it_was_read_and_when():
    for name, item in PRICES.items():
        assert item.usd > 0, name
        assert item.source.startswith("https://aws.amazon.com/"), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", item.as_of), name


def test_tables_beside_books_add_their_catalog_loads_logs_and_streams_to_the_bill():
    alone, beside = _measurement(), _measurement(tables_beside=[{"table": f"small_{n}", "rate": 2, "writes": 7200} for n in (1, 2, 3)])
    lines = [{line.name: line.usd for line in bill(measured, Task(0.5, 3), capture="lambda").lines} for measured in (alone, beside)]
    # Four tables (each with its tombstones) loaded from the catalog instead of one; the same commits counted.
    assert lines[1]["Glue Data Catalog"] > lines[0]["Glue Data Catalog"]
    assert lines[1]["CloudWatch Logs"] == pytest.approx(4 * lines[0]["CloudWatch Logs"])
    # Each table beside has a stream of its own: one shard more each for the Lambda.
    assert lines[1]["S3 PUT requests: change files (the Lambda's)"] == pytest.approx(lines[0]["S3 PUT requests: change files (the Lambda's)"] * 7 / 4)


def test_an_always_free_allowance_covers_a_month_once_whichever_lines_share_it():
    lines = [
        Line("a", 0.30, "", (("cloudwatch_logs_ingest_gb", 4.0),)),
        Line("b", 0.20, "", (("cloudwatch_logs_ingest_gb", 4.0),)),
        Line("c", 0.10, "", ()),
    ]
    # 5 GB free: 4 of the first line's, 1 of the second's.
    assert free_column(lines) == pytest.approx([4 * 0.50, 1 * 0.50, 0.0])


def test_each_run_a_schedule_or_sensor_starts_is_a_task_on_the_bill():
    measurement = _measurement()
    result = bill(measurement, Task(0.5, 3))
    lines = {line.name: line.usd for line in result.lines}
    # A daily key parity run a streamed table: a task of the runs' size for its start, its work and its scan, and its address.
    work = 61.3 + 1e9 / 4096 * 0.5 / 1000
    hours = 30.4 * (90 + work) / 3600
    assert lines["key parity runs' tasks"] == pytest.approx(hours * (0.5 * 0.03238 + 3 * 0.00356 + 0.005))
    bigger = {line.name: line.usd for line in bill({**measurement, "items": 10_000_000, "table_bytes": 1e10}, Task(0.5, 3)).lines}
    assert bigger["key parity runs' tasks"] > 5 * lines["key parity runs' tasks"]
    assert "cleanup runs' tasks" not in lines  # the sync's own capture keeps its change files on its disk
    assert lines["freshness checks"] == 0.0
    # With the capture Lambda, a cleanup run every 5 minutes: a task of Fargate's smallest size on Spot, a minute and a half each.
    with_lambda = {line.name: line.usd for line in bill(measurement, Task(0.5, 3), capture="lambda").lines}
    cleanups = 730 * 3600 / 300
    hours = cleanups * 100 / 3600
    assert with_lambda["cleanup runs' tasks"] == pytest.approx(hours * (price("fargate_spot_share") * (0.25 * 0.03238 + 0.5 * 0.00356) + 0.005))


def test_compute_log_uploads_follow_the_deployed_instances_interval(monkeypatch):
    from ddb_athena_bench import bill as billing

    def lines_with(interval: int) -> dict:
        instance = billing.deployed_instance()
        instance["compute_logs"]["config"]["upload_interval"] = interval
        monkeypatch.setattr(billing, "deployed_instance", lambda: instance)
        return {line.name: line for line in bill(_measurement(), Task(0.5, 3)).lines}

    every_minute, every_ten = lines_with(60), lines_with(600)
    # stdout and stderr every minute: 87,600 uploads a month.
    assert every_minute["compute logs in S3"].how.startswith("87,600 uploads")
    assert every_minute["compute logs in S3"].usd > 5 * every_ten["compute logs in S3"].usd


def test_every_job_the_schedules_and_sensors_start_is_priced():
    from ddb_athena.definitions import defs
    from ddb_athena_bench.bill import priced_as

    repository = defs.get_repository_def()
    started = {schedule.job_name for schedule in repository.schedule_defs}
    started |= {target.job_name for sensor in repository.sensor_defs for target in sensor.targets}
    assert started, "no schedule or sensor starts a run"
    assert {name for name in started if priced_as(name) is None} == set()
    assert priced_as("books_sync").startswith("the task") and priced_as("a_new_job") is None


def test_private_subnets_price_a_nat_gateway_and_the_streams_traffic_through_it():
    hours = 730.0
    lines = {line.name: line.usd for line in nat_alternative(_measurement(), hours)}
    assert lines["NAT gateway, one Availability Zone"] == pytest.approx(0.045 * 730)
    # 230 writes a second of 1,000 bytes, both images: 1,209 GB a month at 0.045 USD.
    assert lines["the stream's records through it"] == pytest.approx(230 * 2 * 1000 * 730 * 3600 / 1e9 * 0.045)
    assert lines["no address for the sync's and the platform's tasks"] == pytest.approx(-0.005 * 1460)


def test_the_platform_bill_has_its_database_secret_its_alarms_its_image_and_its_log():
    lines = {line.name: line for line in platform_bill()}
    secret = lines["its master password: an RDS-managed secret"]
    assert 0.40 < secret.usd < 0.41 and "read at each platform start" in secret.how
    alarms = lines["alarms on the platform task, the database and the alerts' delivery"]
    assert alarms.usd == pytest.approx(0.40) and alarms.free_units == (("cloudwatch_alarm_month", 4),)
    assert lines["the image in ECR"].usd > 0 and "GB compressed" in lines["the image in ECR"].how
    assert lines["its log in CloudWatch"].usd > 0
