"""The merge's guarantees, on a real local Spark with Iceberg and change files in the S3 emulator."""

import json
from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from ddb_athena.lake import change_merge
from ddb_athena.lake.change_merge import (
    BOOTSTRAP_FILE_PROPERTY,
    STREAM_BATCH_PLAN,
    STREAM_FLOOR_PROPERTY,
    absent_keys_sql,
    table_properties,
    unburied_sql,
)
from ddb_athena.lake.commit_properties import compare_and_set_properties
from ddb_athena.lake.plan_settings import session_settings
from ddb_athena.lake.table_spec import SEQUENCE_COLUMN
from ddb_athena.lib.declarations import declared
from ddb_athena_tests.lake.helpers import T0, ChangeFiles, change


@pytest.fixture
def files(spark, settings) -> ChangeFiles:
    return ChangeFiles(spark, settings)


def test_latest_change_per_key_wins_whatever_the_file_order(files):
    files.write(change(3, "a", name="third"), change(1, "b", "INSERT"))
    files.write(change(1, "a", "INSERT", name="first"), change(2, "a", name="second"))  # captured later, older changes
    result = files.merge()
    assert files.names() == {"a": "third", "b": "b@1"}
    assert (result.rows_written, result.rows_removed, result.records_read) == (2, 0, 4)
    assert files.rows()["a"]["_sequence_number"] == "3".zfill(40)


def test_an_older_change_never_overwrites_a_newer_one(files):
    files.merge([files.write(change(5, "a", name="new"))])
    result = files.merge([files.write(change(4, "a", name="old"))])
    assert files.names() == {"a": "new"} and result.stale_skipped == 1 and result.rows_written == 0


def test_rerunning_a_merge_over_the_same_files_changes_nothing(files):
    keys = [files.write(change(1, "a", "INSERT"), change(2, "b", "INSERT")), files.write(change(3, "a"), change(4, "b", "REMOVE"))]
    files.merge(keys)
    rows = files.rows()
    retry = files.merge(keys)
    assert (retry.stale_skipped, retry.rows_written, retry.rows_removed) == (2, 0, 0)
    assert files.rows() == rows
    # The MERGE decided against the rows it found (the cycle's one scan): its commit adds no file.
    summary = files.spark.sql(f"SELECT summary FROM {files.table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0][0]
    assert (summary.get("added-data-files", "0"), summary.get("added-delete-files", "0")) == ("0", "0"), summary


def test_a_deleted_item_is_never_resurrected_by_replaying_an_older_insert(files):
    insert = files.write(change(1, "a", "INSERT"))
    files.merge([insert])
    files.merge([files.write(change(2, "a", "REMOVE"))])
    assert files.names() == {}
    files.merge([insert])  # a replay of an already-cleaned batch
    late = files.write(change(1, "a", "MODIFY", name="late"), at=T0 - timedelta(hours=1))  # an older change, landing late
    files.merge([late])
    assert files.names() == {}
    files.merge([files.write(change(3, "a", "INSERT", name="back"))])  # a genuine re-insert is newer than the delete
    assert files.names() == {"a": "back"}


def test_the_snapshot_id_reported_is_the_commit_just_made(files):
    """Read from the table's properties, not its snapshots: it must still be the newest commit, every time."""
    for sequence in (1, 2, 3):
        result = files.merge([files.write(change(sequence, "a", "INSERT" if sequence == 1 else "MODIFY"))])
        newest = files.spark.sql(f"SELECT snapshot_id FROM {files.table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0][0]
        assert result.snapshot_id == newest


def test_a_key_deleted_twice_is_guarded_by_its_newest_delete(files):
    """Tombstones are appended, one per delete: what guards a key is the highest of its deletes."""
    files.merge([files.write(change(1, "a", "INSERT"))])
    files.merge([files.write(change(2, "a", "REMOVE"))])
    files.merge([files.write(change(3, "a", "INSERT", name="back"))])
    files.merge([files.write(change(5, "a", "REMOVE"))])
    assert files.spark.table(f"{files.table}_tombstones").where("id = 'a'").count() == 2
    replay = files.merge([files.write(change(4, "a", "MODIFY", name="between the deletes"))])
    assert files.names() == {} and replay.stale_skipped == 1
    files.merge([files.write(change(6, "a", "INSERT", name="after both"))])
    assert files.names() == {"a": "after both"}


def test_a_crash_between_commit_and_cleanup_then_a_retry_leaves_the_table_right(files):
    first = [files.write(change(1, "a", "INSERT"), change(2, "b", "INSERT")), files.write(change(3, "a", "REMOVE"))]
    files.merge(first)  # committed; the run dies before its cleanup
    expected = files.rows()
    files.write(change(4, "c", "INSERT"))  # new changes arrive meanwhile
    retry = files.merge()  # the next run sees the old files and the new one
    assert set(files.names()) == {"b", "c"} and retry.rows_written == 1 and retry.stale_skipped == 2
    assert {k: v for k, v in files.rows().items() if k != "c"} == expected


def test_a_file_that_lands_late_with_an_earlier_name_is_not_lost(files):
    files.write(change(10, "a", "INSERT"))
    files.merge()
    files.delete(files.present())  # cleaned up
    late = files.write(change(5, "z", "INSERT"), at=T0 - timedelta(minutes=30))
    assert files.present() == [late]
    files.merge()
    assert set(files.names()) == {"a", "z"}


def test_bad_input_is_quarantined_with_its_reason_and_the_rest_is_merged(files):
    files.write_raw('{"this is": not json\n')
    good_and_bad = [
        change(1, "good", "INSERT").to_json(),
        json.dumps(
            {
                "event_name": "INSERT",
                "keys": {"other": {"S": "x"}},
                "new_image": {"other": {"S": "x"}},
                "sequence_number": "2",
                "approximate_creation_time": "2026-11-22T03:00:00Z",
            }
        ),
        change(3, "weird", "INSERT", odd={"Q": "1"}).to_json(),
        change(4, "nodate", "INSERT", date={"N": "soon"}).to_json(),
        json.dumps({"event_name": "UPSERT", "keys": {"id": {"S": "u"}}, "sequence_number": "5", "approximate_creation_time": "2026-11-22T03:00:00Z"}),
        change(6, "good2", "INSERT").to_json(),
    ]
    files.write_raw("\n".join(good_and_bad) + "\n")
    result = files.merge()
    assert set(files.names()) == {"good", "good2"}
    assert result.records_quarantined == 5
    reasons = sorted(record["reason"] for record in files.quarantined())
    assert reasons == sorted(
        [
            "not valid JSON",
            "missing key attribute id (S)",
            "a top-level attribute: unknown DynamoDB type tag (expected one of S, N, B, BOOL, NULL, M, L, SS, NS, BS)",
            "a top-level attribute: N is not a number",
            "missing or unknown event_name",
        ]
    )
    assert all(record["source_file"].startswith("s3a://") and record["line"] for record in files.quarantined())
    # The reasons name the problem and where, never the item's data: no attribute name or value reaches the event log.
    assert not [reason for reason in result.quarantine_reasons if "soon" in reason or "UPSERT" in reason or "odd" in reason]


def test_a_key_whose_newest_change_is_quarantined_is_dropped_until_the_change_is_fixed(files):
    files.write(change(1, "held", "INSERT", name="first"), change(1, "other", "INSERT"))
    files.merge()
    # An update the merge can take, then a newer one it cannot: the older would show a state the key has left, and so
    # would the row as it was: the key is dropped, as the quarantine check (red) tells.
    files.write(change(2, "held", name="second"), change(3, "held", date={"N": "soon"}), change(2, "other", name="changed"))
    files.write(change(4, "never-valid", "INSERT", date={"N": "soon"}))
    result = files.merge()
    assert result.records_quarantined == 2 and result.keys_held == 2
    assert files.names() == {"other": "changed"}
    # Not deleted: each held key's tombstone lies just below its quarantined change, so the fixed change, written
    # again, applies, and no older one does.
    tombstones = {(row["id"], int(row["_sequence_number"])) for row in files.spark.table(f"{files.table}_tombstones").collect()}
    assert tombstones == {("held", 2), ("never-valid", 3)}
    files.write(change(3, "held", name="fixed"))
    files.merge()
    assert files.names() == {"other": "changed", "held": "fixed"}


@pytest.mark.parametrize("beside", [False, True], ids=["alone-in-its-cycle", "beside-other-changes"])
def test_a_key_dropped_for_its_quarantined_change_never_comes_back_older_whatever_arrives_late(files, beside):
    """A late file (the capture Lambda's retry, a replay) with an older change of a key whose newest change was
    quarantined: before, `WHEN NOT MATCHED ... INSERT` brought back a state readers had seen replaced. The key is
    dropped alike whether its bad change is alone in its cycle or beside others (before, alone, the old row stayed)."""
    files.write(change(5, "k", "INSERT", name="five"), change(5, "other", "INSERT"))
    files.merge()
    bad = [change(9, "k", date={"N": "soon"})]
    result = files.merge([files.write(*bad, *([change(6, "other", name="six")] if beside else []))])
    assert result.keys_held == 1 and "k" not in files.names()
    for late in (change(4, "k", name="four"), change(8, "k", name="eight"), change(7, "k", "REMOVE")):
        files.merge([files.write(late)])
        assert "k" not in files.names(), late
    files.merge([files.write(change(9, "k", name="nine, fixed"))])
    assert files.names()["k"] == "nine, fixed"
    files.merge([files.write(change(10, "k", name="ten"))])
    assert files.names()["k"] == "ten"


def test_every_attribute_survives_in_the_item_column_and_typed_columns_are_exact(files):
    attributes = {
        "author": {"S": "Ada"},
        "summary": {"S": "s"},
        "date": {"N": "1763780400123456789"},
        "price": {"N": "12345678901234567890.123456789"},
        "cover": {"B": "AAH/"},
        "tags": {"SS": ["x", "y"]},
        "nested": {"M": {"l": {"L": [{"NULL": True}, {"BOOL": False}, {"NS": ["1", "2"]}, {"BS": ["AA=="]}]}}},
    }
    files.write(change(1, "a", "INSERT", name="Name", **attributes))
    files.merge()
    row = files.rows()["a"]
    assert (row["name"], row["author"], row["summary"]) == ("Name", "Ada", "s")
    assert row["published_at"].isoformat() == "2025-11-22T03:00:00.123456"  # nanoseconds truncated to micros (UTC)
    assert json.loads(row["item"]) == {"id": {"S": "a"}, "name": {"S": "Name"}, **attributes}


def test_a_bootstrap_snapshot_replaces_what_came_before_and_later_changes_apply_on_top(files):
    files.write(change(1, "gone", "INSERT"), change(2, "a", "INSERT", name="before-scan"))
    files.merge()
    files.delete(files.present())
    stale = files.write(change(3, "a", name="captured-before-the-scan"))
    # The scan starts after the stream's record 3: its rows rank there (the stream's end before it).
    snapshot = files.write(*[change(3, book_id, "SNAPSHOT", name="scanned") for book_id in ("a", "b", "c")], kind="snapshot")
    late = files.write(change(3, "a", name="captured-before-the-scan"), change(2, "gone", "INSERT"))  # older than the scan, filed after it
    files.write(change(4, "b", "REMOVE"), change(5, "c", name="after-scan"))
    result = files.merge()
    assert files.names() == {"a": "scanned", "c": "after-scan"}
    assert result.bootstrap_file == snapshot.rsplit("/", 1)[-1] and result.records_superseded == 3
    assert (result.rows_written, result.rows_removed) == (2, 2)  # a and c written; the replaced table's a and "gone" removed
    properties = {row["key"]: row["value"] for row in files.spark.sql(f"SHOW TBLPROPERTIES {files.table}").collect()}
    assert properties[BOOTSTRAP_FILE_PROPERTY] == result.bootstrap_file
    assert properties[STREAM_FLOOR_PROPERTY] == "3".zfill(40)
    # Changes from before the scan never apply again, in whatever file they come, even if a cleanup left them behind.
    files.merge([stale, snapshot, late])
    assert files.names() == {"a": "scanned", "c": "after-scan"}


def test_a_stream_batch_is_merged_with_its_plan_settings_and_the_session_keeps_its_own(files, monkeypatch):
    at_merge = []
    apply = change_merge._apply

    def recording(*args):
        at_merge.append({name: files.spark.conf.get(name) for name in STREAM_BATCH_PLAN})
        return apply(*args)

    monkeypatch.setattr(change_merge, "_apply", recording)
    sessions_own = {name: files.spark.conf.get(name) for name in STREAM_BATCH_PLAN}
    assert sessions_own != STREAM_BATCH_PLAN
    files.write(change(1, "a", "INSERT"), change(2, "b", "INSERT"))
    assert files.merge().rows_written == 2
    assert at_merge == [STREAM_BATCH_PLAN]
    assert {name: files.spark.conf.get(name) for name in STREAM_BATCH_PLAN} == sessions_own


def _explained_merges(files, monkeypatch) -> list[str]:
    """The plan of every MERGE a cycle runs, from here on."""
    plans = []
    build = change_merge.merge_sql

    def explained(*args):
        sql = build(*args)
        plans.append(files.spark.sql(f"EXPLAIN {sql}").collect()[0][0])
        return sql

    monkeypatch.setattr(change_merge, "merge_sql", explained)
    return plans


def test_a_large_tables_cycle_broadcasts_its_changes_into_the_tables_scan_and_appends_the_new_keys(files, monkeypatch):
    """A cycle's cost follows its changes: its MERGE streams the table past the broadcast batch. A MERGE that also
    inserted is an outer join Spark cannot broadcast, which shuffled and sorted every key of the table each cycle."""
    monkeypatch.setattr(change_merge, "ONE_MERGE_BELOW_ROWS", 0)
    plans, sizes, explained = _explained_merges(files, monkeypatch), [], change_merge.merge_sql

    def sized(spec, table, view, insert_new):
        """The batch's size as the MERGE is planned, and once computed: Spark knows a cached batch's size only then."""
        planned = files.spark.table(view)._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()
        files.spark.table(view).count()
        sizes.append((planned, files.spark.table(view)._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
        return explained(spec, table, view, insert_new)

    monkeypatch.setattr(change_merge, "merge_sql", sized)
    files.merge([files.write(*[change(number, f"k{number}", "INSERT") for number in range(1, 5)])])
    commits = files.spark.table(f"{files.table}.snapshots").count()
    result = files.merge([files.write(change(10, "k1", "MODIFY", name="new"), change(11, "k2", "REMOVE"), change(12, "k9", "INSERT"))])
    assert files.names() == {"k1": "new", "k3": "k3@3", "k4": "k4@4", "k9": "k9@12"}
    assert (result.rows_written, result.rows_removed, result.stale_skipped) == (2, 2, 0)
    assert files.spark.table(f"{files.table}.snapshots").count() == commits + 2  # the MERGE and the append
    # The batch is broadcast by its exact size, never the table (at 10 GB an estimate sorted the table instead).
    assert sizes[-1][0] == sizes[-1][1], sizes
    broadcast = plans[-1].split("BroadcastExchange", 1)[-1]
    assert "InMemoryTableScan" in broadcast and "BatchScan" not in broadcast and "SortMergeJoin" not in plans[-1], plans[-1]


def test_a_large_tables_lookup_of_the_keys_to_append_reads_only_files_as_new_as_its_batch(files, monkeypatch):
    """After the MERGE of the keys held, a key the table holds has a row as new as its change: the keys to append are
    found among the rows as new as the batch, and Iceberg skips every older file by its sequence numbers' exact bounds.
    The table is scanned once a cycle, by the MERGE. An older file, gone from storage, would fail the lookup."""
    monkeypatch.setattr(change_merge, "ONE_MERGE_BELOW_ROWS", 0)
    files.merge([files.write(change(1, "a", "INSERT"), change(2, "b", "INSERT"))])
    [older] = [row["file_path"] for row in files.spark.sql(f"SELECT file_path FROM {files.table}.files").collect()]
    files.merge([files.write(change(10, "a", name="new"), change(12, "c", "INSERT"))])  # a MERGE's file and an append's
    table = files.spark.table(files.table)
    held = files.spark.createDataFrame(table.where("id IN ('a', 'c')").collect(), table.schema)
    batch = held.unionByName(held.where("id = 'a'").withColumn("id", F.lit("d")).withColumn(SEQUENCE_COLUMN, F.lit("13".zfill(40))))
    batch.withColumn("event_name", F.lit("MODIFY")).withColumn("_buried", F.lit(False)).createOrReplaceTempView("books_changes")
    Path(older.removeprefix("file:")).unlink()
    absent = files.spark.sql(absent_keys_sql(declared("books").spec, "books_changes", files.table), args={"oldest": "10".zfill(40)})
    assert [row["id"] for row in absent.collect()] == ["d"]


def test_a_large_tables_batch_of_only_new_keys_commits_an_empty_merge_and_appends_them(files, monkeypatch):
    """The MERGE of the keys held runs before anything knows whether the table holds any (that would be a second
    scan): for a batch of keys all new it commits a snapshot with no file, and the append writes every row. A delete
    of a key never written is buried in the tombstones, not appended."""
    monkeypatch.setattr(change_merge, "ONE_MERGE_BELOW_ROWS", 0)
    files.merge([files.write(change(1, "a", "INSERT"))])
    commits = files.spark.table(f"{files.table}.snapshots").count()
    result = files.merge([files.write(change(2, "b", "INSERT"), change(3, "c", "INSERT"), change(4, "ghost", "REMOVE"))])
    assert files.names() == {"a": "a@1", "b": "b@2", "c": "c@3"}
    assert (result.rows_written, result.rows_removed) == (2, 0)
    merge, append = [row["summary"] for row in files.spark.sql(f"SELECT summary FROM {files.table}.snapshots ORDER BY committed_at").collect()[commits:]]
    assert (merge.get("added-data-files", "0"), merge.get("added-delete-files", "0"), merge.get("added-records", "0")) == ("0", "0", "0"), merge
    assert (append["added-data-files"], append["added-records"]) == ("1", "2"), append


def test_a_small_tables_cycle_is_one_merge_that_inserts_too(files, monkeypatch):
    """Below ONE_MERGE_BELOW_ROWS sorting the table's keys costs less than a second scan and commit: one MERGE."""
    files.merge([files.write(change(1, "a", "INSERT"))])
    monkeypatch.setattr(change_merge, "ONE_MERGE_BELOW_ROWS", 2)
    plans = _explained_merges(files, monkeypatch)
    commits = files.spark.table(f"{files.table}.snapshots").count()
    result = files.merge([files.write(change(2, "a", name="new"), change(3, "b", "INSERT"))])
    assert files.names() == {"a": "new", "b": "b@3"} and (result.rows_written, result.rows_removed) == (2, 1)
    assert len(plans) == 1 and files.spark.table(f"{files.table}.snapshots").count() == commits + 1
    # Two rows now: the next cycle's batch is a large table's, a MERGE of the keys held and an append.
    files.merge([files.write(change(4, "b", name="newer"), change(5, "c", "INSERT"))])
    assert files.names() == {"a": "new", "b": "newer", "c": "c@5"}
    assert len(plans) == 2 and files.spark.table(f"{files.table}.snapshots").count() == commits + 3


def test_a_bootstrap_rebuild_keeps_the_sessions_plan_settings(files, monkeypatch):
    at_rebuild = []
    rebuild = change_merge._rebuild

    def recording(spark, *args):
        at_rebuild.append({name: spark.conf.get(name) for name in STREAM_BATCH_PLAN})
        return rebuild(spark, *args)

    monkeypatch.setattr(change_merge, "_rebuild", recording)
    sessions_own = {name: files.spark.conf.get(name) for name in STREAM_BATCH_PLAN}
    assert sessions_own != STREAM_BATCH_PLAN
    files.write(*[change(0, book_id, "SNAPSHOT") for book_id in ("a", "b")], kind="snapshot")
    assert files.merge().bootstrap_file
    assert at_rebuild == [sessions_own]  # the whole table: the session's partitions and adaptive execution


def test_a_file_that_lands_while_a_merge_runs_survives_its_cleanup_and_is_merged_next(files):
    from ddb_athena.streamed.capture.commit_manifests import delete_committed_files, write_commit_manifest

    files.write(change(1, "a", "INSERT"))
    listed = files.present()  # the merge's file set, taken at its start
    during = files.write(change(2, "b", "INSERT"))  # lands after the listing, before the commit
    result = files.merge(listed)
    manifest = write_commit_manifest(files.s3, files.layout, "run-1", listed, files.table, result.snapshot_id)
    delete_committed_files(files.s3, files.layout.bucket, manifest)
    assert files.present() == [during] and set(files.names()) == {"a"}
    files.merge()
    assert set(files.names()) == {"a", "b"}


def test_a_run_that_dies_between_the_tombstone_and_the_merge_never_applies_a_change_older_than_the_delete(files, monkeypatch):
    """The delete's tombstone is committed, its MERGE is not: the row is still there, older than the delete."""
    from ddb_athena.lake import change_merge

    files.merge([files.write(change(1, "a", "INSERT"))])
    delete = files.write(change(3, "a", "REMOVE"))

    def dies(*_):
        raise RuntimeError("the run dies before its MERGE")

    monkeypatch.setattr(change_merge, "merge_sql", dies)
    with pytest.raises(RuntimeError):
        files.merge([delete])
    monkeypatch.undo()
    assert files.names() == {"a": "a@1"}
    # With a change that does apply, so that the MERGE runs.
    late = files.merge([files.write(change(2, "a", "MODIFY", name="before the delete"), change(4, "b", "INSERT"))])
    assert files.names() == {"a": "a@1", "b": "b@4"} and (late.stale_skipped, late.rows_written) == (1, 1)
    retry = files.merge([delete])
    assert files.names() == {"b": "b@4"} and retry.rows_removed == 1


def test_a_warm_session_merges_without_generating_code_again(files):
    """A sync run repeats one cycle's queries every few seconds: once warm, none is compiled to Java again."""
    compilations = files.spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def cycle(sequence: int) -> None:
        # An insert, an update and a delete: every query a cycle can run.
        files.merge(
            [
                files.write(
                    change(sequence, f"new-{sequence}", "INSERT"), change(sequence, f"new-{sequence - 1}"), change(sequence, f"new-{sequence - 2}", "REMOVE")
                )
            ]
        )

    for sequence in range(1, 5):
        cycle(sequence)
    before = compilations.getCount()
    cycle(5)
    assert compilations.getCount() == before


def test_a_merge_like_the_last_one_generates_no_new_code(files):
    """The merge time changes every cycle; as a literal it would be inlined into the generated Java, and each
    merge would compile (and the JVM then JIT) new classes."""
    compilations = files.spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    files.merge([files.write(change(1, "a", "INSERT"))])
    for sequence in (2, 3):
        files.merge([files.write(change(sequence, "a", name=f"v{sequence}"))])
    before = compilations.getCount()
    files.merge([files.write(change(4, "a", name="v4"))])
    assert compilations.getCount() == before
    assert files.names() == {"a": "v4"}


def test_a_commit_writes_one_delete_file_however_many_data_files_its_changes_touch(files):
    # Three commits, each adding a data file; the fourth updates a row of each: one position-delete file, not three.
    for sequence, book_id in enumerate("abc", start=1):
        files.merge([files.write(change(sequence, book_id, "INSERT"))])
    files.merge([files.write(*(change(10 + n, book_id, name=f"{book_id} again") for n, book_id in enumerate("abc")))])
    summary = files.spark.sql(f"SELECT summary FROM {files.table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0][0]
    assert (summary["added-data-files"], summary["added-position-delete-files"]) == ("1", "1"), summary
    assert files.names() == {"a": "a again", "b": "b again", "c": "c again"}


def _scan_metrics(executed, table: str) -> dict[str, int]:
    """The Iceberg scan metrics of `table`'s scan in an executed DataFrame's plan (what Spark's UI shows)."""
    leaves = executed._jdf.queryExecution().executedPlan().collectLeaves()
    for index in range(leaves.size()):
        leaf = leaves.apply(index)
        if f"{table} " in leaf.simpleString(500):
            metrics, values = leaf.metrics().iterator(), {}
            while metrics.hasNext():
                entry = metrics.next()
                values[entry._1()] = entry._2().value()
            return values
    raise AssertionError(f"no scan of {table} in the plan")


def test_the_lookup_of_deletes_reads_only_the_tombstone_files_as_new_as_the_batch(files):
    # Five cycles' deletes, a file each (a day's retention of them, in small); then a change older than the newest
    # delete of its key comes back.
    for sequence, book_id in enumerate("abcde", start=1):
        files.merge([files.write(change(sequence, book_id, "INSERT"))])
    for sequence, book_id in enumerate("abcde", start=10):
        files.merge([files.write(change(sequence, book_id, "REMOVE"))])
    latest = files.spark.createDataFrame([("e", "MODIFY", "13".zfill(40), False)], f"id string, event_name string, {SEQUENCE_COLUMN} string, _held boolean")
    latest.createOrReplaceTempView("replayed_changes")
    with session_settings(files.spark, STREAM_BATCH_PLAN):
        classified = files.spark.sql(unburied_sql(declared("books").spec, "replayed_changes", f"{files.table}_tombstones"), args={"oldest": "13".zfill(40)})
        assert [row["_buried"] for row in classified.collect()] == [True]
    scan = _scan_metrics(classified, f"{files.table}_tombstones")
    # The deletes at 13 and 14 could be newer than the change; the three older files are not read at all.
    assert (scan["resultDataFiles"], scan["skippedDataFiles"]) == (2, 3), scan


def test_the_stream_floor_is_never_lowered_by_a_writer_resumed_between_its_read_and_its_set(files):
    """A bootstrap's writer reads the floor, is frozen, and resumes after a newer bootstrap raised it: the
    compare-and-set fails on the newer metadata, reads it again, and leaves the newer floor (an ALTER TABLE would have
    re-applied the lower one)."""
    files.write(change(1, "a", "INSERT"))
    files.merge()
    spark, older, newer = files.spark, "5".zfill(40), "9".zfill(40)
    seen = []

    def frozen_then_resumed(current):
        seen.append(current.get(STREAM_FLOOR_PROPERTY))
        if len(seen) == 1:  # meanwhile, the newer bootstrap sets its floor
            spark.sql(f"ALTER TABLE {files.table} SET TBLPROPERTIES ('{STREAM_FLOOR_PROPERTY}' = '{newer}')")
        return {STREAM_FLOOR_PROPERTY: older} if older >= (current.get(STREAM_FLOOR_PROPERTY) or "") else None

    assert not compare_and_set_properties(spark, files.table, frozen_then_resumed)
    assert seen == [None, newer]
    assert table_properties(spark, files.table)[STREAM_FLOOR_PROPERTY] == newer
    assert compare_and_set_properties(spark, files.table, lambda current: {STREAM_FLOOR_PROPERTY: "a higher one"})
    assert table_properties(spark, files.table)[STREAM_FLOOR_PROPERTY] == "a higher one"
