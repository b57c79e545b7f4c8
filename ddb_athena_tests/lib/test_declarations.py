"""ddb_athena/tables.toml: books and orders as they were, each malformed declaration refused naming its table and field,
and the declarations readable where Dagster is not."""

import subprocess
import sys
from datetime import timedelta

import pytest

from ddb_athena.lake.table_spec import SOURCE_PROPERTIES, create_table_sql
from ddb_athena.lib.declarations import DeclarationError, declared, declared_tables, parse_declarations
from ddb_athena.lib.settings import Settings

BOOKS_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS library.books (id string, name string, author string, summary string, published_at timestamp, item string COMMENT "
    "'the whole item as DynamoDB JSON: every attribute, exact types', _sequence_number string COMMENT 'stream sequence number of the last applied "
    "change, zero-padded', _changed_at timestamp COMMENT 'approximate time of the last applied change in DynamoDB', _synced_at timestamp COMMENT "
    "'when the change was merged into this table') USING iceberg TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read', "
    "'write.update.mode'='merge-on-read', 'write.delete.mode'='merge-on-read', 'write.metadata.delete-after-commit.enabled'='true', "
    "'write.metadata.previous-versions-max'='20', 'commit.manifest.min-count-to-merge'='2', "
    "'write.metadata.metrics.column._sequence_number'='full', 'write.delete.granularity'='partition', "
    "'write.target-file-size-bytes'='67108864')"
)
ORDERS_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS library.orders (order_id string, customer_id string, amount decimal(18,2), currency string, created_at timestamp, "
    "items string, paid boolean, item string COMMENT 'the whole item as DynamoDB JSON: every attribute, exact types', _changed_at timestamp COMMENT "
    "'approximate time of the last applied change in DynamoDB', _synced_at timestamp COMMENT 'when the change was merged into this table') USING "
    "iceberg PARTITIONED BY (days(created_at)) TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
    "'write.delete.mode'='merge-on-read', 'write.parquet.dict-size-bytes'='65536', 'write.parquet.compression-level'='1', "
    "'write.metadata.delete-after-commit.enabled'='true', 'write.metadata.previous-versions-max'='20', 'commit.manifest.min-count-to-merge'='2')"
)


def test_books_and_orders_are_two_entries_that_create_the_tables_they_always_did():
    books, orders = declared("books"), declared("orders")
    assert list(declared_tables())[:2] == ["books", "orders"]
    # The tables an existing deployment holds: the same columns, types, partitioning and properties.
    assert create_table_sql(books.spec, "library.books") == BOOKS_TABLE_SQL
    assert create_table_sql(orders.spec, "library.orders") == ORDERS_TABLE_SQL
    assert (books.kind, books.source_asset, books.table_asset, books.source_prefix) == ("streamed", "books_source", "books_iceberg", "books_source")
    assert (orders.kind, orders.source_asset, orders.table_asset, orders.source_prefix) == ("exported", "orders_export", "orders_athena", "orders_export")
    assert (books.freshness, orders.freshness) == (timedelta(minutes=2), timedelta(hours=26))
    assert books.spec.properties == SOURCE_PROPERTIES["stream"] and orders.spec.properties == SOURCE_PROPERTIES["export"]


def test_the_dynamodb_table_is_the_declared_name_or_the_one_its_variable_gives():
    assert declared("books").dynamodb_table_name({}) == "books"
    assert declared("books").dynamodb_table_name({"DDB_ATHENA_BOOKS_TABLE": "prod-books"}) == "prod-books"
    settings = Settings.from_env({"DDB_ATHENA_ORDERS_TABLE": "prod.orders"})
    assert (settings.dynamodb_tables["books"], settings.dynamodb_tables["orders"]) == ("books", "prod.orders")


STARS = '{ name = "stars", attribute = "stars", transform = "decimal", precision = 3 }'
REVIEWS = """
[reviews]
kind = "streamed"
dynamodb_table = "reviews"
iceberg_table = "reviews"
partition_key = { attribute = "book_id", type = "S" }
sort_key = { attribute = "review_id", type = "N" }
columns = [STARS]
freshness_minutes = 2
""".replace("STARS", STARS)


def test_a_table_with_a_composite_key_is_a_declaration():
    reviews = parse_declarations(REVIEWS)["reviews"]
    assert reviews.spec.key_names == ["book_id", "review_id"]
    assert [column.sql_type for column in reviews.spec.key_columns] == ["string", "decimal(38,0)"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('kind = "streamed"', 'kind = "lambda"'), "table reviews, field kind: 'lambda' is not one of streamed, exported"),
        (('type = "N"', 'type = "BOOL"'), "table reviews, field sort_key.type: 'BOOL' is not a key type of DynamoDB: S, N or B"),
        (("freshness_minutes = 2", 'freshness_minutes = "2"'), "table reviews, field freshness_minutes: expected a number of minutes"),
        (("freshness_minutes = 2", "freshness_minutes = 0"), "table reviews, field freshness_minutes: expected a positive number"),
        (("freshness_minutes = 2", ""), "table reviews, field freshness_minutes: missing"),
        (('iceberg_table = "reviews"', 'iceberg_table = "re-views"'), "table reviews, field iceberg_table: 're-views' is not a name Glue keeps as written"),
        (('dynamodb_table = "reviews"', 'dynamodb_table = "r"'), "table reviews, field dynamodb_table: 'r' is not a DynamoDB table name"),
        (('dynamodb_table = "reviews"', 'dynamodb_table = "reviews"\ncolums = []'), "table reviews, field table: unknown field 'colums'"),
        (('transform = "decimal"', 'transform = "money"'), "table reviews, field columns[0].transform: 'money' is not one of"),
        (('name = "stars", ', ""), "table reviews, field columns[0]: needs a name and an attribute"),
        (('name = "stars"', 'name = "item"'), "duplicate or reserved column names ['item']"),
        (('name = "stars"', 'name = "review_id"'), "duplicate or reserved column names ['review_id']"),
        (("precision = 3", "precision = 40"), "table reviews, field columns[0]: column stars: decimal(40,0) is not valid"),
        (('attribute = "book_id"', 'attribute = "book id"'), "field partition_key: its column is named after its attribute, and 'book id' is no name"),
        # Names Glue would keep as other names, or as one: refused at load, not at the first merge (issue 68).
        (('iceberg_table = "reviews"', 'iceberg_table = "Reviews"'), "table reviews, field iceberg_table: 'Reviews' is not a name Glue keeps as written"),
        (('name = "stars"', 'name = "Item"'), "table reviews, field columns[0].name: 'Item' is not a name Glue keeps as written"),
        (('name = "stars"', 'name = "ID"'), "table reviews, field columns[0].name: 'ID' is not a name Glue keeps as written"),
        # One column an attribute: Spark refuses a field read twice at every merge (AMBIGUOUS_REFERENCE_TO_FIELDS).
        ((STARS, STARS + ', { name = "body", attribute = "stars" }'), "table reviews, field columns[1]: attribute 'stars' is read by columns[0] already"),
        ((STARS, STARS + ', { name = "book", attribute = "book_id" }'), "field columns[1]: attribute 'book_id' is read by partition_key already"),
        ((STARS, STARS + ', { name = "body", attribute = "Stars" }'), "table reviews, field columns[1]: attribute 'Stars' is read by columns[0] already"),
        # Field types as TOML gives them: no bare TypeError, no True as a precision, no "false" as true.
        (("precision = 3", "precision = true"), "table reviews, field columns[0].precision: expected a whole number of digits, 1 to 38, got True"),
        (("precision = 3", "precision = 10.5"), "table reviews, field columns[0].precision: expected a whole number of digits, 1 to 38, got 10.5"),
        (("precision = 3", 'precision = "10"'), "table reviews, field columns[0].precision: expected a whole number of digits, 1 to 38, got '10'"),
        (("precision = 3", 'precision = 3, required = "false"'), "table reviews, field columns[0].required: expected true or false, got 'false'"),
        (("freshness_minutes = 2", "freshness_minutes = 2\npartition_by = [1]"), "table reviews, field partition_by[0]: expected a partition transform"),
        (('attribute = "stars"', "attribute = 7"), "table reviews, field columns[0].attribute: expected an attribute name, got 7"),
        (('type = "S" }', 'type = "S", size = 3 }'), "table reviews, field partition_key: unknown field 'size'"),
        (('kind = "streamed"', 'kind = "exported"'), "table reviews, field partition_by: an exported table needs a timestamp partition column"),
        (("freshness_minutes = 2", "freshness_minutes = 2\nsnapshot_retention_hours = 0.5"), "snapshot_retention_hours: expected a number of hours, at least"),
        (("freshness_minutes = 2", "freshness_minutes = 60\nmerge_interval_seconds = 901"), "merge_interval_seconds: expected seconds from 1 to 900"),
        (("freshness_minutes = 2", "freshness_minutes = 2\nmerge_interval_seconds = true"), "merge_interval_seconds: expected seconds from 1 to 900"),
        (
            ("freshness_minutes = 2", "freshness_minutes = 2\nmerge_interval_seconds = 90"),
            "merge_interval_seconds: 90 s is more than 1/2 of freshness_minutes (2): its freshness check would turn red between two merges; "
            "raise freshness_minutes to 3 or more",
        ),
        (("freshness_minutes = 2", 'freshness_minutes = 2\ncapture = "kinesis"'), "table reviews, field capture: 'kinesis' is not one of run, lambda"),
        (("freshness_minutes = 2", "freshness_minutes = 2\nstart_date = 2026-11-01"), "table reviews, field start_date: only a exported table has one"),
        (("freshness_minutes = 2", 'freshness_minutes = 2\nload = "in_process"'), "table reviews, field load: only a exported table has one"),
        (("[reviews]", "[reviews"), "not valid TOML"),
        (("[reviews]", '["re views"]'), "table re views, field [name]: table name 're views' is not allowed"),
    ],
)
def test_each_malformed_declaration_is_refused_naming_its_table_and_field(change, message):
    text = REVIEWS.replace(*change)
    assert text != REVIEWS
    with pytest.raises(DeclarationError) as refused:
        parse_declarations(text)
    assert message in str(refused.value)


def test_an_own_merge_interval_is_a_streamed_tables_only():
    from ddb_athena_tests.deploy.test_template import THIRD_TABLE

    exported = THIRD_TABLE[THIRD_TABLE.index("[audits]") :] + "merge_interval_seconds = 10\n"
    with pytest.raises(DeclarationError, match="table audits, field merge_interval_seconds: only a streamed table has one .*; audits is exported"):
        parse_declarations(exported)
    assert parse_declarations(REVIEWS + "merge_interval_seconds = 10\n")["reviews"].merge_interval_seconds == 10
    # Longer than the run's may go (a quiet table commits less), as far as half its freshness bound.
    slow = parse_declarations(REVIEWS.replace("freshness_minutes = 2", "freshness_minutes = 5") + "merge_interval_seconds = 150\n")["reviews"]
    assert slow.merge_interval_seconds == 150
    assert declared("books").merge_interval_seconds is None  # the run's


def test_a_name_that_collides_with_another_tables_tombstones_is_refused():
    tombstones = REVIEWS.replace("[reviews]", "[reviews_tombstones]").replace('iceberg_table = "reviews"', 'iceberg_table = "reviews_tombstones"')
    for text in (REVIEWS + tombstones, tombstones + REVIEWS):
        with pytest.raises(DeclarationError, match="collides with table"):
            parse_declarations(text)
    with pytest.raises(DeclarationError, match="collides with table"):
        parse_declarations(REVIEWS + REVIEWS.replace("[reviews]", "[reviews2]"))
    with pytest.raises(DeclarationError, match="no table declared"):
        parse_declarations("")


AUDITS_SCHEDULE = [
    ("start_date = 2026-02-30", "not valid TOML"),
    ('start_date = "1 March"', "table audits, field start_date: expected a date like 2026-11-01, got '1 March'"),
    ("start_date = 2026-03-01T00:00:00", "table audits, field start_date: expected a date like 2026-11-01, got datetime"),
    ("schedule_hour = 24", "table audits, field schedule_hour: expected an hour of the day, 0 to 23 (UTC), got 24"),
    ('schedule_hour = "5"', "table audits, field schedule_hour: expected an hour of the day, 0 to 23 (UTC), got '5'"),
    ("schedule_hour = true", "table audits, field schedule_hour: expected an hour of the day, 0 to 23 (UTC), got True"),
    ('load = "lambda"', "table audits, field load: 'lambda' is not one of in_process, spark_submit, emr_serverless"),
    ('capture = "run"', "table audits, field capture: only a streamed table has one"),
]


@pytest.mark.parametrize(("line", "message"), AUDITS_SCHEDULE)
def test_an_exported_tables_own_schedule_and_load_are_refused_when_malformed(line, message):
    from ddb_athena_tests.deploy.test_template import THIRD_TABLE

    with pytest.raises(DeclarationError) as refused:
        parse_declarations(THIRD_TABLE[THIRD_TABLE.index("[audits]") :] + line + "\n")
    assert message in str(refused.value)


def test_an_exported_tables_schedule_and_load_are_its_declarations_and_its_variables_override_them():
    """Issue 68: each exported table's start date, schedule hour and load in its declaration (TOML date or text); its
    DDB_ATHENA_<NAME>_* variables over them (orders' are the variables of before); the defaults for what neither says."""
    from datetime import date

    from ddb_athena.lib.settings import SettingsError, exported_table_settings
    from ddb_athena_tests.deploy.test_template import THIRD_TABLE

    audits_text = THIRD_TABLE[THIRD_TABLE.index("[audits]") :]
    audits = parse_declarations(audits_text + 'start_date = 2025-06-01\nschedule_hour = 4\nload = "spark_submit"\n')["audits"]
    declared_only = exported_table_settings(audits, {})
    assert (declared_only.start_date, declared_only.schedule_hour, declared_only.load) == (date(2025, 6, 1), 4, "spark_submit")
    assert parse_declarations(audits_text + 'start_date = "2025-06-01"\n')["audits"].start_date == date(2025, 6, 1)
    environ = {"DDB_ATHENA_AUDITS_SCHEDULE_HOUR": "7", "DDB_ATHENA_AUDITS_LOAD": "in_process", "DDB_ATHENA_ORDERS_LOAD": "x"}
    overridden = exported_table_settings(audits, environ)
    assert (overridden.start_date, overridden.schedule_hour, overridden.load) == (date(2025, 6, 1), 7, "in_process")
    defaults = exported_table_settings(parse_declarations(audits_text)["audits"], {"DDB_ATHENA_AUDITS_START_DATE": ""})
    assert (defaults.start_date, defaults.schedule_hour, defaults.load) == (date(2026, 11, 1), 2, "in_process")
    with pytest.raises(SettingsError, match="DDB_ATHENA_AUDITS_SCHEDULE_HOUR='25': Input should be less than or equal to 23"):
        exported_table_settings(audits, {"DDB_ATHENA_AUDITS_SCHEDULE_HOUR": "25"})
    # orders, as this repository declares it: the variables of before still move its partitions and its schedule.
    orders = Settings.from_env({"DDB_ATHENA_ORDERS_START_DATE": "2025-01-31", "DDB_ATHENA_ORDERS_SCHEDULE_HOUR": "5"}).exported["orders"]
    assert (orders.start_date, orders.schedule_hour, orders.load) == (date(2025, 1, 31), 5, "in_process")


def test_a_streamed_tables_declared_capture_is_its_own_whatever_the_deployments():
    from ddb_athena.lib.resources import sync_settings

    run_by_itself = parse_declarations(REVIEWS + 'capture = "run"\n')["reviews"]
    undeclared = parse_declarations(REVIEWS)["reviews"]
    by_lambda = sync_settings(Settings.from_env({"DDB_ATHENA_BOOKS_CAPTURE": "lambda"}))
    assert (by_lambda.capture_of(run_by_itself), by_lambda.capture_of(undeclared)) == ("run", "lambda")
    assert sync_settings(Settings.from_env({})).capture_of(parse_declarations(REVIEWS + 'capture = "lambda"\n')["reviews"]) == "lambda"


@pytest.mark.subprocess
def test_the_declarations_are_read_without_dagster_or_spark():
    probe = (
        "import sys, ddb_athena.lib.declarations as d; d.declared_tables(); print(sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'pyspark')))"
    )
    assert subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout.strip() == "[]"


def test_a_table_keeps_its_snapshots_as_long_as_it_declares_else_as_long_as_the_sync_resource_says(monkeypatch):
    from ddb_athena.lib import upkeep
    from ddb_athena.lib.resources import sync_settings

    sync = sync_settings(Settings.from_env({}))
    kept = parse_declarations(REVIEWS.replace("freshness_minutes = 2", "freshness_minutes = 2\nsnapshot_retention_hours = 24"))["reviews"]
    assert sync.snapshot_retention_of(kept) == timedelta(hours=24)
    assert sync.snapshot_retention_of(declared("books")) == sync.snapshot_retention == timedelta(hours=1)
    # The upkeep of the sync, the maintenance job and the orders load expire at it.
    asked = {}
    monkeypatch.setattr(upkeep, "maintain_table", lambda *args, **kwargs: asked.update(kwargs) or "result")
    monkeypatch.setattr(upkeep, "record_maintained", lambda *args: None)
    upkeep.maintain(type("Spark", (), {"spark_session": None, "catalog": "lake"})(), sync, kept)
    assert asked["snapshot_retention"] == timedelta(hours=24) and asked["tombstone_retention"] is not None


def test_an_exported_tables_partition_column_must_be_required():
    """Its load's insert-only match compares the partition column: a document without it loaded with a NULL partition,
    never matched, and was loaded again by every load (two rows for one order after two loads)."""
    from ddb_athena.lib.declarations import DECLARATIONS_FILE

    text = DECLARATIONS_FILE.read_text(encoding="utf-8")
    optional = text.replace('transform = "iso_timestamp", required = true }', 'transform = "iso_timestamp" }')
    assert optional != text
    with pytest.raises(DeclarationError, match=r"orders, field columns\[3\].required: the partition column created_at of an exported table must be"):
        parse_declarations(optional)
