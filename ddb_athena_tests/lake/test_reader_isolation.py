"""Readers never fail: a scan planned on the previous snapshot reads to the end while the merge,
the cleanup and maintenance (compaction + snapshot expiry) run underneath it."""

from datetime import UTC, datetime, timedelta

import pytest

from ddb_athena.lake.change_merge import current_snapshot_id
from ddb_athena.lake.maintenance import maintain_table
from ddb_athena_tests.lake.helpers import ChangeFiles, change

FILES = 4


def table_in_several_files(files: ChangeFiles) -> int:
    for batch in range(FILES):
        files.merge([files.write(*[change(batch * 100 + i, f"k{batch}-{i}", "INSERT") for i in range(25)])])
    return current_snapshot_id(files.spark, files.table)


def start_reader(files: ChangeFiles, snapshot_id: int):
    """A scan planned on `snapshot_id` that has read its first file and holds the rest for later."""
    frame = (
        files.spark.read.format("iceberg")
        .option("snapshot-id", snapshot_id)
        # One split per data file, so reading continues file by file after the first.
        .option("split-size", "1024")
        .option("file-open-cost", "1024")
        .load(files.table)
        .select("id")
    )
    assert frame.rdd.getNumPartitions() >= FILES
    rows = frame.toLocalIterator()
    first = next(rows)
    return first, rows


def change_everything_underneath(files: ChangeFiles, hours_later: float = 0):
    """A merge, the cleanup of its change files, then maintenance (6 h retention, the last snapshot kept) run
    `hours_later` (the reader's query still running by then)."""
    merged = files.present()
    files.merge([files.write(*[change(1000 + i, f"k0-{i}", "REMOVE") for i in range(25)], change(2000, "new", "INSERT"))])
    files.delete(merged)  # the cleanup of the consumed change files
    return maintain_table(
        files.spark,
        "lake",
        files.table,
        snapshot_retention=timedelta(hours=6),
        retain_last=1,
        orphan_age=timedelta(days=3),
        tombstone_retention=timedelta(days=7),
        now=datetime.now(UTC) + timedelta(hours=hours_later),
    )


@pytest.fixture
def files(spark, settings) -> ChangeFiles:
    return ChangeFiles(spark, settings)


def test_a_reader_on_the_previous_snapshot_reads_to_the_end(files):
    before = table_in_several_files(files)
    first, rest = start_reader(files, before)
    result = change_everything_underneath(files)
    assert result.rewritten_data_files >= FILES  # compaction really replaced the files the reader planned on
    ids = {first["id"], *(row["id"] for row in rest)}
    assert len(ids) == FILES * 25 and "new" not in ids
    assert len(files.names()) == (FILES - 1) * 25 + 1  # and the table itself moved on


def test_control_expiring_the_readers_snapshot_does_break_it(files):
    """Shows the test above can fail: a query that outlives the retention loses the files it planned on."""
    before = table_in_several_files(files)
    first, rest = start_reader(files, before)
    result = change_everything_underneath(files, hours_later=7)
    assert result.deleted_data_files >= FILES
    with pytest.raises(Exception, match="FileNotFound|does not exist|NotFoundException"):
        list(rest)
