from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from ddb_athena.lake import maintenance
from ddb_athena.lake.change_merge import STREAM_POSITIONS_PROPERTY, merge_change_files, tombstone_table
from ddb_athena.lake.commit_properties import empty_commit, iceberg_table, newest_published
from ddb_athena.lake.maintenance import (
    MaintenanceState,
    TableTotals,
    compact,
    compact_if_due,
    maintain_table,
    maintenance_state,
    record_maintained,
    rewrite_deleted_rows,
    table_totals,
    trim_history,
)
from ddb_athena.lake.writer_branch import FENCE_EPOCH_PROPERTY, MainMovedError, WriterBranch, WriterFencedError
from ddb_athena.lib.declarations import declared
from ddb_athena_tests.books_and_orders import books_maintenance
from ddb_athena_tests.dagster_helpers import local_resources
from ddb_athena_tests.lake.helpers import ChangeFiles, change, plant_file
from ddb_athena_tests.lake.test_schema_evolution import read_by_pyiceberg


def test_maintenance_compacts_keeps_recent_snapshots_and_prunes_only_old_tombstones(spark, settings):
    files = ChangeFiles(spark, settings)
    for batch in range(3):
        files.merge([files.write(*[change(batch * 10 + i, f"k{batch}{i}", "INSERT") for i in range(3)])])
    now = datetime.now(UTC)
    # Stamped now, as the stream stamps a delete: its tombstone's age counts from today, not from the helper's fixed
    # date (which made this test fail from seven days after it).
    removal = replace(change(100, "k00", "REMOVE"), approximate_creation_time=now.isoformat(timespec="microseconds").replace("+00:00", "Z"))
    files.merge([files.write(removal)])
    snapshots = spark.table(f"{files.table}.snapshots").count()

    kept = maintain_table(spark, "lake", files.table, timedelta(hours=6), 1, timedelta(days=3), timedelta(days=7), now=now)
    assert kept.rewritten_data_files >= 3 and kept.expired_snapshots == 0 and kept.pruned_tombstones == 0
    # No tombstone past its retention: none read, nothing committed but the tombstones' own compaction.
    assert _operations(spark, tombstone_table(files.table)) <= {"append", "replace"}
    assert spark.table(f"{files.table}.snapshots").count() == snapshots + 1  # + the compaction
    assert len(files.names()) == 8

    # Past its retention, pruned by the daily sweep's pass, not by the passes between (they read no manifest for it).
    eight_days_later = now + timedelta(days=8)
    retentions = (timedelta(hours=6), 1, timedelta(days=3), timedelta(days=7))
    unswept = maintain_table(spark, "lake", files.table, *retentions, now=eight_days_later, remove_orphans=False)
    assert unswept.expired_snapshots >= snapshots and unswept.pruned_tombstones is None
    assert spark.table(tombstone_table(files.table)).count() == 1
    later = maintain_table(spark, "lake", files.table, *retentions, now=eight_days_later)
    assert later.pruned_tombstones == 1
    assert spark.table(tombstone_table(files.table)).count() == 0 and len(files.names()) == 8
    assert _operations(spark, tombstone_table(files.table)) & {"delete", "overwrite"}


def _operations(spark, table: str) -> set[str]:
    return {row["operation"] for row in spark.sql(f"SELECT operation FROM {table}.snapshots").collect()}


def _files(spark, table: str) -> dict[int, int]:
    """Live files by content: 0 data, 1 position deletes."""
    return {row["content"]: row["count"] for row in spark.sql(f"SELECT content, count(*) AS count FROM {table}.files GROUP BY content").collect()}


def test_compaction_merges_delete_files_and_rewrites_the_data_they_apply_to_only_once_they_delete_a_large_share(spark, settings):
    files = ChangeFiles(spark, settings)
    files.merge([files.write(*[change(i, f"k{i:03}", "INSERT") for i in range(100)])])
    compact(spark, "lake", files.table)  # one data file of 100 rows
    for number in range(3):  # three commits, each with its own position delete file: 3 of 100 rows deleted
        files.merge([files.write(change(200 + number, f"k{number:03}", "REMOVE"))])
    data_file = spark.sql(f"SELECT file_path FROM {files.table}.files WHERE content = 0").collect()
    assert _files(spark, files.table) == {0: 1, 1: 3}

    few = compact(spark, "lake", files.table)
    # Readers now read one delete file; the data file, 97 of its 100 rows live, is not rewritten.
    assert (few.rewritten_data_files, few.rewritten_delete_files) == (0, 3) and _files(spark, files.table) == {0: 1, 1: 1}
    assert spark.sql(f"SELECT file_path FROM {files.table}.files WHERE content = 0").collect() == data_file

    files.merge([files.write(*[change(300 + i, f"k{i:03}", "REMOVE") for i in range(3, 25)])])  # 25 of 100 deleted
    many = compact(spark, "lake", files.table)
    assert many.rewritten_data_files == 1 and _files(spark, files.table) == {0: 1}  # rewritten without them
    assert spark.table(files.table).count() == 75
    # Done once: no delete left to count against the new file, so the next pass rewrites nothing again.
    assert compact(spark, "lake", files.table).rewritten_data_files == 0


def _data_files_oldest_first(spark, table: str) -> list[tuple[str, int]]:
    """(path, bytes) of the live data files, by data sequence number (then path, as the rewrite orders them)."""
    rows = spark.sql(
        f"SELECT data_file.file_path AS path, data_file.file_size_in_bytes AS size, sequence_number FROM {table}.entries "
        "WHERE status < 2 AND data_file.content = 0"
    ).collect()
    return [(row["path"], row["size"]) for row in sorted(rows, key=lambda row: (row["sequence_number"], row["path"]))]


def test_deleted_rows_go_a_slice_at_a_time_the_oldest_files_first_none_twice_and_every_reader_sees_the_same_rows(spark, settings):
    """A slice rewrites what fits the cycle's spare time; Iceberg's own cap (max-files-to-rewrite) took the file it had
    just written again, first, so a table's files were rewritten over and over while the oldest kept their deletes."""
    files = ChangeFiles(spark, settings)
    for batch in range(4):  # four data files of 10 rows, a commit each
        files.merge([files.write(*[change(batch * 10 + i, f"k{batch}{i}", "INSERT") for i in range(10)])])
    removed = [(batch, i) for batch in range(4) for i in range(3)]  # 12 of 40 rows, 3 in each file: due, not overdue
    files.merge([files.write(*[change(100 + n, f"k{batch}{i}", "REMOVE") for n, (batch, i) in enumerate(removed)])])
    oldest = _data_files_oldest_first(spark, files.table)
    expected = files.rows()
    assert len(oldest) == 4 and len(expected) == 28

    # No spare time and not overdue: nothing to do, not even a look at the files.
    assert compact_if_due(spark, "lake", files.table, file_threshold=100, deleted_rows_bytes=0) is None
    one = max(size for _, size in oldest)  # room for one file, not two
    first = compact_if_due(spark, "lake", files.table, file_threshold=100, deleted_rows_bytes=one)
    assert (first.deleted_rows_files, first.deleted_rows_bytes, first.rewritten_delete_files) == (1, oldest[0][1], 1)
    after_first = _data_files_oldest_first(spark, files.table)
    assert oldest[0] not in after_first and oldest[1:] == after_first[:3]  # the new file comes last
    second = compact_if_due(spark, "lake", files.table, file_threshold=100, deleted_rows_bytes=one)
    after_second = _data_files_oldest_first(spark, files.table)
    assert second.deleted_rows_files == 1 and oldest[1] not in after_second and after_first[3] in after_second
    # 6 of 34 rows deleted now (the merge dropped the positions in the files rewritten): under a fifth, no slice.
    assert table_totals(spark, files.table).deleted_share < 0.2
    assert compact_if_due(spark, "lake", files.table, file_threshold=100, deleted_rows_bytes=10 * one) is None
    assert files.rows() == expected
    assert {book_id: row["name"] for book_id, row in read_by_pyiceberg(settings, files.table).items()} == files.names()


def test_overdue_deleted_rows_go_even_with_no_spare_time_one_file_at_least(spark, settings):
    files = ChangeFiles(spark, settings)
    for batch in range(2):
        files.merge([files.write(*[change(batch * 10 + i, f"k{batch}{i}", "INSERT") for i in range(10)])])
    files.merge([files.write(*[change(100 + i, f"k0{i}", "REMOVE") for i in range(9)])])  # 9 of 20: 45%, overdue
    oldest = _data_files_oldest_first(spark, files.table)
    done = compact_if_due(spark, "lake", files.table, file_threshold=100, deleted_rows_bytes=0)
    assert done.deleted_rows_files == 1 and oldest[0] not in _data_files_oldest_first(spark, files.table)
    assert spark.table(files.table).count() == 11 and table_totals(spark, files.table).position_deletes == 0


def test_deleted_rows_of_a_partitioned_table_are_rewritten_out_of_files_of_several_partitions_at_once(spark, settings):
    table = f"lake.{settings.namespace}.partitioned"
    spark.sql(
        f"CREATE TABLE {table} (id bigint, day string) USING iceberg PARTITIONED BY (day) TBLPROPERTIES ('format-version'='2', "
        "'write.delete.mode'='merge-on-read', 'write.delete.granularity'='partition')"
    )
    for day in ("a", "b"):
        spark.sql(f"INSERT INTO {table} SELECT id, '{day}' FROM range(10)")
    spark.sql(f"DELETE FROM {table} WHERE id < 3")  # 6 of 20 rows, 3 in each partition
    assert rewrite_deleted_rows(spark, f"{settings.namespace}.partitioned", byte_budget=None)[0] == 2
    assert sorted(tuple(row) for row in spark.table(table).collect()) == sorted((i, day) for day in ("a", "b") for i in range(3, 10))


def test_a_slice_is_refused_when_rows_of_its_files_were_deleted_while_it_was_written_and_none_comes_back(spark, settings, monkeypatch):
    """One fenced writer compacts between its merges, so nothing should commit beside a slice; if something did (a
    writer that lost its fence, a hand-run DELETE), the rewritten files would bring its deleted rows back. The commit
    is validated from the snapshot the slice was planned on and refused."""
    files = ChangeFiles(spark, settings)
    files.merge([files.write(*[change(i, f"k{i}", "INSERT") for i in range(10)])])
    files.merge([files.write(*[change(100 + i, f"k{i}", "REMOVE") for i in range(3)])])  # 3 of 10: due
    coordinator = maintenance._instance(spark, "FileRewriteCoordinator")

    class DeleteWhileWriting:
        """The coordinator, with a delete of another row committed once the slice's files are written."""

        def fetchNewFiles(self, table, group):  # noqa: N802 (the Java method's name)
            spark.sql(f"DELETE FROM {files.table} WHERE id = 'k5'")
            return coordinator.fetchNewFiles(table, group)

        def __getattr__(self, name):
            return getattr(coordinator, name)

    real_instance = maintenance._instance
    monkeypatch.setattr(maintenance, "_instance", lambda spark, name: DeleteWhileWriting() if name == "FileRewriteCoordinator" else real_instance(spark, name))
    before = _data_files_oldest_first(spark, files.table)
    with pytest.raises(Exception, match="found new delete for replaced data file"):
        rewrite_deleted_rows(spark, files.table, byte_budget=None)
    assert _data_files_oldest_first(spark, files.table) == before  # nothing replaced
    assert sorted(files.rows()) == sorted(f"k{i}" for i in range(10) if i not in (0, 1, 2, 5))
    assert sorted(read_by_pyiceberg(settings, files.table)) == sorted(f"k{i}" for i in range(10) if i not in (0, 1, 2, 5))


def test_the_sync_compacts_once_readers_open_the_threshold_of_files_counted_from_the_commits_own_summary(spark, settings):
    files = ChangeFiles(spark, settings)
    files.merge([files.write(*[change(i, f"k{i:03}", "INSERT") for i in range(10)])])
    for number in range(3):  # each a commit with a data file and a delete file: an update, as a sync cycle makes
        files.merge([files.write(change(100 + number, f"k{number:03}", "MODIFY"))])
    totals = table_totals(spark, files.table)
    counted = _files(spark, files.table)
    # The summary says what the table's files say, without reading a manifest.
    assert (totals.data_files, totals.delete_files, totals.records, totals.position_deletes) == (counted[0], counted[1], 13, 3)
    assert totals.surplus_data_files() == 3 and totals.compaction_due(3) and not totals.compaction_due(4)

    # Not due yet (3 of 13 rows deleted is due for a rewrite, but this cycle has no time to spare and it is not overdue).
    assert compact_if_due(spark, "lake", files.table, file_threshold=4, deleted_rows_bytes=0) is None
    assert _files(spark, files.table) == counted
    done = compact_if_due(spark, "lake", files.table, file_threshold=3)
    # The file the three updates deleted from, rewritten for its deleted rows (a fifth of the table's), then the four
    # small ones packed into one.
    assert done is not None and (done.deleted_rows_files, done.rewritten_data_files) == (1, 5)
    after = table_totals(spark, files.table)
    assert (after.data_files, after.delete_files, after.records) == (1, 0, 10) and not after.compaction_due(2)
    assert spark.table(files.table).count() == 10


def test_table_totals_of_a_summary_without_them_call_for_no_compaction():
    assert not TableTotals.of({}).compaction_due(2)


def test_after_a_compaction_the_files_it_left_are_no_surplus():
    """A 10 GB table compacted into 170 files of ~60 MB needs 160 by its size: counted from its size alone, it would be
    due at every cycle, each compaction rewriting nothing."""
    totals = TableTotals(data_files=170 + 3, delete_files=1, records=10**7, position_deletes=0, files_bytes=10 * 1024**3)
    assert totals.compaction_due(8) and not totals.compaction_due(8, settled=170) and totals.compaction_due(3, settled=170)


def test_compaction_leaves_files_near_their_target_size_and_packs_the_small_ones(spark, settings, monkeypatch):
    """Iceberg's default takes every file under 3/4 of the target: the files its own rewrite leaves (a table's bytes
    split evenly over them) were rewritten again at every compaction, a 1 GB table whole each time."""
    from ddb_athena.lake import maintenance

    files = ChangeFiles(spark, settings)
    files.merge([files.write(*[change(i, f"k{i:04}", "INSERT") for i in range(2000)])])
    ((medium, size),) = spark.sql(f"SELECT file_path, file_size_in_bytes FROM {files.table}.files").collect()
    monkeypatch.setattr(maintenance, "TARGET_FILE_BYTES", int(size * 1.6))  # the file is at 5/8 of the target
    for number in range(2):
        files.merge([files.write(change(3000 + number, f"small{number}", "INSERT"))])
    done = compact(spark, "lake", files.table)
    assert (done.rewritten_data_files, done.added_data_files, done.data_files_after) == (2, 1, 2)
    assert medium in {row[0] for row in spark.sql(f"SELECT file_path FROM {files.table}.files").collect()}
    assert spark.table(files.table).count() == 2002


def test_the_tombstone_table_is_compacted_and_expired_with_its_table(spark, settings):
    """Every delete appends a tombstone file and a snapshot: upkeep keeps the tombstone table bounded too."""
    files = ChangeFiles(spark, settings)
    files.merge([files.write(*[change(i, f"k{i}", "INSERT") for i in range(4)])])
    for i in range(4):
        files.merge([files.write(change(10 + i, f"k{i}", "REMOVE"))])
    tombstones = tombstone_table(files.table)
    assert spark.table(f"{tombstones}.files").count() == 4 and spark.table(f"{tombstones}.snapshots").count() == 4
    # Compaction of the table leaves them (the sync asks for each of the two on its own).
    compact_if_due(spark, "lake", files.table, file_threshold=1)
    assert spark.table(f"{tombstones}.files").count() == 4
    later = datetime.now(UTC) + timedelta(days=1)
    maintain_table(spark, "lake", files.table, timedelta(hours=6), 1, timedelta(days=3), timedelta(days=30), now=later)
    assert spark.table(f"{tombstones}.files").count() == 1 and spark.table(f"{tombstones}.snapshots").count() == 1
    assert spark.table(tombstones).count() == 4  # none past the 30-day tombstone retention


def test_the_maintenance_job_records_what_it_did_on_the_asset(spark, settings):
    files = ChangeFiles(spark, settings)
    for batch in range(2):
        files.merge([files.write(change(batch + 1, f"k{batch}", "INSERT"))])
    result = books_maintenance.execute_in_process(resources=local_resources())
    (observation,) = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    metadata = observation.event_specific_data.asset_observation.metadata
    assert metadata["maintenance_rewritten_data_files"].value >= 2
    assert metadata["maintenance_before_data_files"].value >= 2 and metadata["maintenance_after_data_files"].value == 1


def test_retentions_below_their_floors_are_refused_clearly(spark, settings):
    from pydantic import ValidationError

    from ddb_athena.lake.maintenance import MaintenanceSettingsError
    from ddb_athena.lib.resources import SyncSettings

    files = ChangeFiles(spark, settings)
    files.merge([files.write(change(1, "k", "INSERT"))])
    with pytest.raises(MaintenanceSettingsError, match="shorter than 1:00:00.*longest query"):
        maintain_table(spark, "lake", files.table, timedelta(minutes=30), 1, timedelta(days=3))
    with pytest.raises(MaintenanceSettingsError, match="under 1 day.*still being written"):
        maintain_table(spark, "lake", files.table, timedelta(hours=1), 1, timedelta(hours=12))
    for bad in ({"snapshot_retention_hours": 0.5}, {"orphan_file_age_days": 0.5}):
        with pytest.raises(ValidationError):
            SyncSettings(bucket="b", **bad)


def test_orphan_files_go_once_older_than_their_age_and_a_recent_one_stays(spark, settings):
    files = ChangeFiles(spark, settings)
    files.merge([files.write(change(1, "k", "INSERT"))])
    old = plant_file(spark, files.table, "left-by-a-crashed-writer.parquet", age_days=5)
    recent = plant_file(spark, files.table, "being-written-now.parquet")
    result = maintain_table(spark, "lake", files.table, timedelta(hours=1), 1, timedelta(days=3))
    assert result.orphan_files_removed == 1 and not old.exists() and recent.exists()
    assert files.names() == {"k": "k@1"}


def test_a_pass_told_not_to_list_orphans_leaves_them_and_records_no_sweep(spark, settings):
    files = ChangeFiles(spark, settings)
    files.merge([files.write(change(1, "k", "INSERT"))])
    old = plant_file(spark, files.table, "left-by-a-crashed-writer.parquet", age_days=5)
    skipped = maintain_table(spark, "lake", files.table, timedelta(hours=1), 1, timedelta(days=3), remove_orphans=False)
    assert skipped.orphan_files_removed is None and old.exists()
    assert skipped.metadata()["orphans_swept"] is False and "orphan_files_removed" not in skipped.metadata()
    at = datetime(2026, 11, 24, 12, tzinfo=UTC)
    record_maintained(spark, files.table, skipped, at)
    assert maintenance_state(spark, files.table) == MaintenanceState(at, None)

    swept = maintain_table(spark, "lake", files.table, timedelta(hours=1), 1, timedelta(days=3))
    assert swept.orphan_files_removed == 1 and not old.exists() and swept.metadata()["orphans_swept"] is True
    later = at + timedelta(minutes=15)
    record_maintained(spark, files.table, swept, later)
    state = maintenance_state(spark, files.table)
    assert state == MaintenanceState(later, later)
    assert not state.orphan_sweep_due(timedelta(hours=24), later + timedelta(hours=23))
    assert state.orphan_sweep_due(timedelta(hours=24), later + timedelta(hours=24))


def test_old_metadata_files_are_deleted_at_commit_so_their_count_stays_bounded(spark, settings):
    from pathlib import Path

    from ddb_athena.lake.table_spec import set_properties_sql

    files = ChangeFiles(spark, settings)
    files.merge([files.write(change(1, "k", "INSERT"))])
    for commit in range(30):  # each property change is a commit with a new metadata.json
        spark.sql(set_properties_sql(files.table, {"ddb_athena.test-commit": str(commit)}))
    location = spark.sql(f"DESCRIBE TABLE EXTENDED {files.table}").where("col_name = 'Location'").collect()[0]["data_type"]
    versions = list((Path(location.removeprefix("file:")) / "metadata").glob("*.metadata.json"))
    assert 30 > len(versions) <= 21  # previous-versions-max (20) and the current one


def test_manifests_are_merged_at_commit_so_a_query_reads_few_of_them(spark, settings):
    """Without merging, each of these commits would add a manifest that every later query reads."""
    files = ChangeFiles(spark, settings)
    for sequence in range(1, 13):
        files.merge([files.write(change(sequence, f"k{sequence % 3}", "INSERT" if sequence <= 3 else "MODIFY"))])
    manifests = spark.sql(f"SELECT content FROM {files.table}.manifests").collect()
    assert len(manifests) <= 2, manifests  # one of data files, one of delete files
    assert files.names() == {"k0": "k0@12", "k1": "k1@10", "k2": "k2@11"}


def test_a_table_and_its_tombstones_created_before_their_properties_take_them_at_the_next_run(spark, settings):
    """Upkeep's properties, and the sequence numbers' exact bounds a large table's lookup of new keys prunes by."""
    from ddb_athena.lake.change_merge import ensure_tables, table_properties
    from ddb_athena.lake.table_spec import METADATA_UPKEEP_PROPERTIES, SEQUENCE_BOUNDS_PROPERTY

    files = ChangeFiles(spark, settings)
    files.merge([files.write(change(1, "k", "INSERT"))])
    tombstones = tombstone_table(files.table)
    spark.sql(f"ALTER TABLE {tombstones} UNSET TBLPROPERTIES ('commit.manifest.min-count-to-merge')")
    spark.sql(f"ALTER TABLE {files.table} UNSET TBLPROPERTIES ('{SEQUENCE_BOUNDS_PROPERTY[0]}')")
    ensure_tables(spark, declared("books").spec, files.table)
    for table in (files.table, tombstones):
        assert all(table_properties(spark, table).get(name) == value for name, value in (*METADATA_UPKEEP_PROPERTIES, SEQUENCE_BOUNDS_PROPERTY))


def test_expiry_keeps_the_writers_epoch_and_stream_positions_when_upkeep_committed_after_its_last_merge(spark, settings):
    """A quiet table: its last merge (its writer's epoch, the stream positions), then a compaction's snapshot, which
    carries neither; a day later expiry keeps from that merge on, not only the newest snapshot, and commits nothing of
    its own: a resumed older writer still finds the newer epoch, and the next run still finds where the stream was read
    to. The rest of the history goes."""
    files = ChangeFiles(spark, settings)
    tables = (files.table, tombstone_table(files.table))
    writer = WriterBranch(lambda: spark, "lake", tables, "live", 4, carried=(STREAM_POSITIONS_PROPERTY,))
    files.merge([files.write(change(1, "a", "INSERT"))])
    quarantine = files.layout.uri(files.layout.quarantine_prefix + "carry", "s3a")
    uris = [files.layout.uri(files.write(change(2, "b", "INSERT"), change(3, "a", "REMOVE")), "s3a")]
    merge_change_files(spark, declared("books").spec, files.table, uris, quarantine, writer=writer, commit_properties={STREAM_POSITIONS_PROPERTY: "after 3"})
    carriers = {table: iceberg_table(spark, table).currentSnapshot().snapshotId() for table in tables}
    for table in tables:
        empty_commit(spark, table, {})  # what the writer's compaction commits to main: no property of the writer's
        writer.follow_main(table)
    heads = {table: iceberg_table(spark, table).currentSnapshot().snapshotId() for table in tables}
    a_day_later = datetime.now(UTC) + timedelta(days=1)
    maintain_table(spark, "lake", files.table, timedelta(hours=6), 1, timedelta(days=3), timedelta(days=7), now=a_day_later, writer=writer)
    for table in tables:
        # The merge that carries them and what followed it (upkeep's, the pass's compaction), nothing older.
        kept = {row[0]: row[1] for row in spark.sql(f"SELECT snapshot_id, committed_at FROM {table}.snapshots").collect()}
        assert {carriers[table], heads[table]} <= kept.keys() and min(kept.values()) == kept[carriers[table]], table
    assert newest_published(spark, files.table, FENCE_EPOCH_PROPERTY) == "4"
    assert newest_published(spark, files.table, STREAM_POSITIONS_PROPERTY) == "after 3"
    assert newest_published(spark, tombstone_table(files.table), FENCE_EPOCH_PROPERTY) == "4"
    with pytest.raises(WriterFencedError, match=r"a newer writer \(epoch 4\)"):
        WriterBranch(lambda: spark, "lake", tables, "resumed", 3).take(files.table)
    assert files.names() == {"b": "b@2"}
    writer.drop()


def test_expiry_and_the_orphan_sweep_commit_beside_a_writer_between_its_take_and_its_publication(spark, settings):
    """The upkeep run's pass (trim_history, then its record on the table) lands while a writer has merged on its
    branch and not yet published: it moves no branch, so the writer's fast-forward of `main` still succeeds (no
    MainMovedError, no redo) and nothing it wrote is lost. A compaction there would cost the writer its cycle."""
    files = ChangeFiles(spark, settings)
    tables = (files.table, tombstone_table(files.table))
    files.merge([files.write(*(change(number + 1, f"old{number}", "INSERT") for number in range(3)))])
    old = plant_file(spark, files.table, "left-by-a-crashed-writer.parquet", age_days=5)
    writer = WriterBranch(lambda: spark, "lake", tables, "live", 2, carried=(STREAM_POSITIONS_PROPERTY,))
    writer.take_all()
    quarantine = files.layout.uri(files.layout.quarantine_prefix + "beside", "s3a")

    def merge_unpublished(*changes) -> None:
        """The merge, committed on the writer's branch; its publication held back (the window upkeep lands in)."""
        uris = [files.layout.uri(files.write(*changes), "s3a")]
        publish, writer.publish = writer.publish, lambda table: None
        try:
            merge_change_files(spark, declared("books").spec, files.table, uris, quarantine, writer=writer)
        finally:
            writer.publish = publish

    merge_unpublished(change(10, "new", "INSERT"), change(11, "old0", "REMOVE"))
    snapshots = spark.table(f"{files.table}.snapshots").count()
    a_day_later = datetime.now(UTC) + timedelta(days=1)
    trimmed = trim_history(spark, "lake", files.table, timedelta(hours=6), 1, timedelta(days=3), with_tombstones=True, now=a_day_later)
    record_maintained(spark, files.table, trimmed, a_day_later)
    assert trimmed.expired_snapshots > 0 and spark.table(f"{files.table}.snapshots").count() < snapshots
    assert trimmed.orphan_files_removed == 1 and not old.exists()
    assert (trimmed.rewritten_data_files, trimmed.pruned_tombstones) == (0, None)  # no compaction, no pruning
    for table in tables:
        writer.publish(table)  # no MainMovedError
    assert files.names() == {"old1": "old1@2", "old2": "old2@3", "new": "new@10"}, "nothing the writer merged is lost"
    assert maintenance_state(spark, files.table).orphans_removed_at == a_day_later

    # The contrast: a compaction committed to main in the same place moves main, and the writer redoes its cycle.
    merge_unpublished(change(12, "newer", "INSERT"))
    compact(spark, "lake", files.table)
    with pytest.raises(MainMovedError):
        writer.publish(files.table)
    writer.drop()
