"""Attribute names are free text in DynamoDB: dashes, dots, spaces, quotes, backticks, backslashes, any UTF-8. Keys and
typed columns over such names, through the stream path (change files merged) and the export path (a load), against a
plain model of the items, read back with PyIceberg as Athena reads the table: every name reaches SQL quoted or as text,
never bare."""

import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

from pyiceberg.table import StaticTable

from ddb_athena.lake.change_merge import merge_change_files
from ddb_athena.lake.dynamodb_json import item_to_wire
from ddb_athena.lake.export_load import ExportDataFile, load_export_files
from ddb_athena.lake.table_keys import item_key, row_key
from ddb_athena.lake.table_spec import METADATA_UPKEEP_PROPERTIES, ColumnSpec, TableSpec
from ddb_athena.lib.declarations import parse_declarations
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeRecord, change_file_name, write_change_file
from ddb_athena_tests.exported.aws_layout import full_line, write_export

# The attribute of each typed column: a key with a dash, a sort key with a dot, and the characters that end a SQL
# literal, a quoted identifier or a JSON path early.
ATTRIBUTES = {
    "user_id": "user-id",
    "order_id": "order.id",
    "first_name": "first name",
    "price": "prix €",
    "quoted": 'it\'s "quoted"',
    "ticked": "back`tick",
    "slashed": "a\\b",
    "note": "ключ ?[0]$.x",
}
COLUMNS = (
    ColumnSpec("first_name", ATTRIBUTES["first_name"], "string"),
    ColumnSpec("price", ATTRIBUTES["price"], "decimal", precision=10, scale=2),
    ColumnSpec("quoted", ATTRIBUTES["quoted"], "string"),
    ColumnSpec("ticked", ATTRIBUTES["ticked"], "boolean"),
    ColumnSpec("slashed", ATTRIBUTES["slashed"], "string"),
    ColumnSpec("note", ATTRIBUTES["note"], "string"),
)
USER_ID, ORDER_ID = ColumnSpec("user_id", ATTRIBUTES["user_id"], "string"), ColumnSpec("order_id", ATTRIBUTES["order_id"], "decimal", scale=2)
STREAMED = TableSpec("odd_names", key=USER_ID, sort_key=ORDER_ID, columns=COLUMNS, properties=METADATA_UPKEEP_PROPERTIES)
CREATED = ColumnSpec("created_at", "created at", "iso_timestamp", required=True)
EXPORTED = TableSpec(
    "odd_exports",
    key=USER_ID,
    sort_key=ORDER_ID,
    columns=(*COLUMNS, CREATED),
    partition_by=("days(created_at)",),
    properties=METADATA_UPKEEP_PROPERTIES,
    source="export",
)


def random_item(rng: random.Random, created: datetime) -> dict:
    item = {
        ATTRIBUTES["user_id"]: {"S": rng.choice(("u-1", "u.2", "u 3", "ü'4"))},
        ATTRIBUTES["order_id"]: {"N": str(Decimal(rng.randrange(1, 40)) / 4)},
        ATTRIBUTES["first_name"]: {"S": rng.choice(("Ada", "O'Brien", "`tick`", "back\\slash"))},
        ATTRIBUTES["price"]: {"N": str(Decimal(rng.randrange(0, 10**6)) / 100)},
        ATTRIBUTES["quoted"]: {"S": f"q{rng.random()}"},
        ATTRIBUTES["ticked"]: {"BOOL": rng.random() < 0.5},
        ATTRIBUTES["slashed"]: {"S": "x\\y"},
        "created at": {"S": created.isoformat()},
    }
    if rng.random() < 0.7:  # sometimes absent, as an optional attribute is
        item[ATTRIBUTES["note"]] = {"S": "n"}
    return item


def expected_row(spec: TableSpec, item: dict) -> dict:
    """What each typed column holds of `item`, by the model: DynamoDB's values, typed."""
    typed = {"S": str, "N": Decimal, "BOOL": bool}
    row = {}
    for column in spec.all_columns:
        (tag, value), *_ = item[column.attribute].items() if column.attribute in item else ((None, None),)
        row[column.name] = None if tag is None else datetime.fromisoformat(value) if column.transform == "iso_timestamp" else typed[tag](value)
    return row


def read_by_pyiceberg(settings, table: str) -> list[dict]:
    namespace, name = table.split(".")
    location = Path(urlparse(settings.warehouse).path) / namespace / name
    return StaticTable.from_metadata(str(location)).scan().to_arrow().to_pylist()


def assert_reads_as_the_model(settings, spec: TableSpec, table: str, model: dict) -> None:
    rows = {row_key(spec, row): row for row in read_by_pyiceberg(settings, table)}
    assert rows.keys() == model.keys()
    for key, item in model.items():
        assert {name: rows[key][name] for name in spec.table_column_names if name in expected_row(spec, item)} == expected_row(spec, item), key
        assert json.loads(rows[key]["item"]) == item_to_wire(item), key


def test_any_attribute_name_works_for_keys_and_typed_columns_through_the_stream_path(spark, settings):
    s3, layout, table = settings.client("s3"), SourceLayout(settings.bucket, "odd_names_source"), f"{settings.namespace}.odd_names"
    rng, model, sequence = random.Random(68), {}, 0
    for round_number in range(3):
        records = []
        for _ in range(30):
            sequence += 1
            item = random_item(rng, datetime(2026, 12, 1, tzinfo=UTC))
            key = item_key(STREAMED, item)
            keys = {column.attribute: item[column.attribute] for column in STREAMED.key_columns}
            if key in model and rng.random() < 0.3:
                records.append(ChangeRecord("REMOVE", keys, None, str(sequence), "2026-12-01T00:00:00.000000Z", "shard-0"))
                del model[key]
            else:
                item.pop("created at")
                records.append(ChangeRecord("MODIFY" if key in model else "INSERT", keys, item, str(sequence), "2026-12-01T00:00:00.000000Z", "shard-0"))
                model[key] = item
        name = change_file_name(datetime(2026, 12, 1, 0, round_number, tzinfo=UTC), "stream")
        uri = layout.uri(write_change_file(s3, layout, name, records), "s3a")
        merged = merge_change_files(spark, STREAMED, table, [uri], layout.uri(f"{layout.quarantine_prefix}q{round_number}", "s3a"))
        assert merged.records_quarantined == 0, merged.quarantine_reasons
        assert_reads_as_the_model(settings, STREAMED, table, model)
    # A missing key attribute is quarantined, a wrong type noted, with reasons that name the attribute as it is written.
    sequence += 1
    wrong = {**random_item(rng, datetime(2026, 12, 1, tzinfo=UTC)), ATTRIBUTES["price"]: {"S": "cheap"}}
    wrong.pop("created at")
    keys = {column.attribute: wrong[column.attribute] for column in STREAMED.key_columns}
    keyless = {ATTRIBUTES["order_id"]: {"N": "1"}}
    records = [
        ChangeRecord("MODIFY", keys, wrong, str(sequence), "2026-12-01T00:00:00.000000Z", "shard-0"),
        ChangeRecord("INSERT", keyless, keyless, str(sequence + 1), "2026-12-01T00:00:00.000000Z", "shard-0"),
    ]
    uri = layout.uri(write_change_file(s3, layout, change_file_name(datetime(2026, 12, 1, 0, 9, tzinfo=UTC), "stream"), records), "s3a")
    merged = merge_change_files(spark, STREAMED, table, [uri], layout.uri(f"{layout.quarantine_prefix}q9", "s3a"))
    assert set(merged.quarantine_reasons) == {"missing key attribute user-id (S)"}
    assert merged.type_mismatches == {"attribute prix € is S where its column price expects N": 1}  # applied, its column NULL


def test_any_attribute_name_works_for_keys_and_typed_columns_through_the_export_path(spark, settings):
    s3, layout, table = settings.client("s3"), SourceLayout(settings.bucket, "odd_exports_export"), f"{settings.namespace}.odd_exports"
    rng, model = random.Random(69), {}
    for _ in range(60):
        item = random_item(rng, datetime(2026, 11, 20, tzinfo=UTC) + timedelta(days=rng.randrange(3), minutes=rng.randrange(600)))
        model.setdefault(item_key(EXPORTED, item), item)  # documents are immutable: the first of a key is the one
    written = write_export(s3, settings.bucket, layout.prefix, [[full_line(item) for item in model.values()]])
    files = [ExportDataFile(layout.uri(key, "s3a"), count) for key, count in zip(written["data_files"], written["data_file_items"], strict=True)]
    loaded = load_export_files(spark, EXPORTED, table, files, layout.uri(f"{layout.quarantine_prefix}q", "s3a"), datetime(2026, 11, 23, tzinfo=UTC))
    assert loaded.records_quarantined == 0 and loaded.rows_inserted == len(model)
    assert_reads_as_the_model(settings, EXPORTED, table, model)


def test_a_declaration_takes_any_attribute_name_and_names_its_columns_in_glues_terms():
    declared = parse_declarations(
        """
[odd]
kind = "streamed"
dynamodb_table = "odd"
iceberg_table = "odd"
partition_key = { attribute = "user-id", type = "S", name = "user_id" }
sort_key = { attribute = "order.id", type = "N", name = "order_id" }
columns = [{ name = "quoted", attribute = "it's \\"quoted\\" `and` \\\\ ключ" }]
freshness_minutes = 2
"""
    )["odd"]
    assert [column.attribute for column in declared.spec.all_columns] == ["user-id", "order.id", 'it\'s "quoted" `and` \\ ключ']
