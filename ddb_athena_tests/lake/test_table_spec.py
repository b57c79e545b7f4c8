import pytest

from ddb_athena.lake.identifiers import InvalidIdentifierError
from ddb_athena.lake.table_spec import ColumnSpec, TableSpec, create_table_sql, image_problem_sql, image_schema_ddl, merge_sql, typed_value_sql
from ddb_athena.lib.declarations import declared


def test_image_schema_reads_only_typed_attributes_with_their_tags():
    assert image_schema_ddl(declared("books").spec) == (
        "struct<`id`: struct<`S`: string>, `name`: struct<`S`: string>, `author`: struct<`S`: string>, "
        "`summary`: struct<`S`: string>, `date`: struct<`N`: string>>"
    )


def test_typed_values_per_transform():
    assert typed_value_sql(ColumnSpec("name", "name")) == "image.`name`.`S`"
    amount = typed_value_sql(ColumnSpec("amount", "amount", "decimal", 12, 2))
    # Exact or NULL, never rounded (test_numbers.py holds the rule to Python's over DynamoDB's range).
    assert amount.startswith("CASE WHEN (image.`amount`.`N` RLIKE '^[+-]?[0-9]{0,10}([.][0-9]{0,2})?") and amount.endswith("AS decimal(12,2)) END")
    nanos = typed_value_sql(ColumnSpec("published_at", "date", "epoch_nanos_timestamp"))
    assert nanos == "timestamp_micros(CAST(floor(try_cast(image.`date`.`N` AS decimal(38,0)) / 1000) AS bigint))"
    assert typed_value_sql(ColumnSpec("created_at", "created_at", "iso_timestamp")) == "try_cast(image.`created_at`.`S` AS timestamp)"
    assert typed_value_sql(ColumnSpec("items", "items", "json_list")) == "image.`items`.`L`"


def test_create_table_sql_from_the_books_spec():
    sql = create_table_sql(declared("books").spec, "library.books")
    assert sql.startswith(
        "CREATE TABLE IF NOT EXISTS library.books (id string, name string, author string, summary string, published_at timestamp, item string COMMENT"
    )
    assert "_sequence_number string" in sql and "_changed_at timestamp" in sql and "_synced_at timestamp" in sql
    assert "USING iceberg TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read'" in sql


def test_partitioning_is_validated_and_rendered():
    spec = TableSpec(
        "orders",
        ColumnSpec("order_id", "order_id", required=True),
        (ColumnSpec("created_at", "created_at", "iso_timestamp"),),
        partition_by=("days(created_at)",),
    )
    assert "PARTITIONED BY (days(created_at))" in create_table_sql(spec, "library.orders")
    with pytest.raises(InvalidIdentifierError):
        TableSpec("orders", ColumnSpec("order_id", "order_id"), (), partition_by=("days(nope)",))
    with pytest.raises(InvalidIdentifierError):
        TableSpec("orders", ColumnSpec("order_id", "order_id"), spec.columns, partition_by=("drop(created_at)",))


@pytest.mark.parametrize("insert_new", [True, False])
def test_merge_sql_guards_against_older_changes_and_deletes_on_remove(insert_new):
    sql = merge_sql(declared("books").spec, "library.books", "books_changes", insert_new)
    assert sql.startswith("MERGE INTO library.books t USING books_changes s ON t.id = s.id ")
    assert "WHEN MATCHED AND s.event_name = 'REMOVE' AND t._sequence_number < s._sequence_number THEN DELETE" in sql
    assert "WHEN MATCHED AND s.event_name <> 'REMOVE' AND t._sequence_number < s._sequence_number THEN UPDATE SET" in sql
    # Without inserts, an inner join, which Spark can broadcast the changes into; a REMOVE is never inserted.
    assert ("WHEN NOT MATCHED AND s.event_name <> 'REMOVE' THEN INSERT" in sql) == insert_new and sql.count("NOT MATCHED") == insert_new


def test_an_attribute_name_reaches_sql_quoted_and_its_messages_as_text():
    odd = ColumnSpec("odd", "it's `odd`")
    assert typed_value_sql(odd) == "image.`it's ``odd```.`S`"
    assert "THEN 'missing required attribute it\\'s `odd` (S)'" in image_problem_sql(TableSpec("t", odd, ()))


def test_problem_sql_names_missing_keys_and_unparseable_values():
    sql = image_problem_sql(declared("books").spec)
    assert "WHEN image.`id`.`S` IS NULL THEN 'missing required attribute id (S)'" in sql
    assert "'attribute date is not a valid timestamp'" in sql


@pytest.mark.parametrize(
    "make",
    [
        lambda: ColumnSpec("bad name", "x"),
        lambda: ColumnSpec("x", ""),  # attribute names are any text (quoted where they reach SQL), but not empty
        lambda: ColumnSpec("x", "a" * 256),  # nor longer than DynamoDB's 255 bytes for a key attribute
        lambda: ColumnSpec("x", "x", "nope"),
        lambda: ColumnSpec("x", "x", "decimal", 40, 0),
        lambda: TableSpec("books;", ColumnSpec("id", "id"), ()),
        lambda: TableSpec("books", ColumnSpec("id", "id", "boolean"), ()),
        lambda: TableSpec("books", ColumnSpec("id", "id"), (), sort_key=ColumnSpec("at", "at", "iso_timestamp")),
        lambda: TableSpec("books", ColumnSpec("id", "id"), (ColumnSpec("reason", "reason"),)),
        lambda: TableSpec("books", ColumnSpec("id", "id"), (ColumnSpec("_mine", "mine"),)),
        lambda: TableSpec("books", ColumnSpec("id", "id"), (ColumnSpec("id", "other"),)),
        lambda: TableSpec("books", ColumnSpec("id", "id"), (ColumnSpec("item", "item"),)),
        lambda: create_table_sql(declared("books").spec, "library.books; DROP TABLE x"),
        lambda: merge_sql(declared("books").spec, "library.books", "v; --", True),
    ],
)
def test_bad_specs_and_names_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_the_orders_load_is_insert_only_and_matches_on_the_partition_column_too():
    from ddb_athena.lake.table_spec import insert_only_merge_sql

    sql = insert_only_merge_sql(declared("orders").spec, "library.orders", "batch")
    assert " ON t.order_id = s.order_id AND t.created_at = s.created_at WHEN NOT MATCHED THEN INSERT " in sql
    assert "WHEN MATCHED" not in sql and "UPDATE" not in sql and "DELETE" not in sql  # a loaded order is never rewritten
    with pytest.raises(InvalidIdentifierError):
        insert_only_merge_sql(declared("orders").spec, "library.orders", "batch; DROP TABLE x")


def test_the_orders_table_is_partitioned_by_day_and_carries_no_stream_position():
    from ddb_athena.lake.table_spec import SEQUENCE_COLUMN

    sql = create_table_sql(declared("orders").spec, "library.orders")
    assert "PARTITIONED BY (days(created_at))" in sql and "amount decimal(18,2)" in sql
    assert SEQUENCE_COLUMN not in sql and SEQUENCE_COLUMN not in declared("orders").spec.table_column_names
    assert declared("orders").spec.partition_column.name == "created_at"
    with pytest.raises(ValueError, match="source"):
        TableSpec(table="t", key=ColumnSpec("id", "id"), columns=(), source="scan")


def test_timestamp_literals_are_utc():
    from datetime import datetime, timedelta, timezone

    from ddb_athena.lake.table_spec import timestamp_literal

    oslo = timezone(timedelta(hours=1))
    assert timestamp_literal(datetime(2026, 11, 22, 3, 0, 5, 7, tzinfo=oslo)) == "TIMESTAMP '2026-11-22 02:00:05.000007'"


def test_table_properties_are_rendered_and_any_text_escaped():
    from ddb_athena.lake.table_spec import set_properties_sql

    assert "'write.parquet.dict-size-bytes'='65536'" in create_table_sql(declared("orders").spec, "library.orders")
    assert set_properties_sql("library.orders", {"a.b": "1"}) == "ALTER TABLE library.orders SET TBLPROPERTIES ('a.b'='1')"
    assert set_properties_sql("library.orders", {"a'": "1'); DROP TABLE x; --\\"}) == (
        "ALTER TABLE library.orders SET TBLPROPERTIES ('a\\''='1\\'); DROP TABLE x; --\\\\')"
    )
    with pytest.raises(InvalidIdentifierError):
        set_properties_sql("library.orders; DROP TABLE x", {"a": "1"})
