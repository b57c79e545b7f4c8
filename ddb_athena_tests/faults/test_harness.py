"""The fault harness's own logic (recoveries of overlapping faults, a reader's view of a key), and a short harness run
on the real stack."""

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddb_athena.lib.declarations import declared_tables
from ddb_athena_faults.checker import DUPLICATED, LOST, MOVED_BACKWARDS, OLDER_AFTER_DELETE, RESURRECTED, UNREADABLE, VANISHED, Checker
from ddb_athena_faults.harness import fault_clusters
from ddb_athena_faults.versioned_writes import KeyLog


@dataclass
class Fault:
    started: float
    ended: float


def test_overlapping_faults_are_recovered_from_the_last_ones_end():
    faults = [Fault(0, 10), Fault(5, 30), Fault(25, 26), Fault(40, 41)]
    assert fault_clusters(faults) == {0: 30, 1: 30, 2: 30, 3: 41}


def book(version: int | None, book_id: str = "fault-000") -> dict:
    return {"id": {"S": book_id}, **({"version": {"N": str(version)}} if version is not None else {})}


def checker_with(log: KeyLog) -> tuple[Checker, dict]:
    books = declared_tables()["books"]
    logs = {("fault-000",): log}
    return Checker({"books": books}, {"books": Path("unused")}, lambda: {"books": logs}), logs


def test_a_reader_that_sees_a_key_go_back_or_a_deleted_key_come_back_older_is_flagged():
    checker, logs = checker_with(KeyLog([1, 2, 3, 4], [False, False, True, False], [1.0, 2.0, 3.0, 4.0]))
    books = checker.tables["books"]
    checker.observe("books", books, [book(2)], logs)
    checker.observe("books", books, [book(1)], logs)
    checker.observe("books", books, [], logs)  # the delete at 3
    checker.observe("books", books, [book(2)], logs)
    assert [anomaly.kind for anomaly in checker.anomalies] == [MOVED_BACKWARDS, OLDER_AFTER_DELETE]


def test_a_key_that_disappears_without_a_delete_or_shows_twice_is_flagged():
    checker, logs = checker_with(KeyLog([1, 2], [False, False], [1.0, 2.0]))
    books = checker.tables["books"]
    assert checker.observe("books", books, [book(2), book(2)], logs) == 2.0
    checker.observe("books", books, [], logs)
    assert [anomaly.kind for anomaly in checker.anomalies] == [DUPLICATED, VANISHED]


def test_a_read_that_fails_is_counted_by_the_file_it_could_not_open(tmp_path):
    """A table directory whose version hint is missing (the local catalog's instant between deleting it and renaming the
    next one in), then one whose hint names a metadata file that is not there: each read is counted, not checked."""
    checker, _ = checker_with(KeyLog())
    checker.table_dirs["books"] = tmp_path
    (tmp_path / "metadata").mkdir()
    checker.poll()
    (tmp_path / "metadata" / "version-hint.text").write_text("7")
    checker.poll()
    assert checker.read_errors == {"books: FileNotFoundError of the version hint": 1, "books: FileNotFoundError of a metadata file": 1}
    assert checker.reads == []


def test_a_read_that_misses_a_file_of_its_snapshot_is_an_anomaly(tmp_path):
    """A data file gone from under the snapshot a reader opened is what fails an Athena query (HIVE_CANNOT_OPEN_SPLIT):
    flagged, unlike the local catalog's instant without a version hint. The table is written by PyIceberg in the local
    catalog's layout (a version hint naming its metadata file)."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("faults", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("library")
    table = catalog.create_table("library.books", pa.schema([("item", pa.string())]))
    table.append(pa.table({"item": [json.dumps(book(1))]}))
    table_dir = Path(table.location().removeprefix("file://"))
    (table_dir / "metadata" / "version-hint.text").write_text(Path(table.metadata_location).name)
    checker, _ = checker_with(KeyLog([1], [False], [1.0]))
    checker.table_dirs["books"] = table_dir
    checker.poll()
    assert len(checker.reads) == 1 and checker.anomalies == []
    [data_file] = (table_dir / "data").glob("*.parquet")
    data_file.unlink()
    checker.poll()
    assert checker.read_errors == {"books: FileNotFoundError of a data or delete file": 1}
    assert [anomaly.kind for anomaly in checker.anomalies] == [UNREADABLE] and len(checker.reads) == 1


def test_the_end_comparison_finds_lost_extra_and_stale_keys():
    checker, _ = checker_with(KeyLog())
    dynamodb = [book(3), book(None, "seeded-1"), book(None, "seeded-2")]
    iceberg = [book(2), book(None, "seeded-1"), book(None, "gone")]
    found = {(anomaly.kind, anomaly.key) for anomaly in checker.differences("books", dynamodb, iceberg)}
    assert found == {(LOST, ("fault-000",)), (LOST, ("seeded-2",)), (RESURRECTED, ("gone",))}


def test_the_versioned_load_logs_each_keys_versions_with_deletes_taking_one(moto_endpoint, settings):
    from ddb_athena_faults.versioned_writes import VersionedWriter

    tables = {name: table for name, table in declared_tables().items() if table.kind == "streamed"}
    writer = VersionedWriter(settings.client("dynamodb"), tables, settings.dynamodb_tables, rate=100, keys=3, seed=5)
    for _ in range(40):
        writer.write_once(random.choice(sorted(tables)))
    for logs in writer.logs.values():
        for log in logs.values():
            assert log.versions == list(range(1, len(log.versions) + 1))
    stored = settings.client("dynamodb").scan(TableName=settings.dynamodb_tables["reviews"])["Items"]
    expected = {key for key, log in writer.logs["reviews"].items() if log.live}
    assert {(item["book_id"]["S"], item["review_id"]["N"]) for item in stored} == expected


# Minutes of real time (`make test-soak`). `make test` keeps each fault's own test: a sync killed, stopped as ECS does
# (stack/test_one_writer.py), frozen past its lease (lake/test_writer_branch.py, streamed/test_many_tables.py), Terminate
# beside it (streamed/test_assets.py), endpoint faults and lost responses (faults/test_proxy.py), skewed clocks
# (lib/test_writer_lease.py).
@pytest.mark.soak
def test_a_short_harness_run_injects_faults_of_several_kinds_and_finds_no_anomaly(monkeypatch):
    from ddb_athena_faults.harness import run

    # The shortest settle the sync resource accepts (two of its longest merge intervals): the parity run after the hand
    # delete ends sooner.
    monkeypatch.setenv("DDB_ATHENA_PARITY_SETTLE_SECONDS", "90")
    outcome = run(minutes=2, seed=3, rate=4.0, keys=12, mean_gap=12.0, bound=420.0)
    kinds = {fault.kind.split(":")[0] for fault in outcome.faults}
    assert len(kinds) >= 4, kinds
    assert outcome.anomalies == [], outcome.anomalies
