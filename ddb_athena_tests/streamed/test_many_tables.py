"""Several streamed tables in one sync run, one JVM: each cycle merges every table; one table's failure (a bad batch,
a lost lease) leaves the others syncing, and the failed one comes back by itself."""

import itertools
import json
import os
import random
import signal
import textwrap
import threading
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

import pytest
from dagster import AssetKey, DagsterInstance, job, op
from pyiceberg.table import StaticTable

from ddb_athena.dev.local_stack import create_dynamodb_table, table_exists
from ddb_athena.dev.simulate import SeededTraffic, seed_items
from ddb_athena.lake.table_keys import key_text
from ddb_athena.lib.declarations import declared, parse_declarations
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, SyncSettings, WriterLeases
from ddb_athena.lib.writer_lease import WriterLease
from ddb_athena.streamed import cycle as stream_cycle
from ddb_athena.streamed.assets import STREAMED, SyncConfig, streamed_assets, sync_cycles
from ddb_athena.streamed.check_results import key_parity_result, observe_key_parity, parity_scan_plan
from ddb_athena.streamed.run_loop import StopRequest
from ddb_athena_tests.books_and_orders import BOOKS
from ddb_athena_tests.dagster_helpers import local_resources
from ddb_athena_tests.fake_clock import CountedProbe, FakeClock, FastClock
from ddb_athena_tests.frozen_process import FrozenProcess
from ddb_athena_tests.lake.test_schema_evolution import read_by_pyiceberg
from ddb_athena_tests.lib.test_declarations import REVIEWS as REVIEWS_DECLARATION

# A second streamed table with a composite key: reviews of books.
REVIEWS = parse_declarations(REVIEWS_DECLARATION)["reviews"]
REVIEW_ASSETS = streamed_assets(REVIEWS)
CYCLES = 6


def reviews_table(dynamodb) -> None:
    """The DynamoDB table of reviews (the settings fixture made it already where reviews is a declared table)."""
    if not table_exists(dynamodb, "reviews"):
        create_dynamodb_table(dynamodb, "reviews", REVIEWS)


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


def run_two_tables(
    instance, on_cycle, cycles: int = CYCLES, tables=(BOOKS, REVIEW_ASSETS), stop: StopRequest | None = None, **sync_options
) -> tuple[list[str], list]:
    """A sync run of books and reviews (or `tables`), `cycles` cycles a second apart; `on_cycle(number)` runs before
    each (`stop` says which signals the run rides out). Its log and its check evaluations."""
    resources = local_resources(dynamodb_tables={"reviews": "reviews"}, **sync_options)
    numbers = iter(range(1, 1000))

    @op
    def sync_two_tables(context, aws: AwsClientsResource, spark: IcebergSparkResource, sync: SyncSettings, leases: WriterLeases):
        def end_reason():
            number = next(numbers)
            on_cycle(number)
            return "its cycles are done" if number >= cycles else None

        config = SyncConfig(merge_interval_seconds=1)
        sync_cycles(context, config, aws, spark, sync, leases, list(tables), run_seconds=600, end_reason=end_reason, stop=stop)

    @job(resource_defs=resources)
    def two_tables():
        sync_two_tables()

    result = two_tables.execute_in_process(instance=instance)
    assert result.success
    return [entry.user_message for entry in instance.all_logs(result.run_id)], result.get_asset_check_evaluations()


def merged_cycles(instance, asset: str) -> list[int]:
    records = instance.fetch_materializations(AssetKey(asset), limit=100).records
    return sorted(record.asset_materialization.metadata["cycle"].value for record in records)


def rows(spark, table: str) -> dict:
    return {(row["book_id"], row["review_id"]): row["stars"] for row in spark.table(table).collect()}


def test_a_sync_whose_main_an_older_writer_moved_goes_on_and_merges_the_cycle_again(spark, settings, instance, monkeypatch):
    """A stale writer's upkeep (compaction commits to main) moves main past the sync's fence before its publication:
    the sync, alone in its run, loses that one publication, not the table or the run, and its next cycle merges the
    same changes under a new fence."""
    from ddb_athena.lake import writer_branch
    from ddb_athena.lake.commit_properties import empty_commit

    dynamodb = settings.client("dynamodb")
    publish, publications, moved = writer_branch.WriterBranch.publish, [], []

    def an_older_writers_upkeep_first(self, table):
        if table.endswith(".books"):
            publications.append(table)
            if len(publications) == 2:  # the first is the take's own (its fence); the second publishes a merge
                moved.append(table)
                empty_commit(spark, table, {"operation-by": "a stale writer's compaction"})
        return publish(self, table)

    monkeypatch.setattr(writer_branch.WriterBranch, "publish", an_older_writers_upkeep_first)

    def write(number: int) -> None:
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"book-{number}"}, "name": {"S": "n"}})

    write(0)
    log, _ = run_two_tables(instance, write, cycles=4, tables=(BOOKS,))
    assert moved and any("main moved since" in line and "takes the table again" in line for line in log), log
    assert not any(line.startswith("Giving") and "lease was lost" in line for line in log)
    names = {row["id"] for row in spark.table(f"{settings.namespace}.books").collect()}
    assert {"book-0", "book-1", "book-2", "book-3"} <= names


def test_a_bad_batch_of_one_table_leaves_the_other_syncing_and_is_merged_once_it_clears(spark, settings, instance, monkeypatch):
    dynamodb = settings.client("dynamodb")
    reviews_table(dynamodb)
    merge = stream_cycle.merge_change_files
    failing = {"on": True}

    def merge_failing_for_reviews(spark, spec, target, *args, **kwargs):
        if spec.table == "reviews" and failing["on"]:
            raise RuntimeError("a batch this merge cannot take")
        return merge(spark, spec, target, *args, **kwargs)

    monkeypatch.setattr(stream_cycle, "merge_change_files", merge_failing_for_reviews)

    def on_cycle(number: int) -> None:
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"book-{number}"}, "name": {"S": "n"}})
        dynamodb.put_item(TableName="reviews", Item={"book_id": {"S": "book-1"}, "review_id": {"N": str(number)}, "stars": {"N": "4"}})
        failing["on"] = number < 4  # cycles 1-3 fail for reviews

    log, evaluations = run_two_tables(instance, on_cycle)
    # Books merged in every cycle; reviews in none of the failing ones, then caught up with all it missed.
    assert merged_cycles(instance, "books_iceberg") == list(range(1, CYCLES + 1))
    assert merged_cycles(instance, "reviews_iceberg") == list(range(4, CYCLES + 1))
    assert sum("its cycle failed (RuntimeError: a batch this merge cannot take); the other tables go on" in line for line in log) == 3
    table = f"{settings.namespace}.reviews"
    assert sorted(int(key[1]) for key in rows(spark, table)) == list(range(1, CYCLES + 1))
    assert {row["id"] for row in spark.table(f"{settings.namespace}.books").collect()} == {f"book-{n}" for n in range(1, CYCLES + 1)}
    # Each table's checks are its own, under its own names and asset.
    checks = {(event.asset_key.to_user_string(), event.check_name) for event in evaluations}
    assert {("reviews_iceberg", "reviews_backlog"), ("reviews_iceberg", "reviews_quarantine_empty")} <= checks
    assert {("books_iceberg", "books_backlog"), ("books_iceberg", "books_quarantine_empty")} <= checks


def test_a_table_whose_lease_is_taken_is_given_up_while_the_other_syncs_and_taken_back_when_free(spark, settings, instance, monkeypatch):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    reviews_table(dynamodb)
    target = f"{settings.namespace}.reviews"
    intruder = {}
    lost = threading.Event()
    lose = WriterLease._lose

    def noting_the_loss(lease: WriterLease, reason: str) -> None:
        lose(lease, reason)
        if lease.table == target and lease.holder != "another writer":
            lost.set()

    monkeypatch.setattr(WriterLease, "_lose", noting_the_loss)

    def on_cycle(number: int) -> None:
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"book-{number}"}, "name": {"S": "n"}})
        dynamodb.put_item(TableName="reviews", Item={"book_id": {"S": "b"}, "review_id": {"N": str(number)}, "stars": {"N": "1"}})
        if number == 2:
            # Another writer takes the reviews lease (as one does after an expiry); the run's next renewal (every 2 s)
            # finds it gone (waited for: on a busy machine a renewal can come later than 2 s), and its next cycle of
            # reviews stops without committing.
            lease = WriterLease(s3, settings.bucket, target, "another writer", ttl_seconds=60)
            s3.delete_object(Bucket=settings.bucket, Key=lease.key)
            lease.acquire(wait_seconds=0)
            intruder["lease"] = lease
            assert lost.wait(timeout=60), "the run's renewals never found its reviews lease taken"
        if number == 4:
            intruder["lease"].release()

    monkeypatch.setenv("DDB_ATHENA_WRITER_LEASE_SECONDS", "6")  # renewed every 2 s
    log, _ = run_two_tables(instance, on_cycle)
    assert merged_cycles(instance, "books_iceberg") == list(range(1, CYCLES + 1))
    # Lost at its cycle 2, held by the other writer at 3, taken back at 4 once released.
    assert merged_cycles(instance, "reviews_iceberg") == [1, 4, 5, 6]
    assert any(f"{target}: " in line and "the other tables go on" in line for line in log)
    assert any(line == f"Took the writer lease of {target}" for line in log[log.index(next(line for line in log if "Giving" in line)) :])
    assert sorted(int(key[1]) for key in rows(spark, target)) == list(range(1, CYCLES + 1))


def test_a_long_step_of_one_table_keeps_every_lease_of_the_run_alive_and_a_hung_run_lets_them_all_lapse(settings):
    """Each lease of a run watches the run's progress: a bootstrap scanning books for longer than the stall limit (its
    pages the only steps) must not let the reviews lease lapse; a run that stops stepping loses both. By the leases'
    clock, moved by the test: each move is looked at by both renewers (real seconds apart)."""
    from ddb_athena.lib.writer_lease import LeaseLostError
    from ddb_athena.streamed.assets import RunProgress

    progress = RunProgress(IcebergSparkResource(profile="local", warehouse="file:///nowhere"))  # no session: no Spark tasks
    s3, clock = settings.client("s3"), FakeClock()
    probes = {name: CountedProbe(progress.seen) for name in ("books", "reviews")}
    leases = [
        WriterLease(s3, settings.bucket, f"library.{name}", "one sync run", ttl_seconds=1.5, stall_seconds=2.0, clock=clock, progress=probe)
        for name, probe in probes.items()
    ]
    for lease in leases:
        lease.acquire()
    try:
        for _ in range(4):  # twice the stall limit: only books' scan steps
            clock.sleep(1.0)
            progress.step()
            for probe in probes.values():
                probe.wait()
        for lease in leases:
            lease.check()
        clock.sleep(4.0)  # the run hangs
        for lease in leases:
            lease._renewer.join(timeout=10.0)  # each lets its lease lapse, and stops renewing
            with pytest.raises(LeaseLostError, match="made no progress for"):
                lease.check()
    finally:
        for lease in leases:
            lease.release()


# Sync runs of books and reviews in a process of its own (its JVM in its process group), one for each job (a line of
# JSON: the test's environment, the cycles, where to pause): at its first merge of reviews (its first cycle scans each
# table; the second merges the scans, books published before reviews), it prints "paused" and waits for a line (the
# test freezes it meanwhile); it prints "cycle N" after each cycle, and at the end the lines of its log about its
# leases, then "run over". Where it pauses: after its last lease check, before it takes the table ("before its
# take"), or on the branch it took ("inside its write").
FROZEN_RUN = textwrap.dedent(
    """
    import json
    import os
    import sys
    from dagster import DagsterInstance
    from ddb_athena.lake import change_merge
    from ddb_athena.streamed import cycle
    from ddb_athena_tests.streamed import test_many_tables as two_tables

    def pausing(write, reviews_merges):
        def paused_at_first_reviews_merge(spark, spec, *args, **kwargs):
            if spec.table == "reviews":
                reviews_merges.append(spec)
                if len(reviews_merges) == 1:
                    print("paused", flush=True)
                    sys.stdin.readline()
            return write(spark, spec, *args, **kwargs)
        return paused_at_first_reviews_merge

    while line := sys.stdin.readline():
        job = json.loads(line)
        os.environ.clear()
        os.environ.update(job["environment"])
        reviews_merges = []
        module, names = (cycle, ["merge_change_files"]) if job["pause_at"] == "before its take" else (change_merge, ["_rebuild", "_upsert"])
        originals = {name: getattr(module, name) for name in names}
        for name, write in originals.items():
            setattr(module, name, pausing(write, reviews_merges))
        try:
            with DagsterInstance.ephemeral() as instance:
                log, _ = two_tables.run_two_tables(instance, lambda number: print(f"cycle {number}", flush=True), cycles=job["cycles"])
        finally:
            for name, write in originals.items():
                setattr(module, name, write)
        print(*[line for line in log if line.startswith(("Giving", "Took"))], "run over", sep="\\n", flush=True)
    """
)


@pytest.fixture(scope="module")
def frozen_runs():
    runs = FrozenProcess(FROZEN_RUN)
    yield runs
    runs.stop()


def main_snapshot(settings, table: str) -> int:
    """The snapshot readers of `table` see (its main), from its newest metadata, as Athena finds it."""
    namespace, name = table.split(".")
    return StaticTable.from_metadata(str(Path(urlparse(settings.warehouse).path) / namespace / name)).metadata.current_snapshot_id


# One worker runs both variants: they share the frozen runs' process.
@pytest.mark.xdist_group("frozen_sync_runs")
@pytest.mark.parametrize("pause_at", ["inside its write", "before its take"])
def test_a_run_frozen_past_its_leases_mid_cycle_changes_neither_table_once_resumed(spark, settings, instance, monkeypatch, frozen_runs, pause_at):
    """Two tables in one run, frozen (SIGSTOP: its Python and its JVM) at its merge of reviews, after its commit of
    books in the same cycle, past both leases; the next run takes both and syncs newer changes of the same keys, and a
    delete. Resumed, the frozen run publishes nothing to either table (main's snapshot stays the next run's: a row
    could not tell, as the sequence guards keep an older change from moving it back): it gives both up, ending.
    Paused after its last lease check but before its take, its take finds the next run's newer fence and refuses."""
    monkeypatch.setenv("DDB_ATHENA_WRITER_LEASE_SECONDS", "6")
    dynamodb = settings.client("dynamodb")
    reviews_table(dynamodb)
    books, reviews = f"{settings.namespace}.books", f"{settings.namespace}.reviews"

    def write(batch: int) -> None:
        for number in range(3):
            dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"book-{number}"}, "name": {"S": f"batch {batch}"}})
            dynamodb.put_item(TableName="reviews", Item={"book_id": {"S": "b"}, "review_id": {"N": str(number)}, "stars": {"N": str(batch)}})

    def tables() -> dict:
        return {
            "books": {key: (row["name"], row["_sequence_number"]) for key, row in read_by_pyiceberg(settings, books).items()},
            "reviews": sorted((int(row["review_id"]), row["stars"], row["_sequence_number"]) for row in spark.table(reviews).collect()),
        }

    write(1)
    # Two cycles: the paused one is the last, so the resumed run ends after it (a later cycle would take the tables
    # back, free by then, and fence main as their writer).
    with frozen_runs.serving(json.dumps({"environment": dict(os.environ), "cycles": 2, "pause_at": pause_at})) as frozen:
        frozen.wait_for("cycle 1")
        write(2)
        frozen.wait_for("paused")
        frozen.freeze()
        write(3)
        dynamodb.delete_item(TableName=settings.dynamodb_tables["books"], Key={"id": {"S": "book-0"}})
        dynamodb.delete_item(TableName="reviews", Key={"book_id": {"S": "b"}, "review_id": {"N": "0"}})
        # The next run waits out both leases (no renewal from a frozen run), then syncs both tables.
        log, _ = run_two_tables(instance, lambda number: None, cycles=3)
        assert f"Took the writer lease of {books}" in log and f"Took the writer lease of {reviews}" in log
        spark.sql(f"REFRESH TABLE {reviews}")
        expected = tables()
        assert {key: name for key, (name, _) in expected["books"].items()} == {"book-1": "batch 3", "book-2": "batch 3"}
        assert [(review, stars) for review, stars, _ in expected["reviews"]] == [(1, 3), (2, 3)]
        # What readers see is main's current snapshot: older changes cannot move a row back (sequence guards), so
        # only main itself shows whether the resumed run published anything.
        heads = {table: main_snapshot(settings, table) for table in (books, reviews)}

        frozen.resume()
        out = frozen.wait_for("run over")
        given_up = [line for line in out if line.startswith("Giving")]
        assert any(reviews in line for line in given_up) and any(books in line for line in given_up), out
    spark.sql(f"REFRESH TABLE {reviews}")
    assert tables() == expected  # not one row of either table changed by the resumed run, no delete undone
    assert {table: main_snapshot(settings, table) for table in (books, reviews)} == heads  # not one snapshot published


def test_a_table_declared_with_its_own_interval_merges_at_it_beside_a_faster_one_in_the_same_run(spark, settings, instance, monkeypatch):
    """reviews declared with merge_interval_seconds = 8 beside books at the run's 1 s: books merges in each cycle;
    reviews, due once its own interval has gone by, waits for a cycle with room for it after books' turn. The run's
    clock runs four times as fast, so books' cycles outlast the run's second on any host: there is no room, and
    reviews merges once half its interval late (every 12 s of the run's cycles), taking every change all the same.
    The run's cycles are never held for it."""
    monkeypatch.setattr("ddb_athena.streamed.assets.RUN_CLOCK", FastClock(speed=4.0))
    dynamodb = settings.client("dynamodb")
    reviews_table(dynamodb)
    slow = streamed_assets(replace(declared("reviews"), merge_interval_seconds=8.0))

    def write(number: int) -> None:
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"book-{number}"}, "name": {"S": "n"}})
        dynamodb.put_item(TableName="reviews", Item={"book_id": {"S": "b"}, "review_id": {"N": str(number)}, "stars": {"N": "4"}})

    write(0)
    out, _ = run_two_tables(instance, write, cycles=14, tables=(BOOKS, slow))  # past 12 s of the run's clock even at 1 s a cycle

    books_cycles, reviews_cycles = merged_cycles(instance, "books_iceberg"), merged_cycles(instance, "reviews_iceberg")
    # How many of the run's cycles that is depends on how long each takes on the host: the gaps say it.
    assert books_cycles == list(range(1, 15)) and len(reviews_cycles) >= 2, (books_cycles, reviews_cycles)
    # A table's cadence counts from the start of the run's cycle, not its own (reviews starts after books' turn). Books
    # takes each cycle's first turn, so its starts are the run's.
    books_metadata = sorted(
        (record.asset_materialization.metadata for record in instance.fetch_materializations(AssetKey("books_iceberg"), limit=100).records),
        key=lambda metadata: metadata["cycle"].value,
    )
    books_gaps = [metadata["seconds_since_previous_cycle"].value for metadata in books_metadata]
    # Reviews skips a cycle whenever the run's cycles are shorter than its interval late (a host too loaded for that
    # merges it in every cycle, rightly: each is 12 s of the run's clock or more).
    assert len(reviews_cycles) < len(books_cycles) or min(books_gaps[1:]) >= 1.5 * 8.0, (reviews_cycles, books_gaps)
    run_cycle_starts = dict(zip(books_cycles, itertools.accumulate(books_gaps), strict=True))
    reviews_gaps = [run_cycle_starts[later] - run_cycle_starts[earlier] for earlier, later in itertools.pairwise(reviews_cycles)]
    assert min(reviews_gaps) >= 1.5 * 8.0, (reviews_gaps, books_gaps)
    # The changes of every cycle up to reviews' last are in it (later ones wait for its next cycle).
    assert {review for _, review in rows(spark, f"{settings.namespace}.reviews")} >= set(range(reviews_cycles[-1]))
    # Books, at the run's pace, takes a cycle's first turn: reviews' merge starts once books' cycle has committed.
    merging = [(index, message.rsplit(".", 1)[-1]) for index, message in enumerate(out) if message.startswith("Merging ")]
    for index, table in merging:
        if table == "reviews":
            books_merge = max((earlier for earlier, other in merging if other == "books" and earlier < index), default=index)
            assert "Materialized value books_iceberg." in out[books_merge:index], out[books_merge : index + 1]


def test_riding_out_a_stop_every_table_merges_in_every_cycle_a_slower_one_too(spark, settings, instance):
    """reviews declared at 60 s beside books at the run's 1 s: after its first cycle it is not due again within the
    run, until SIGTERM is ridden out (ECS stopping a Spot task): then both merge in every cycle, back to back, to the
    grace's end (20 s), and the run ends by itself. Nothing a slower table holds is left to the successor's first
    cycle."""
    dynamodb = settings.client("dynamodb")
    reviews_table(dynamodb)
    slow = streamed_assets(replace(declared("reviews"), merge_interval_seconds=60.0))
    signalled_in = 6  # its first cycle (the session's warm-up) out of the five that bound the grace's last start

    def write(number: int) -> None:
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"book-{number}"}, "name": {"S": "n"}})
        dynamodb.put_item(TableName="reviews", Item={"book_id": {"S": "b"}, "review_id": {"N": str(number)}, "stars": {"N": "4"}})
        if number == signalled_in:
            os.kill(os.getpid(), signal.SIGTERM)  # held by the run's loop, then ridden out after this cycle

    out, _ = run_two_tables(instance, write, cycles=1000, tables=(BOOKS, slow), stop=StopRequest(rides_out=lambda _: True, grace_seconds=20.0))

    books_cycles, reviews_cycles = merged_cycles(instance, "books_iceberg"), merged_cycles(instance, "reviews_iceberg")
    last = books_cycles[-1]
    assert books_cycles == list(range(1, last + 1)) and last >= signalled_in + 3, books_cycles
    assert reviews_cycles == [1, *range(signalled_in + 1, last + 1)], (reviews_cycles, books_cycles)
    assert any(message.startswith("Sync run done after") for message in out)


def test_key_parity_of_the_declared_composite_key_table_end_to_end(spark, settings, instance):
    """reviews as tables.toml declares it (book_id S, review_id N), written from its seed items by make dev's simulator
    (several reviews a book, updates, deletes, re-inserts), synced, then compared key by key with DynamoDB: equal. A row
    deleted by hand is named by its whole key."""
    reviews = declared("reviews")
    traffic = SeededTraffic(settings.client("dynamodb"), reviews, settings.dynamodb_tables["reviews"], seed_items("reviews"), random.Random(5))
    traffic.seed()
    for _ in range(80):
        traffic.step()
    run_two_tables(instance, lambda number: None, cycles=1, tables=(STREAMED["reviews"],))
    resources = local_resources(parity_settle_seconds=1)

    def parity():
        return observe_key_parity(resources["aws"], resources["spark"], resources["sync"], reviews)[0]

    before = parity()
    assert before.passed and before.iceberg_rows == before.dynamodb_items == len(traffic.live) > 16
    # An item whose key the table cannot hold (review_id 1.5 in a decimal(38,0)): the sync quarantines it; the check
    # counts it, says so, and compares the rest (it used to raise InvalidKeyError on it, the whole check in error).
    odd = {"book_id": {"S": "b-odd"}, "review_id": {"N": "1.5"}, "stars": {"N": "4"}}
    settings.client("dynamodb").put_item(TableName=settings.dynamodb_tables["reviews"], Item=odd)
    run_two_tables(instance, lambda number: None, cycles=1, tables=(STREAMED["reviews"],))
    plan = parity_scan_plan(resources["aws"], resources["sync"], reviews)
    counted = key_parity_result(*observe_key_parity(resources["aws"], resources["spark"], resources["sync"], reviews, plan), plan)
    assert counted.passed and counted.metadata["dynamodb_items_with_unholdable_keys"].value == 1
    assert "key the table's key columns cannot hold exactly: 1," in counted.description and "1.5" not in counted.description
    victim = traffic.live[0]
    spark.sql(f"DELETE FROM {settings.namespace}.reviews WHERE book_id = '{victim['book_id']}' AND review_id = {victim['review_id']}")
    after = parity()
    assert not after.passed and after.metadata()["unexplained_examples"] == f"{key_text((victim['book_id'], victim['review_id']))} (missing from Iceberg)"


def test_a_table_declared_to_read_its_own_stream_syncs_beside_one_the_capture_lambda_serves_in_one_run(spark, settings, instance):
    """The deployment's capture is the Lambda's (books' changes come only as its change files); reviews is declared
    `capture = "run"`: the same run reads reviews' stream itself and never books'."""
    from ddb_athena.lib.source_layout import SourceLayout
    from ddb_athena.streamed.capture.lambda_handler import handle_stream_event
    from ddb_athena_tests.streamed.test_assets import lambda_event
    from ddb_athena_tests.streamed.test_cycle import stream_records

    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    reviews_table(dynamodb)
    reading_its_stream = streamed_assets(replace(declared("reviews"), capture="run"))
    dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": "scanned"}, "name": {"S": "n"}})
    newest = int(stream_records(settings)[-1]["dynamodb"]["SequenceNumber"])

    def on_cycle(number: int) -> None:
        if number == 1:
            return  # the first cycle bootstraps both tables from their scans
        # In DynamoDB only: were books' stream read by the run, these would reach the table.
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"direct-{number}"}, "name": {"S": "n"}})
        handle_stream_event(lambda_event(f"lambda-{number}", str(newest + 200 + number), "by the Lambda"), s3, SourceLayout(settings.bucket, "books_source"))
        dynamodb.put_item(TableName="reviews", Item={"book_id": {"S": "b"}, "review_id": {"N": str(number)}, "stars": {"N": "4"}})

    run_two_tables(instance, on_cycle, cycles=4, tables=(BOOKS, reading_its_stream), books_capture="lambda")
    books = {row["id"] for row in spark.table(f"{settings.namespace}.books").collect()}
    assert books == {"scanned", "lambda-2", "lambda-3", "lambda-4"}
    assert {review for _, review in rows(spark, f"{settings.namespace}.reviews")} == {2, 3, 4}
