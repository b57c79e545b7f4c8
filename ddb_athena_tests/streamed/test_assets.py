"""books_source and books_iceberg materialized by books_sync runs, against the emulator and local Spark."""

import gc
import os
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from dagster import AssetKey, DagsterInstance

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lake.change_merge import STREAM_POSITIONS_PROPERTY
from ddb_athena.lake.commit_properties import empty_commit, newest_published
from ddb_athena.lake.maintenance import CompactionResult
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed import assets
from ddb_athena.streamed import cycle as books_cycle
from ddb_athena.streamed.capture import bootstrap
from ddb_athena.streamed.capture.change_files import list_change_files, list_keys
from ddb_athena.streamed.capture.checkpoints import positions_from_json, positions_json
from ddb_athena.streamed.capture.commit_manifests import committed_files
from ddb_athena.streamed.capture.lambda_handler import handle_stream_event
from ddb_athena_tests import aws_calls
from ddb_athena_tests.books_and_orders import streamed_upkeep
from ddb_athena_tests.dagster_helpers import check_results, local_resources, materialization_metadata, materializations_metadata, sync_books
from ddb_athena_tests.fake_clock import SkippingClock
from ddb_athena_tests.lake.helpers import plant_file
from ddb_athena_tests.streamed.test_cycle import stream_records


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def run_clock(monkeypatch) -> SkippingClock:
    """The asset's sync runs go by a clock that skips their waits: a run's minutes pass in the time of its cycles."""
    clock = SkippingClock()
    monkeypatch.setattr("ddb_athena.streamed.assets.RUN_CLOCK", clock)
    return clock


@contextmanager
def simulator_writing(simulator: BookSimulator, clock: SkippingClock, every_seconds: float = 0.3) -> Iterator[None]:
    """Live traffic beside a run paced by `clock`: the simulator adds a book every `every_seconds` of real time and one in
    each of the run's waits, which the clock skips (the wait returns once it is written). Every cycle then finds a
    change, whether the one before it overran its interval or waited, however fast this machine is. Never an update:
    one that sets the value an item already has leaves no stream record. Every write is the writer thread's, as an
    operator's simulator makes them (tests/deploy check each call against the role of the code that makes it)."""
    requests: queue.Queue[threading.Event | None] = queue.Queue()

    def write():
        while True:
            try:
                written = requests.get(timeout=every_seconds)
            except queue.Empty:
                written = threading.Event()  # its own pace: nobody waits for it
            if written is None:
                return
            simulator.insert()
            written.set()

    def during_wait():
        written = threading.Event()
        requests.put(written)
        written.wait()

    writer = threading.Thread(target=write)
    writer.start()
    clock.during_each_wait = during_wait
    try:
        yield
    finally:
        clock.during_each_wait = lambda: None
        requests.put(None)
        writer.join()


def assert_same_keys(spark, settings, dynamodb):
    iceberg = [row[0] for row in spark.table(f"{settings.namespace}.books").select(declared("books").spec.key.name).collect()]
    pages = dynamodb.get_paginator("scan").paginate(TableName=settings.dynamodb_tables["books"], ConsistentRead=True)
    assert sorted(iceberg) == sorted(item["id"]["S"] for page in pages for item in page["Items"])


def test_first_sync_bootstraps_then_minute_syncs_apply_changes(spark, settings, instance):
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    for _ in range(12):
        simulator.insert()

    first = sync_books(instance)
    source = materialization_metadata(first, "books_source")
    # The scan; the stream's 12 inserts are older than it, which has seen them: none is applied after it.
    assert source["bootstrap_items"] == 12 and source["records_captured"] == 0
    merged = materialization_metadata(first, "books_iceberg")
    # The snapshot's seal and its one part.
    assert merged["rows_written"] == 12 and merged["files_consumed"] == 2 and merged["bootstrap_file"]
    assert merged["snapshot_id"] and merged["commit_manifest"].startswith("books_source/_manifests/")
    for number in ("lag_seconds", "duration_seconds", "rows_removed", "records_consumed"):
        assert isinstance(merged[number], (int, float))  # numbers, so the UI plots them

    for _ in range(30):
        simulator.step()
    second = sync_books(instance)
    assert materialization_metadata(second, "books_source")["bootstrap_items"] == 0
    merged = materialization_metadata(second, "books_iceberg")
    assert merged["bootstrap_file"] is None and merged["rows_written"] + merged["rows_removed"] > 0
    assert_same_keys(spark, settings, dynamodb)


def test_a_requested_bootstrap_recovers_from_a_stream_gap(spark, settings, instance):
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    simulator.insert()
    sync_books(instance)
    break_checkpoints(spark, settings)
    simulator.insert()
    with pytest.raises(Exception, match="bootstrap"):
        sync_books(instance)
    recovered = sync_books(instance, config={"bootstrap": True})
    assert materialization_metadata(recovered, "books_source")["bootstrap_items"] == 2
    assert spark.table(f"{settings.namespace}.books").count() == 2


def snapshot_count(spark, settings) -> int:
    return spark.table(f"{settings.namespace}.books.snapshots").count()


def test_one_run_cycles_with_its_warm_session_and_records_every_cycle_with_its_checks(spark, settings, instance, run_clock, tmp_path, monkeypatch):
    # The run's held change files in a folder of this test's: none is left once the run ends, whether or not the
    # collector ran (a run worker may exit before it does).
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    for _ in range(5):
        simulator.insert()
    sync_books(instance)  # the bootstrap

    calls_before = len(aws_calls.recorded)
    with simulator_writing(simulator, run_clock):
        # Long enough for three cycles even on a loaded machine, where one may take 15 s; the waits between them are
        # skipped (`run_clock`), so a cycle every 4 s costs only the cycles: about ten on an idle machine.
        gc.disable()
        try:
            result = sync_books(instance, config={"run_minutes": 1, "merge_interval_seconds": 4}, longest_merge_interval_seconds=4)
            assert [path.name for path in scratch.glob("ddb_athena_changes_*")] == []
        finally:
            gc.enable()
    cycles = materializations_metadata(result, "books_iceberg")
    assert len(cycles) >= 3 and [cycle["cycle"] for cycle in cycles] == sorted(cycle["cycle"] for cycle in cycles)
    assert len(materializations_metadata(result, "books_source")) == len(cycles)
    assert sum(cycle["records_consumed"] for cycle in cycles) > 0
    # The checks that list S3 run on the first recorded cycle and then every few, not every cycle.
    for check in ("books_backlog", "books_quarantine_empty"):
        evaluations = [e for e in result.get_asset_check_evaluations() if e.check_name == check]
        assert 1 <= len(evaluations) < len(cycles) and all(e.passed for e in evaluations), check
    # No check of the cycles reads the whole Iceberg table: unique keys are the daily run's, with parity.
    assert "books_unique_id" not in {e.check_name for e in result.get_asset_check_evaluations()}
    # No check of the cycles reads the user's DynamoDB table: the key parity check is a daily run of its own.
    item_reads = {"Scan", "Query", "GetItem", "BatchGetItem"}
    run_calls = [call for call in aws_calls.recorded[calls_before:] if call.principal == aws_calls.DAGSTER_RUNS]
    assert run_calls and not [call for call in run_calls if call.operation in item_reads]
    assert "books_row_count_parity" not in {e.check_name for e in result.get_asset_check_evaluations()}

    sync_books(instance)  # what the writer wrote after the run's last cycle
    assert_same_keys(spark, settings, dynamodb)


def test_the_runs_own_capture_writes_nothing_to_s3_but_its_lease_and_lists_the_change_prefix_once_a_run(spark, settings, instance, run_clock):
    """Its change files on local disk, its positions in the commit: no change file, checkpoint or manifest in S3."""
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    simulator.insert()
    sync_books(instance)  # the bootstrap
    layout = SourceLayout(settings.bucket, "books_source")
    calls_before = len(aws_calls.recorded)
    simulator.step()  # a change waiting for the first cycle
    with simulator_writing(simulator, run_clock):
        result = sync_books(instance, config={"run_minutes": 0.15, "merge_interval_seconds": 1}, longest_merge_interval_seconds=1)
    runs = [call for call in aws_calls.recorded[calls_before:] if call.principal == aws_calls.DAGSTER_RUNS]
    cycles = int(next(e.user_message for e in instance.all_logs(result.run_id) if e.user_message.startswith("Sync run done after")).split()[4])
    merges = len(materializations_metadata(result, "books_iceberg"))
    assert cycles >= 2 and merges >= 2
    written = [call.param("Key") for call in runs if call.operation == "PutObject"]
    assert written and all(key.startswith("_writer_leases/") for key in written), written
    listings = [call.param("Prefix") for call in runs if call.operation == "ListObjectsV2"]
    # The run's start lists the change prefix twice (a sealed snapshot waiting; a file the capture Lambda or a bootstrap
    # left, for its first merge); every other listing is a backlog check's, evaluated every few merges and after each
    # capture that stopped behind the stream.
    backlog_checks = sum(1 for evaluation in result.get_asset_check_evaluations() if evaluation.check_name == "books_backlog")
    assert backlog_checks <= 1 + -(-merges // 6) + sum(1 for m in materializations_metadata(result, "books_source") if m.get("stream_caught_up") is False)
    assert listings.count(layout.changes_prefix) == 2 + backlog_checks, (cycles, backlog_checks, listings)
    sync_books(instance)  # the writes made after its last cycle: from where its commits left the stream
    assert_same_keys(spark, settings, dynamodb)


def test_a_quiet_table_backs_off_to_the_longest_interval_and_a_busy_one_keeps_the_interval(spark, settings, instance, run_clock):
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    simulator.insert()
    sync_books(instance)  # the bootstrap
    quiet = sync_books(instance, config={"run_minutes": 0.25, "merge_interval_seconds": 1}, longest_merge_interval_seconds=4)
    messages = [entry.user_message for entry in instance.all_logs(quiet.run_id)]
    assert "Nothing to merge: cycles back off, up to 4 s apart" in messages
    (done,) = [message for message in messages if message.startswith("Sync run done after")]
    # Nothing to merge: 1, 2, 4, 4, ... s apart over 15 s (at most 6 cycles), not one a second.
    assert int(done.split()[4]) <= 6, done

    simulator.step()  # a change waiting for the busy run's first cycle, the writer's next in its first wait
    with simulator_writing(simulator, run_clock):
        busy = sync_books(instance, config={"run_minutes": 0.15, "merge_interval_seconds": 1}, longest_merge_interval_seconds=4)
    # Every cycle finds changes: the interval (or a cycle's own length, when longer), never the back-off.
    assert len(materializations_metadata(busy, "books_iceberg")) >= 2
    assert not [entry for entry in instance.all_logs(busy.run_id) if entry.user_message.startswith("Nothing to merge")]
    sync_books(instance)
    assert_same_keys(spark, settings, dynamodb)


def spark_job_ids(spark) -> set[int]:
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)  # the tracker learns of jobs asynchronously
    return set(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def test_an_idle_cycle_runs_no_spark_job_commits_no_snapshot_and_is_recorded_once_a_minute(spark, settings, instance, run_clock):
    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert()
    sync_books(instance)
    snapshots, jobs = snapshot_count(spark, settings), spark_job_ids(spark)
    result = sync_books(instance, config={"run_minutes": 0.05, "merge_interval_seconds": 1})
    assert spark_job_ids(spark) == jobs
    assert snapshot_count(spark, settings) == snapshots
    (idle,) = materializations_metadata(result, "books_iceberg")  # ~3 idle cycles, the first one recorded
    assert idle["idle"] is True and idle["files_consumed"] == 0 and idle["commit_manifest"] is None
    assert {e.check_name for e in result.get_asset_check_evaluations()} == {"books_backlog", "books_quarantine_empty"}


def test_a_stop_during_a_run_ends_it_after_the_cycle_in_progress(spark, settings, instance, monkeypatch):
    simulator = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"])
    simulator.insert()
    sync_books(instance)
    simulator.insert()

    # As a run launcher terminating the run does: SIGTERM (which Dagster turns into an interrupt of the step),
    # arriving while a cycle merges, whatever the machine's speed.
    merge = books_cycle.merge_change_files

    def merge_while_terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return merge(*args, **kwargs)

    monkeypatch.setattr(books_cycle, "merge_change_files", merge_while_terminated)
    result = sync_books(instance, config={"run_minutes": 30, "merge_interval_seconds": 1}, raise_on_error=False)
    (failure,) = result.get_step_failure_events()
    assert failure.step_failure_data.error.cls_name == "DagsterExecutionInterruptedError"
    # A failed run's result holds no materializations; the instance has every cycle's, recorded as it ended.
    records = instance.fetch_materializations(AssetKey("books_iceberg"), limit=100).records
    cycles = [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records if r.run_id == result.run_id]
    assert cycles and cycles[-1]["rows_written"] == 1  # the cycle in progress finished and committed
    s3 = settings.client("s3")
    for cycle in cycles:  # and wrote its manifest
        assert cycle["commit_manifest"] is None or s3.head_object(Bucket=settings.bucket, Key=cycle["commit_manifest"])


def test_a_run_killed_after_its_commit_before_its_manifest_is_made_good_by_the_next_run(spark, settings, instance, monkeypatch):
    """Files in S3 (the capture Lambda's): committed, then the run dies before their manifest is written."""
    s3, layout = settings.client("s3"), SourceLayout(settings.bucket, "books_source")
    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert("scanned")
    newest = int(stream_records(settings)[-1]["dynamodb"]["SequenceNumber"])
    sync_books(instance, books_capture="lambda")
    handle_stream_event(lambda_event("after-scan", str(newest + 200), "captured by the Lambda"), s3, layout)

    def killed(*args, **kwargs):
        raise SystemExit("killed after the commit, before the manifest")

    with monkeypatch.context() as patched:
        patched.setattr("ddb_athena.streamed.cycle.write_commit_manifest", killed)
        with pytest.raises(BaseException, match="killed after the commit"):
            sync_books(instance, books_capture="lambda")
    left = set(list_change_files(s3, layout)) - committed_files(s3, layout)
    assert left  # committed, but in no manifest: nothing cleans them up yet

    next_run = materialization_metadata(sync_books(instance, books_capture="lambda"), "books_iceberg")
    assert next_run["files_consumed"] == len(left) and next_run["rows_written"] + next_run["rows_removed"] == 0
    assert next_run["commit_manifest"]  # the next cleanup takes them
    assert {row["id"] for row in spark.table(f"{settings.namespace}.books").collect()} == {"scanned", "after-scan"}


def test_a_run_killed_after_its_commit_before_it_moves_its_positions_resumes_from_the_commits_own(spark, settings, instance, monkeypatch):
    """The run's own capture: the positions are in the commit, so a run that dies right after it has nothing to redo."""
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    simulator.insert()
    sync_books(instance)
    for _ in range(10):
        simulator.step()

    def killed(*args, **kwargs):
        raise SystemExit("killed after the commit, before the run moved its positions")

    with monkeypatch.context() as patched:
        patched.setattr("ddb_athena.streamed.capture.held_changes.HeldChanges.committed", killed)
        with pytest.raises(BaseException, match="killed after the commit"):
            sync_books(instance)
    assert_same_keys(spark, settings, dynamodb)  # the commit is published

    next_run = sync_books(instance)
    assert materialization_metadata(next_run, "books_source")["records_captured"] == 0  # from the committed positions
    assert_same_keys(spark, settings, dynamodb)


def upkeep_run(instance, **sync_options):
    """A streamed_upkeep run (books, and reviews: not created here, skipped), as the upkeep_when_due sensor launches it."""
    return streamed_upkeep.execute_in_process(resources=local_resources(**sync_options), instance=instance)


def maintenance_metadata(result) -> dict:
    (observation,) = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    return {k: v.value for k, v in observation.event_specific_data.asset_observation.metadata.items()}


def test_the_upkeep_run_expires_beside_the_sync_lists_orphans_at_its_first_pass_then_once_per_sweep_interval(spark, settings, instance):
    simulator = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"])
    simulator.insert()
    sync_books(instance)
    simulator.insert()
    books = f"{settings.namespace}.books"

    def upkept(**options) -> dict:
        result = upkeep_run(instance, **options)
        (compact,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "books_files_compact"]
        assert compact.passed and compact.metadata["snapshots"].value >= 2
        return maintenance_metadata(result)

    first = plant_file(spark, books, "left-by-a-crashed-writer.parquet", age_days=5)
    never_swept = upkept()
    assert never_swept["maintenance_orphans_swept"] and never_swept["maintenance_orphan_files_removed"] == 1
    assert not first.exists()
    # It writes no row and rewrites no file: that needs the writer's fence (the sync's compaction and pruning).
    assert never_swept["maintenance_rewritten_data_files"] == 0 and "maintenance_pruned_tombstones" not in never_swept

    second = plant_file(spark, books, "left-by-another-crash.parquet", age_days=5)
    within_a_day = upkept()  # the default sweep interval is 24 hours
    assert not within_a_day["maintenance_orphans_swept"] and "maintenance_orphan_files_removed" not in within_a_day
    assert second.exists()

    interval_gone_by = upkept(orphan_sweep_interval_hours=0.0001)
    assert interval_gone_by["maintenance_orphans_swept"] and interval_gone_by["maintenance_orphan_files_removed"] == 1
    assert not second.exists()
    sync_books(instance)  # the sync, after its table's upkeep, merges as before
    assert_same_keys(spark, settings, settings.client("dynamodb"))


def test_the_upkeep_run_of_a_table_not_created_yet_does_nothing_and_succeeds(spark, settings, instance):
    result = upkeep_run(instance)
    assert result.success and not [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]


def data_files(spark, table: str) -> int:
    return spark.sql(f"SELECT count(*) FROM {table}.files WHERE content = 0").collect()[0][0]


def test_the_sync_run_compacts_the_table_and_its_tombstones_when_their_files_call_for_it_and_expires_nothing(spark, settings, instance):
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    for _ in range(4):
        simulator.insert()
    sync_books(instance)
    for _ in range(2):  # each run commits a data file, a delete file and a tombstone file
        simulator.insert()
        dynamodb.delete_item(TableName=settings.dynamodb_tables["books"], Key={"id": {"S": simulator.live.pop(0)}})
        sync_books(instance)
    books, tombstones = f"{settings.namespace}.books", f"{settings.namespace}.books_tombstones"
    assert data_files(spark, books) >= 3 and data_files(spark, tombstones) == 2

    simulator.insert()
    dynamodb.delete_item(TableName=settings.dynamodb_tables["books"], Key={"id": {"S": simulator.live.pop(0)}})
    # Due after the run's merge: 4 data files, 3 more than the table's size needs; 3 tombstone files, 2 more.
    result = sync_books(instance, compaction_file_threshold=2)
    assert data_files(spark, books) == 1 and data_files(spark, tombstones) == 1
    assert not spark.sql(f"SELECT * FROM {books}.files WHERE content <> 0").count()  # the deletes are applied
    assert not [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]  # no expiry, no orphans
    assert spark.table(tombstones).count() == 3
    assert_same_keys(spark, settings, dynamodb)


def lambda_event(book_id: str, sequence_number: str, name: str) -> dict:
    """A DynamoDB Streams event as Lambda delivers it: one INSERT."""
    return {
        "Records": [
            {
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "dynamodb": {
                    "ApproximateCreationDateTime": 1763780400,
                    "Keys": {"id": {"S": book_id}},
                    "NewImage": {"id": {"S": book_id}, "name": {"S": name}},
                    "SequenceNumber": sequence_number,
                    "StreamViewType": "NEW_AND_OLD_IMAGES",
                },
            }
        ]
    }


def test_with_the_capture_lambda_the_run_merges_its_files_and_never_reads_the_stream(spark, settings, instance):
    s3, layout = settings.client("s3"), SourceLayout(settings.bucket, "books_source")
    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert("scanned")
    newest = int(stream_records(settings)[-1]["dynamodb"]["SequenceNumber"])
    # Older than the first run's scan: superseded by it (the scan sees the table as of then).
    handle_stream_event(lambda_event("before-scan", str(newest - 1), "only in a superseded file"), s3, layout)
    first = materialization_metadata(sync_books(instance, books_capture="lambda"), "books_source")
    assert first["capture"] == "lambda" and first["bootstrap_items"] == 1
    handle_stream_event(lambda_event("after-scan", str(newest + 200), "captured by the Lambda"), s3, layout)
    merged = materialization_metadata(sync_books(instance, books_capture="lambda"), "books_iceberg")
    assert merged["rows_written"] == 1
    rows = {row["id"]: row["name"] for row in spark.table(f"{settings.namespace}.books").collect()}
    assert set(rows) == {"scanned", "after-scan"} and rows["after-scan"] == "captured by the Lambda"
    assert list(list_keys(s3, settings.bucket, layout.checkpoints_prefix)) == []  # the runs never read the stream


def test_with_the_capture_lambda_a_change_written_during_the_bootstrap_scan_applies_on_top(spark, settings, instance, monkeypatch):
    s3, layout = settings.client("s3"), SourceLayout(settings.bucket, "books_source")
    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert("scanned")
    newest = int(stream_records(settings)[-1]["dynamodb"]["SequenceNumber"])
    scan = bootstrap.scan_table

    def scan_while_the_lambda_writes(dynamodb, table_name):
        # The scan has read the item; the Lambda then writes a newer change of it (the table moved on meanwhile).
        for item in scan(dynamodb, table_name):
            yield item
            handle_stream_event(lambda_event("scanned", str(newest + 300), "changed during the scan"), s3, layout)

    monkeypatch.setattr(bootstrap, "scan_table", scan_while_the_lambda_writes)
    before = datetime.now(UTC)
    sync_books(instance, books_capture="lambda")
    (row,) = spark.table(f"{settings.namespace}.books").collect()
    assert (row["id"], row["name"]) == ("scanned", "changed during the scan")
    # The merge time reaches the row (it joins the changes as data, no longer as a literal).
    assert before <= row["_synced_at"].replace(tzinfo=UTC) <= datetime.now(UTC)


@pytest.mark.parametrize("merged_by", ["the bootstrap's run", "the next run, the bootstrap's merge having failed"])
def test_with_the_capture_lambda_a_bootstrap_reads_through_its_scans_end_before_it_publishes(spark, settings, instance, monkeypatch, merged_by):
    """A key changed twice during the scan, which saw the second change; the Lambda has delivered only the first when
    the snapshot merges. Applied on top, that first change alone would publish the key older than the scan saw it: the
    run that merges the snapshot reads the stream through the scan's end itself (from the oldest record the stream
    keeps, when another run sealed the snapshot)."""
    s3, layout, dynamodb = settings.client("s3"), SourceLayout(settings.bucket, "books_source"), settings.client("dynamodb")
    table = settings.dynamodb_tables["books"]
    dynamodb.put_item(TableName=table, Item={"id": {"S": "k"}, "name": {"S": "first"}})
    dynamodb.put_item(TableName=table, Item={"id": {"S": "k"}, "name": {"S": "second"}})
    sync_books(instance, books_capture="lambda")  # readers see k as "second"
    scan = bootstrap.scan_table

    def scan_after_two_changes(dynamodb_client, table_name):
        # After the stream's end was taken: two changes, the scan reads the second; the Lambda delivers the first only.
        for name in ("third", "fourth"):
            dynamodb_client.put_item(TableName=table, Item={"id": {"S": "k"}, "name": {"S": name}})
        third = next(record for record in stream_records(settings) if record["dynamodb"].get("NewImage", {}).get("name") == {"S": "third"})
        handle_stream_event({"Records": [third]}, s3, layout)
        yield from scan(dynamodb_client, table_name)

    monkeypatch.setattr(bootstrap, "scan_table", scan_after_two_changes)
    if merged_by == "the bootstrap's run":
        metadata = materialization_metadata(sync_books(instance, config={"bootstrap": True}, books_capture="lambda"), "books_source")
    else:
        with monkeypatch.context() as patch:
            failing_at(patch, SEALED_BOOTSTRAP_STEPS["merge"])
            assert not sync_books(instance, config={"bootstrap": True}, books_capture="lambda", raise_on_error=False).success
        metadata = materialization_metadata(sync_books(instance, books_capture="lambda"), "books_source")
    assert {row["id"]: row["name"] for row in spark.table(f"{settings.namespace}.books").collect()} == {"k": "fourth"}
    # The run's own read, through the scan's end: the two changes (and from the oldest record, the first two too).
    assert metadata["records_captured"] == (2 if merged_by == "the bootstrap's run" else 4)
    # The Lambda delivers the rest later: its copies change nothing.
    monkeypatch.setattr(bootstrap, "scan_table", scan)
    handle_stream_event({"Records": stream_records(settings)[-2:]}, s3, layout)
    after = materialization_metadata(sync_books(instance, books_capture="lambda"), "books_source")
    assert "records_captured" not in after  # the snapshot is merged: the Lambda alone captures again
    assert {row["id"]: row["name"] for row in spark.table(f"{settings.namespace}.books").collect()} == {"k": "fourth"}


def test_a_writer_outside_the_run_queue_stops_without_writing_while_another_holds_the_lease(spark, settings, tmp_path):
    """`dagster asset materialize` runs in its own process, outside the queue and its pools: the lease stops it."""
    import subprocess
    import sys
    from pathlib import Path

    from ddb_athena.lib.writer_lease import WriterLease

    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert()
    s3 = settings.client("s3")
    table = f"{settings.namespace}.books"
    running = WriterLease(s3, settings.bucket, table, "Dagster run 1234abcd (books_sync)", ttl_seconds=5)
    running.acquire()
    try:
        command = [
            sys.executable,
            "-m",
            "dagster",
            "asset",
            "materialize",
            "-m",
            "ddb_athena.definitions",
            "--select",
            "books_source,books_iceberg",
            "--config-json",
            '{"ops": {"sync_books": {"config": {"run_minutes": 0}}}}',
        ]
        env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "DDB_ATHENA_WRITER_LEASE_SECONDS": "5"}
        completed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[2], timeout=300)
        running.check()  # still the running writer's
    finally:
        running.release()
    assert completed.returncode != 0
    assert f"{table} has another writer: Dagster run 1234abcd (books_sync)" in completed.stdout + completed.stderr
    assert list(list_keys(s3, settings.bucket, "books_source/")) == []  # no checkpoint, no change file, no snapshot
    assert not spark.catalog.tableExists(table)


class FailingS3:
    """The S3 client, but the first call of `operation` on a key for which `matches(key)` holds fails."""

    def __init__(self, s3, operation: str, matches):
        self._s3, self._operation, self._matches, self.failed = s3, operation, matches, False

    def __getattr__(self, name):
        call = getattr(self._s3, name)
        if name != self._operation:
            return call

        def failing(**kwargs):
            if not self.failed and self._matches(kwargs.get("Key", "")):
                self.failed = True
                raise RuntimeError(f"injected failure: {name} {kwargs['Key']}")
            return call(**kwargs)

        return failing


def books_behind_a_stream_gap(spark, settings, instance) -> tuple:
    """Three books synced, then a gap in the stream (positions it no longer holds), then a fourth book."""
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    for _ in range(3):
        simulator.insert()
    sync_books(instance)
    break_checkpoints(spark, settings)
    simulator.insert()
    return dynamodb, simulator


def break_checkpoints(spark, settings) -> None:
    """Positions that no longer match the stream (as after a 24-hour trim or a re-created stream), committed as the
    sync commits them: with the table's data."""
    table = f"{settings.namespace}.books"
    checkpoints = positions_from_json(newest_published(spark, table, STREAM_POSITIONS_PROPERTY))
    broken = [replace(checkpoint, stream_arn=checkpoint.stream_arn + "-before-recreation") for checkpoint in checkpoints]
    empty_commit(spark, table, {STREAM_POSITIONS_PROPERTY: positions_json(broken)})


def scan_failing_midway(monkeypatch) -> None:
    scan_table = bootstrap.scan_table

    def scan(dynamodb, table_name):
        for number, item in enumerate(scan_table(dynamodb, table_name)):
            if number == 2:
                raise RuntimeError("injected failure: the scan was throttled")
            yield item

    monkeypatch.setattr(bootstrap, "scan_table", scan)


BOOTSTRAP_STEPS = {
    # Each step of a bootstrap, and how to make it fail there.
    "scan": scan_failing_midway,
    "snapshot part": ("put_object", lambda key: "/_snapshots/" in key),
    "seal": ("put_object", lambda key: "/changes/" in key and "-snapshot-" in key),
}


def merge_failing(monkeypatch) -> None:
    def failing_merge(*args, **kwargs):
        raise RuntimeError("injected failure: the merge")

    monkeypatch.setattr(books_cycle, "merge_change_files", failing_merge)


# A bootstrap's steps once its snapshot is sealed: the next sync merges it, without a second scan.
SEALED_BOOTSTRAP_STEPS = {
    # Saved until the merge commits them; without them the capture reads the stream from its oldest record, and the
    # changes older than the scan are not applied on top of it.
    "positions saved": ("put_object", lambda key: "/_checkpoints/" in key),
    "merge": merge_failing,
}


def failing_at(patch, injected) -> None:
    from ddb_athena.lib.resources import AwsClientsResource

    if callable(injected):
        injected(patch)
        return
    operation, matches = injected
    new_client = AwsClientsResource._new_client

    def client(self, service):
        return FailingS3(new_client(self, service), operation, matches) if service == "s3" else new_client(self, service)

    patch.setattr(AwsClientsResource, "_new_client", client)


@pytest.mark.parametrize("step", BOOTSTRAP_STEPS)
def test_a_bootstrap_that_fails_before_its_snapshot_is_sealed_leaves_the_gap_for_the_next_sync_to_report(spark, settings, instance, monkeypatch, step):
    dynamodb, simulator = books_behind_a_stream_gap(spark, settings, instance)

    with monkeypatch.context() as patch:
        failing_at(patch, BOOTSTRAP_STEPS[step])
        failed = sync_books(instance, config={"bootstrap": True}, raise_on_error=False)
    assert not failed.success and "injected failure" in str(failed.failure_data_for_node("sync_books").error)

    # The gap is still there to be seen: the next plain sync fails with the recovery command, it does not replay.
    with pytest.raises(Exception, match="ddb-athena bootstrap books"):
        sync_books(instance)
    recovered = sync_books(instance, config={"bootstrap": True})
    assert materialization_metadata(recovered, "books_source")["bootstrap_items"] == 4
    assert_same_keys(spark, settings, dynamodb)


@pytest.mark.parametrize("step", SEALED_BOOTSTRAP_STEPS)
def test_a_bootstrap_that_fails_once_its_snapshot_is_sealed_is_merged_by_the_next_sync_without_a_second_scan(spark, settings, instance, monkeypatch, step):
    dynamodb, simulator = books_behind_a_stream_gap(spark, settings, instance)

    with monkeypatch.context() as patch:
        failing_at(patch, SEALED_BOOTSTRAP_STEPS[step])
        assert not sync_books(instance, config={"bootstrap": True}, raise_on_error=False).success
    simulator.step()
    resumed = sync_books(instance)
    assert materialization_metadata(resumed, "books_source")["bootstrap_items"] == 0  # the sealed snapshot, not a new scan
    assert materialization_metadata(resumed, "books_iceberg")["bootstrap_file"]
    assert_same_keys(spark, settings, dynamodb)


def queued_run(instance, job_name: str, pools: set[str]):
    """A run waiting in the queue, as the UI, a backfill or `ddb-athena bootstrap` leave it."""
    from dagster import DagsterRunStatus
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.storage.dagster_run import DagsterRun, RunOpConcurrency
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="ddb_athena.definitions"))
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)
    concurrency = RunOpConcurrency(root_key_counts={pool: 1 for pool in pools}, has_unconstrained_root_nodes=not pools, all_pools=pools)
    return instance.add_run(DagsterRun(job_name=job_name, status=DagsterRunStatus.QUEUED, remote_job_origin=origin, run_op_concurrency=concurrency))


def test_a_sync_run_gives_way_after_its_cycle_to_a_books_writer_waiting_in_the_queue(spark, settings, instance, run_clock):
    from ddb_athena.streamed.handover import waiting_writers

    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert()
    sync_books(instance)
    queued_run(instance, "books_sync", {"books_writer"})  # a sync run of an earlier version (in the pool then): not a writer to give way to
    queued_run(instance, "orders_daily", {"orders_writer"})  # another table's writer: neither
    assert "books_writer" not in waiting_writers(instance)
    bootstrap = queued_run(instance, "books_bootstrap", {"books_writer"})
    assert waiting_writers(instance)["books_writer"].run_id == bootstrap.run_id

    result = sync_books(instance, config={"run_minutes": 2, "merge_interval_seconds": 1})
    assert len(materializations_metadata(result, "books_iceberg")) == 1  # one cycle, not two minutes of them
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(f"run {bootstrap.run_id} (books_bootstrap) waits to write" in message for message in messages)
    assert any(message.startswith("Sync run done after 1 cycles") for message in messages)


class SlowPages:
    """The emulator's stream, two records a GetRecords and a quarter of a second each: a stream the capture cannot
    drain within a cycle."""

    def __init__(self, streams):
        self._streams = streams

    def get_records(self, ShardIterator, Limit):
        time.sleep(0.25)
        return self._streams.get_records(ShardIterator=ShardIterator, Limit=2)

    def __getattr__(self, name):
        return getattr(self._streams, name)


def test_behind_the_stream_a_cycle_merges_what_it_read_within_its_interval_and_the_backlog_check_shows_the_lag(spark, settings, instance, monkeypatch):
    from ddb_athena.lib.resources import AwsClientsResource

    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"])
    simulator.insert()
    sync_books(instance)  # the bootstrap
    for _ in range(40):
        simulator.insert()
    new_client = AwsClientsResource._new_client
    with monkeypatch.context() as patch:
        patch.setattr(
            AwsClientsResource,
            "_new_client",
            lambda self, service: SlowPages(new_client(self, service)) if service == "dynamodbstreams" else new_client(self, service),
        )
        behind = sync_books(instance, config={"merge_interval_seconds": 2}, backlog_limit_minutes=0)
    source, merged = materialization_metadata(behind, "books_source"), materialization_metadata(behind, "books_iceberg")
    # It read for about its interval (a handful of pages), merged that, and says it is behind.
    assert source["stream_caught_up"] is False and 0 < source["records_captured"] < 40
    assert merged["records_consumed"] == source["records_captured"]
    backlog = check_results(behind)["books_backlog"]
    assert not backlog.passed and backlog.metadata["stream_behind_seconds"].value > 0
    caught_up = sync_books(instance)  # at the emulator's own pace
    assert materialization_metadata(caught_up, "books_source")["stream_caught_up"] is True
    assert check_results(caught_up)["books_backlog"].passed
    assert_same_keys(spark, settings, dynamodb)


def test_a_cycles_deleted_rows_slice_is_sized_by_its_spare_seconds_at_the_pace_the_runs_last_slice_went(monkeypatch):
    """The first slice at the first guess, one target file's worth at most; then the measured pace, each table its own;
    the tombstones get what the table's compaction left of the spare time."""
    now, budgets, mib = [100.0], [], 1024 * 1024

    def compact_if_due(spark, catalog, table, threshold, before_rewrite, settled, deleted_rows_bytes):
        budgets.append((table, deleted_rows_bytes))
        now[0] += 8.0  # each compaction takes 8 s and rewrites 40 MiB of deleted rows
        return CompactionResult(1, 1, 1, 9, deleted_rows_files=1, deleted_rows_bytes=40 * mib)

    monkeypatch.setattr(assets, "compact_if_due", compact_if_due)
    monkeypatch.setattr(assets.time, "monotonic", lambda: now[0])
    spark = SimpleNamespace(spark_session=None, catalog="lake")
    sync = SimpleNamespace(compaction_file_threshold=16, iceberg_table_of=lambda table: "ns.books")
    upkeep = assets.StreamedUpkeep(spark, sync, declared("books"))
    upkeep.compact(spare_seconds=10.0)
    upkeep.compact(spare_seconds=10.0)
    first_guess = assets.FIRST_REWRITE_BYTES_PER_SECOND
    assert 10 * first_guess > assets.TARGET_FILE_BYTES > 2 * first_guess
    assert budgets == [
        ("ns.books", assets.TARGET_FILE_BYTES),  # 10 s at the guess would be more than one file
        ("ns.books_tombstones", int(2 * first_guess)),  # 2 s left, no pace of its own yet: under one file
        ("ns.books", 50 * mib),  # 10 s at the 5 MiB/s measured
        ("ns.books_tombstones", 10 * mib),
    ]
