"""A declaration that changes: a typed column added to a live table is filled for its old rows in the writer's
publication, a writer of the older declaration publishes nothing after, removing or retyping a column is refused, and a
value of another DynamoDB type keeps its row and is noted, never shown."""

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

import pytest
from pyiceberg.table import StaticTable

from ddb_athena.lake.change_merge import SchemaChangeError, merge_change_files, tombstone_table
from ddb_athena.lake.export_load import ExportDataFile, load_export_files
from ddb_athena.lake.table_spec import ColumnSpec
from ddb_athena.lake.writer_branch import WriterBranch, WriterFencedError
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.quarantine import quarantined_records
from ddb_athena_tests.exported.aws_layout import full_line, write_export
from ddb_athena_tests.lake.helpers import ChangeFiles, change

BOOKS = declared("books").spec
RATING = ColumnSpec("rating", "rating", "decimal", precision=3, scale=1)
WITH_RATING = dataclasses.replace(BOOKS, columns=(*BOOKS.columns, RATING))


def read_by_pyiceberg(settings, table: str) -> dict[str, dict]:
    """The table as Athena reads it: from its current metadata, by another engine than Spark."""
    namespace, name = table.split(".")
    location = Path(urlparse(settings.warehouse).path) / namespace / name
    return {row["id"]: row for row in StaticTable.from_metadata(str(location)).scan().to_arrow().to_pylist()}


def merge(files: ChangeFiles, spec, keys, writer=None, ensure=True):
    uris = [files.layout.uri(key, "s3a") for key in keys]
    quarantine = files.layout.uri(f"{files.layout.quarantine_prefix}q{files.minute}", "s3a")
    return merge_change_files(files.spark, spec, files.table, uris, quarantine, writer=writer, ensure=ensure)


def writer(files: ChangeFiles, token: str, epoch: int) -> WriterBranch:
    """A writer of the lease holding `epoch` (each later holding one more)."""
    return WriterBranch(lambda: files.spark, "lake", (files.table, tombstone_table(files.table)), token, epoch)


@pytest.fixture
def files(spark, settings):
    return ChangeFiles(spark, settings)


def test_a_column_added_to_a_live_table_is_filled_for_its_old_rows_in_the_writers_publication(files, settings):
    rated = {"rating": {"N": "4.5"}}
    merge(files, BOOKS, [files.write(change(1, "b1", "INSERT", **rated), change(2, "b2", "INSERT"), change(3, "b3", "INSERT", rating={"N": "3"}))])
    # The writer of the older declaration took the table before the change.
    old = writer(files, "old", 1)
    merge(files, BOOKS, [files.write(change(4, "b2", name="second"))], writer=old)

    new = writer(files, "new", 2)
    result = merge(files, WITH_RATING, [files.write(change(5, "b4", "INSERT", rating={"N": "1.5"}))], writer=new)
    assert result.columns_added == ["rating"]
    rows = read_by_pyiceberg(settings, files.table)
    # Old rows filled from their item, the new one from its change, a row without the attribute NULL: none half-filled.
    assert {book_id: row["rating"] for book_id, row in rows.items()} == {"b1": Decimal("4.5"), "b2": None, "b3": Decimal(3), "b4": Decimal("1.5")}
    assert rows["b2"]["name"] == "second"
    # A writer still running the older declaration (its tables checked at its start, as a sync run's) cannot publish
    # after the change.
    with pytest.raises(WriterFencedError):
        merge(files, BOOKS, [files.write(change(6, "b1", name="stale"))], writer=old, ensure=False)
    assert read_by_pyiceberg(settings, files.table)["b1"]["name"] != "stale"
    # Nor can one that starts with it: its declaration lacks a column the table has.
    with pytest.raises(SchemaChangeError, match="column rating .* is not in the declaration of books any more"):
        merge(files, BOOKS, [files.write(change(7, "b1", name="stale"))], writer=writer(files, "restarted", 3))
    # The next writer of the new declaration adds nothing again.
    assert merge(files, WITH_RATING, [files.write(change(8, "b1", name="later"))], writer=writer(files, "next", 4)).columns_added == []


def test_a_fill_fenced_before_its_publication_is_done_by_the_next_writer(files, settings):
    merge(files, BOOKS, [files.write(change(1, "b1", "INSERT", rating={"N": "2"}))])
    first = writer(files, "first", 1)
    first.take_all()
    # A second writer fences the first between its schema change and its publication.
    writer(files, "second", 2).take_all()
    with pytest.raises(WriterFencedError):
        merge(files, WITH_RATING, [files.write(change(2, "b2", "INSERT"))], writer=first)
    # The column exists, empty on every row; the writer after fills it.
    assert read_by_pyiceberg(settings, files.table)["b1"]["rating"] is None
    assert merge(files, WITH_RATING, [], writer=writer(files, "third", 3)).columns_added == ["rating"]
    assert read_by_pyiceberg(settings, files.table)["b1"]["rating"] == Decimal(2)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (dataclasses.replace(BOOKS, columns=BOOKS.columns[1:]), r"column name \(string\) is not in the declaration of books any more"),
        (
            dataclasses.replace(BOOKS, columns=(ColumnSpec("name", "name", "decimal"), *BOOKS.columns[1:])),
            r"column name is string, its declaration says decimal\(38,0\)",
        ),
    ],
    ids=["removed", "retyped"],
)
def test_removing_or_retyping_a_column_is_refused_saying_what_to_do(files, spec, message):
    merge(files, BOOKS, [files.write(change(1, "b1", "INSERT"))])
    with pytest.raises(SchemaChangeError, match=message) as refused:
        merge(files, spec, [files.write(change(2, "b1"))])
    assert "declare" in str(refused.value)


def test_a_column_made_otherwise_in_the_same_type_is_filled_again_from_item_for_every_row(files, settings):
    """published_at read from `date` (epoch nanoseconds), then declared from `published` (ISO text): the same SQL type,
    so nothing to refuse, but old rows kept the old derivation until they were filled again (issue 68)."""
    merge(
        files,
        BOOKS,
        [files.write(change(1, "b1", "INSERT", date={"N": "1700000000000000000"}), change(2, "b2", "INSERT", published={"S": "2026-01-02T03:04:05+00:00"}))],
    )
    assert read_by_pyiceberg(settings, files.table)["b1"]["published_at"] is not None
    from_text = dataclasses.replace(BOOKS, columns=(*BOOKS.columns[:-1], ColumnSpec("published_at", "published", "iso_timestamp")))
    result = merge(files, from_text, [files.write(change(3, "b3", "INSERT", published={"S": "2026-02-03T04:05:06+00:00"}))], writer=writer(files, "new", 1))
    assert result.columns_added == ["published_at"]
    published = {book_id: row["published_at"] for book_id, row in read_by_pyiceberg(settings, files.table).items()}
    assert published == {"b1": None, "b2": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "b3": datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC)}
    # Recorded once published: the next writer fills nothing again.
    assert merge(files, from_text, [], writer=writer(files, "next", 2)).columns_added == []


def test_a_key_added_or_made_otherwise_on_a_live_table_is_refused_saying_what_to_do(files):
    merge(files, BOOKS, [files.write(change(1, "b1", "INSERT"))])
    with_sort_key = dataclasses.replace(BOOKS, sort_key=ColumnSpec("edition", "edition", "decimal"))
    with pytest.raises(SchemaChangeError, match="its declaration's key has edition, which the table's rows were never keyed by.*declare a new iceberg_table"):
        merge(files, with_sort_key, [files.write(change(2, "b1", edition={"N": "2"}))])
    other_attribute = dataclasses.replace(BOOKS, key=ColumnSpec("id", "isbn", "string"))
    with pytest.raises(SchemaChangeError, match="key column id was made from attribute 'id' .string., its declaration says 'isbn'"):
        merge(files, other_attribute, [files.write(change(3, "b1"))])


def test_a_column_added_to_rows_whose_attribute_has_another_type_notes_each_with_its_reason(files):
    merge(files, BOOKS, [files.write(change(1, "b1", "INSERT", rating={"S": "good"}), change(2, "b2", "INSERT", rating={"N": "4"}))])
    result = merge(files, WITH_RATING, [])
    assert result.columns_added == ["rating"] and result.type_mismatches == {"attribute rating is S where its column rating expects N": 1}
    assert files.rows()["b1"]["rating"] is None and files.rows()["b2"]["rating"] == Decimal(4)
    (noted,) = files.quarantined()
    assert noted["reason"] == "attribute rating is S where its column rating expects N" and noted.get("line") is None and "good" not in str(noted)


def test_a_value_of_another_dynamodb_type_keeps_its_row_and_is_noted_without_its_value(files):
    result = merge(files, BOOKS, [files.write(change(1, "b1", "INSERT", name="x", author={"N": "1984"}), change(2, "b2", "INSERT", author={"NULL": True}))])
    assert result.records_quarantined == 0 and result.type_mismatches == {"attribute author is N where its column author expects S": 1}
    rows = files.rows()
    assert rows["b1"]["author"] is None and '"author":{"N":"1984"}' in rows["b1"]["item"] and rows["b2"]["author"] is None
    (noted,) = files.quarantined()
    assert noted["reason"] == "attribute author is N where its column author expects S" and noted.get("line") is None
    assert "1984" not in str(noted)


def test_an_exported_table_takes_a_new_column_and_notes_a_value_of_another_type(spark, settings):
    orders = declared("orders").spec
    s3, table = settings.client("s3"), f"{settings.namespace}.orders"
    quarantine = f"s3a://{settings.bucket}/orders_export/quarantine/q"

    def load(spec, items):
        written = write_export(s3, settings.bucket, "orders_export/e", [[full_line(item) for item in items]])
        files = [ExportDataFile(f"s3a://{settings.bucket}/{key}", count) for key, count in zip(written["data_files"], written["data_file_items"], strict=True)]
        return load_export_files(spark, spec, table, files, quarantine, datetime(2026, 11, 23, tzinfo=UTC))

    def order(order_id: str, **attributes):
        return {"order_id": {"S": order_id}, "created_at": {"S": "2026-11-22T10:00:00+00:00"}, **attributes}

    load(orders, [order("o1", channel={"S": "web"}), order("o2"), order("o0", channel={"N": "5"})])
    with_channel = dataclasses.replace(orders, columns=(*orders.columns, ColumnSpec("channel", "channel")))
    result = load(with_channel, [order("o3", channel={"S": "shop"}), order("o4", channel={"N": "7"})])
    assert result.columns_added == ["channel"] and result.rows_inserted == 2
    # o0's fill (a row loaded before the column) and o4's load: each NULL for a type is noted with its reason.
    assert result.type_mismatches == {"attribute channel is N where its column channel expects S": 2} and result.records_quarantined == 0
    channels = {row["order_id"]: row["channel"] for row in spark.table(table).collect()}
    assert channels == {"o0": None, "o1": "web", "o2": None, "o3": "shop", "o4": None}
    noted = quarantined_records(s3, SourceLayout(settings.bucket, "orders_export"))
    assert [record["reason"] for record in noted] == ["attribute channel is N where its column channel expects S"] * 2
    assert all(record.get("line") is None for record in noted)
    # A key read from another attribute is refused before anything is written: the rows were keyed otherwise.
    rekeyed = dataclasses.replace(with_channel, key=ColumnSpec("order_id", "order_ref", "string"))
    with pytest.raises(SchemaChangeError, match="key column order_id was made from attribute 'order_id' .string., its declaration says 'order_ref'"):
        load(rekeyed, [order("o5")])
    assert spark.table(table).count() == 5
