"""A table restored to a point in time from the versioned bucket (issue 69): an Iceberg table of the emulator's Glue
catalog, written by PyIceberg, loses its files to a mistaken cleanup; restored, it reads as it was, read back by
PyIceberg from the catalog as Athena reads it; restored again to a later time, the restore itself is undone."""

import time
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from pyiceberg.catalog.glue import GlueCatalog

from ddb_athena.lib.table_recovery import RecoveryError, plan_restore, restore_glue_table

BUCKET, DATABASE = "recovery-bucket", "library"


def catalog(settings) -> GlueCatalog:
    endpoint, keys = settings.endpoint_url, {"access-key-id": "testing", "secret-access-key": "testing", "region": "us-east-1"}
    properties = {"glue.endpoint": endpoint, "s3.endpoint": endpoint, "warehouse": f"s3://{BUCKET}/warehouse"}
    properties |= {f"{service}.{name}": value for service in ("glue", "s3") for name, value in keys.items()}
    return GlueCatalog("glue", **properties)


def moment() -> datetime:
    """A time between two writes: S3 keeps LastModified to the second."""
    time.sleep(1.1)
    then = datetime.now(UTC)
    time.sleep(1.1)
    return then


def rows(glue_catalog: GlueCatalog) -> list[dict]:
    return sorted(glue_catalog.load_table(f"{DATABASE}.books").scan().to_arrow().to_pylist(), key=lambda row: row["id"])


def test_a_table_whose_files_were_deleted_reads_as_it_was_after_a_restore_and_a_restore_can_be_undone(aws_env, settings):
    s3, glue = settings.client("s3"), settings.client("glue")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    glue.create_database(DatabaseInput={"Name": DATABASE})
    books = catalog(settings)
    table = books.create_table(f"{DATABASE}.books", schema=pa.schema([("id", pa.string()), ("title", pa.string())]))
    table.append(pa.table({"id": ["b1", "b2"], "title": ["Dune", "Emma"]}))
    first = moment()
    books.load_table(f"{DATABASE}.books").append(pa.table({"id": ["b3"], "title": ["Ulysses"]}))
    second = moment()
    # The disaster: a cleanup that deleted the table's data files, then a bad commit on top.
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="warehouse/"):
        for listed in page.get("Contents", []):
            if "/data/" in listed["Key"]:
                s3.delete_object(Bucket=BUCKET, Key=listed["Key"])
    with pytest.raises(Exception):  # noqa: B017 - what a reader meets: a file that is gone (pyarrow's or S3's error)
        rows(books)
    books.load_table(f"{DATABASE}.books").overwrite(pa.table({"id": ["x"], "title": ["bad"]}))
    assert rows(books) == [{"id": "x", "title": "bad"}]

    plan, previous = restore_glue_table(s3, glue, DATABASE, "books", second)
    assert plan.copy_back and plan.hide and previous.endswith(".metadata.json")  # the bad commit's files hidden
    assert rows(books) == [{"id": "b1", "title": "Dune"}, {"id": "b2", "title": "Emma"}, {"id": "b3", "title": "Ulysses"}]

    plan, _ = restore_glue_table(s3, glue, DATABASE, "books", first)
    assert plan.hide  # the second append's files and metadata, behind delete markers
    assert rows(books) == [{"id": "b1", "title": "Dune"}, {"id": "b2", "title": "Emma"}]
    # Nothing was deleted for good: restored to the later time again, the table has its third book back.
    restore_glue_table(s3, glue, DATABASE, "books", second)
    assert [row["id"] for row in rows(books)] == ["b1", "b2", "b3"]
    # A dry run plans and changes nothing.
    plan, previous = restore_glue_table(s3, glue, DATABASE, "books", first, apply=False)
    assert plan.changes and previous is None and [row["id"] for row in rows(books)] == ["b1", "b2", "b3"]


def test_a_restore_is_refused_where_the_bucket_keeps_no_versions_or_the_table_did_not_exist(aws_env, settings):
    s3, glue = settings.client("s3"), settings.client("glue")
    s3.create_bucket(Bucket=BUCKET)
    with pytest.raises(RecoveryError, match="is not versioned"):
        plan_restore(s3, BUCKET, "warehouse/library.db/books/", datetime.now(UTC))
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    glue.create_database(DatabaseInput={"Name": DATABASE})
    with pytest.raises(RecoveryError, match="no table library.books in the Glue catalog"):
        restore_glue_table(s3, glue, DATABASE, "books", datetime.now(UTC))
    before = datetime.now(UTC)
    time.sleep(1.1)
    catalog(settings).create_table(f"{DATABASE}.books", schema=pa.schema([("id", pa.string())]))
    with pytest.raises(RecoveryError, match="had no metadata at"):
        restore_glue_table(s3, glue, DATABASE, "books", before)


def test_restore_table_puts_a_declared_table_back_as_its_one_writer_and_waits_for_none(aws_env, settings, monkeypatch, capsys):
    """`ddb-athena restore-table books --to ...` (the runbook's command): refused while another writer holds the
    table's lease, naming it; once free, takes the lease, restores, and says what it did."""
    from ddb_athena.dev.cli import main
    from ddb_athena.lib.writer_lease import WriterLease

    deployment = {"DDB_ATHENA_PROFILE": "aws", "DDB_ATHENA_BUCKET": BUCKET, "DDB_ATHENA_NAMESPACE": DATABASE, "DDB_ATHENA_WRITER_LEASE_SECONDS": "5"}
    for name, value in {**deployment, "DDB_ATHENA_WAREHOUSE": f"s3://{BUCKET}/warehouse"}.items():
        monkeypatch.setenv(name, value)
    s3, glue = settings.client("s3"), settings.client("glue")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    glue.create_database(DatabaseInput={"Name": DATABASE})
    books = catalog(settings)
    for name in ("books", "books_tombstones"):  # a streamed table's deletes go back with its rows
        books.create_table(f"{DATABASE}.{name}", schema=pa.schema([("id", pa.string())])).append(pa.table({"id": ["b1"]}))
    then = moment()
    for name in ("books", "books_tombstones"):
        books.load_table(f"{DATABASE}.{name}").append(pa.table({"id": ["b2"]}))

    assert main(["restore-table", "books", "--to", then.isoformat(), "--dry-run"]) == 0
    assert "library.books at" in capsys.readouterr().out and [row["id"] for row in rows(books)] == ["b1", "b2"]
    with WriterLease(s3, BUCKET, f"{DATABASE}.books", "Dagster run r1 (books_sync)", 5.0):
        assert main(["restore-table", "books", "--to", then.isoformat()]) == 1
    assert "has another writer: Dagster run r1 (books_sync)" in capsys.readouterr().err
    assert [row["id"] for row in rows(books)] == ["b1", "b2"]  # untouched
    assert main(["restore-table", "books", "--to", then.isoformat()]) == 0
    out = capsys.readouterr().out
    assert "library.books is as it was at" in out and "library.books_tombstones is as it was at" in out
    assert [row["id"] for row in rows(books)] == ["b1"] and books.load_table(f"{DATABASE}.books_tombstones").scan().to_arrow()["id"].to_pylist() == ["b1"]
    assert main(["restore-table", "books", "--to", "2026-12-04T10:00:00"]) == 2  # a time without its offset
