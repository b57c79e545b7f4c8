"""Composite keys (a partition key and a sort key, each S, N or B) against a plain Python model of DynamoDB: through
the stream path (the emulator's stream, the sync cycle, replays, late files, a bootstrap) and the export path."""

import base64
import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from ddb_athena.dev.local_stack import table_exists
from ddb_athena.lake import change_merge
from ddb_athena.lake.change_merge import merge_change_files, tombstone_versions
from ddb_athena.lake.dynamodb_json import item_to_wire
from ddb_athena.lake.export_load import ExportDataFile, load_export_files
from ddb_athena.lake.table_keys import InvalidKeyError, item_key, key_text, row_key
from ddb_athena.lake.table_spec import METADATA_UPKEEP_PROPERTIES, ColumnSpec, TableSpec
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeRecord, change_file_name, list_change_files, parse_change_file_name, write_change_file
from ddb_athena.streamed.capture.quarantine import quarantined_records
from ddb_athena.streamed.cycle import StreamSync
from ddb_athena_tests.exported.aws_layout import full_line, write_export

# Delimiter characters inside the values: joined with '#', ('a#b', 'c') and ('a', 'b#c') would be one key.
PARTITION_VALUES = ("a", "a#b", "b#c", "a#", "#", "b", "ä|x")
REVIEW_IDS = (1, 2, 3, 10, 10**37 + 7)  # the largest needs all 38 digits of decimal(38,0)
REVIEWS = TableSpec(
    "reviews",
    key=ColumnSpec("book_id", "book_id", "string"),
    sort_key=ColumnSpec("review_id", "review_id", "decimal", precision=38, scale=0),
    columns=(ColumnSpec("stars", "stars", "decimal", precision=3, scale=0), ColumnSpec("text", "text")),
    properties=METADATA_UPKEEP_PROPERTIES,
)
# A binary partition key: bytes compared as bytes, some of them not UTF-8 at all.
BLOBS = TableSpec(
    "blobs",
    key=ColumnSpec("blob", "blob", "binary"),
    sort_key=ColumnSpec("part", "part", "string"),
    columns=(ColumnSpec("size", "size", "decimal", precision=10, scale=0),),
    properties=METADATA_UPKEEP_PROPERTIES,
)
BLOB_VALUES = (b"\x00", b"\x00\x00", b"a#", b"\xff\xfe", b"#a")


class Model:
    """DynamoDB as a dict: key -> item, keys compared as DynamoDB compares them."""

    def __init__(self, spec: TableSpec):
        self.spec, self.items, self.deleted = spec, {}, set()

    def put(self, item: dict) -> None:
        self.items[item_key(self.spec, item)] = item

    def delete(self, item_keys: dict) -> None:
        self.items.pop(item_key(self.spec, item_keys), None)

    def rows(self) -> dict:
        return {key: item_to_wire(item) for key, item in self.items.items()}


def iceberg_items(spark, spec: TableSpec, table: str) -> dict:
    return {row_key(spec, row): json.loads(row["item"]) for row in spark.table(table).collect()}


def create_table(dynamodb, spec: TableSpec) -> None:
    """The DynamoDB table of `spec`, with its stream; reviews, the declared table of the same key, exists already."""
    if table_exists(dynamodb, spec.table):
        return
    schema = [(spec.key, "HASH"), (spec.sort_key, "RANGE")]
    dynamodb.create_table(
        TableName=spec.table,
        KeySchema=[{"AttributeName": column.attribute, "KeyType": kind} for column, kind in schema],
        AttributeDefinitions=[{"AttributeName": column.attribute, "AttributeType": column.type_tag} for column, _ in schema],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )


def review(rng: random.Random, book_id: str, review_id: int) -> dict:
    return {"book_id": {"S": book_id}, "review_id": {"N": str(review_id)}, "stars": {"N": str(rng.randint(1, 5))}, "text": {"S": f"#{rng.random()}"}}


def blob(rng: random.Random, value: bytes, part: str) -> dict:
    return {"blob": {"B": value}, "part": {"S": part}, "size": {"N": str(rng.randint(0, 10**9))}}


def random_traffic(dynamodb, spec: TableSpec, model: Model, rng: random.Random, make, operations: int) -> tuple[set, int]:
    """Puts (new keys, updates, re-inserts of deleted keys) and deletes, to the emulator and the model alike. Returns the
    keys deleted (and not written again) and how many deleted keys were inserted again."""
    deleted, reinserted = set(), 0
    for _ in range(operations):
        item = make(rng)
        key = item_key(spec, item)
        if key in model.items and rng.random() < 0.4:
            keys = {column.attribute: item[column.attribute] for column in spec.key_columns}
            dynamodb.delete_item(TableName=spec.table, Key=keys)
            model.delete(keys)
            deleted.add(key)
            continue
        dynamodb.put_item(TableName=spec.table, Item=item)
        model.put(item)
        reinserted += key in deleted or key in model.deleted
        deleted.discard(key)
    model.deleted |= deleted
    return deleted, reinserted


class KeysAsAwsSendsThem:
    """The emulator's stream with each record's Keys as AWS sends them. moto 5.2.5 encodes a B key attribute twice in
    Keys (base64 of its base64; NewImage and OldImage are right): the key attributes are taken from the image."""

    def __init__(self, streams):
        self._streams = streams

    def __getattr__(self, name):
        return getattr(self._streams, name)

    def get_records(self, **kwargs):
        page = self._streams.get_records(**kwargs)
        for record in page["Records"]:
            change = record["dynamodb"]
            image = change.get("NewImage") or change["OldImage"]
            change["Keys"] = {name: image[name] for name in change["Keys"]}
        return page


def replay(s3, layout: SourceLayout, keys: list[str], at: datetime) -> None:
    """Writes consumed change files again under new names: a replayed batch, or another host's late file."""
    for number, key in enumerate(keys):
        body = s3.get_object(Bucket=layout.bucket, Key=key)["Body"].read()
        s3.put_object(Bucket=layout.bucket, Key=layout.changes_prefix + change_file_name(at + timedelta(microseconds=number), "stream"), Body=body)


@pytest.mark.parametrize(
    ("spec", "make"),
    [
        (REVIEWS, lambda rng: review(rng, rng.choice(PARTITION_VALUES), rng.choice(REVIEW_IDS))),
        (BLOBS, lambda rng: blob(rng, rng.choice(BLOB_VALUES), rng.choice(("a", "a#", "")) or "#")),
    ],
    ids=["S+N", "B+S"],
)
def test_composite_keys_through_the_stream_converge_to_the_model_with_replays_late_files_and_a_bootstrap(spark, settings, spec, make, monkeypatch):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    create_table(dynamodb, spec)
    layout = SourceLayout(settings.bucket, f"{spec.table}_source")
    table = f"{settings.namespace}.{spec.table}"
    streams = KeysAsAwsSendsThem(settings.client("dynamodbstreams"))
    sync = StreamSync(dynamodb, streams, s3, lambda: spark, "s3a", spec.table, table, layout, log=print, warn=print, spec=spec)
    model, rng, reinserted, one_merge_below_rows = Model(spec), random.Random(20261127), 0, change_merge.ONE_MERGE_BELOW_ROWS
    for round_number in range(6):
        # Both shapes of a cycle, in turns: the split's semi and anti joins match on every key column.
        monkeypatch.setattr(change_merge, "ONE_MERGE_BELOW_ROWS", 0 if round_number % 2 else one_merge_below_rows)
        deleted, again = random_traffic(dynamodb, spec, model, rng, make, 40)
        reinserted += again
        if round_number in (2, 4):
            # Files merged rounds ago come back (nothing cleans them up here), older than what the table holds.
            merged = [key for key in list_change_files(s3, layout) if parse_change_file_name(key)[1] == "stream"]
            replay(s3, layout, merged[: 2 + round_number], datetime.now(UTC))
        outcome = sync.cycle(f"round-{round_number}", bootstrap=round_number == 3)
        assert outcome.merged.get("records_quarantined", 0) == 0
        assert iceberg_items(spark, spec, table) == model.rows(), f"round {round_number}"
    assert reinserted, "the traffic inserted a deleted key again"
    # Several sort keys under one partition key, and the same sort key under several partition keys.
    partitions = [key[0] for key in model.items]
    assert len(set(partitions)) < len(partitions) and len({key[1] for key in model.items}) < len(model.items)
    # Each delete of the last round is remembered by its whole key (not a joined string): no replay resurrects it.
    assert deleted and tombstone_versions(spark, spec, table, deleted).keys() == deleted


def write_changes(s3, layout: SourceLayout, minute: int, *records: ChangeRecord) -> str:
    return write_change_file(s3, layout, change_file_name(datetime(2026, 11, 27, 3, minute, tzinfo=UTC), "stream"), records)


def reviewed(event: str, sequence: int, book_id: str, review_id: str, stars: str = "4") -> ChangeRecord:
    keys = {"book_id": {"S": book_id}, "review_id": {"N": review_id}}
    image = None if event == "REMOVE" else {**keys, "stars": {"N": stars}}
    return ChangeRecord(event, keys, image, str(sequence), "2026-11-27T03:00:00.000000Z", "shard-0")


def test_a_number_key_is_its_value_not_its_text_and_one_a_column_would_round_is_quarantined(spark, settings):
    s3, layout, table = settings.client("s3"), SourceLayout(settings.bucket, "reviews_source"), f"{settings.namespace}.reviews"

    def merge(*keys: str):
        uris = [layout.uri(key, "s3a") for key in keys]
        return merge_change_files(spark, REVIEWS, table, uris, layout.uri(f"{layout.quarantine_prefix}q", "s3a"))

    merge(write_changes(s3, layout, 1, reviewed("INSERT", 1, "a", "7"), reviewed("INSERT", 2, "a#b", "7"), reviewed("INSERT", 3, "a", "8")))
    # 7.0 and 0007 are the key 7: an update and a delete of it, not two new keys.
    merge(write_changes(s3, layout, 2, reviewed("MODIFY", 4, "a", "7.0", stars="5"), reviewed("REMOVE", 5, "a", "0008")))
    rows = {row_key(REVIEWS, row): row["stars"] for row in spark.table(table).collect()}
    assert rows == {("a", Decimal(7)): Decimal(5), ("a#b", Decimal(7)): Decimal(4)}
    # 7.5 is no review_id of decimal(38,0): quarantined, never rounded onto 8 or 7; 1e40 does not fit at all.
    result = merge(write_changes(s3, layout, 3, reviewed("INSERT", 6, "a", "7.5"), reviewed("INSERT", 7, "a", "1E+40"), reviewed("MODIFY", 8, "a#b", "7", "3")))
    assert result.records_quarantined == 2 and result.keys_held == 0
    assert set(result.quarantine_reasons) == {
        "attribute review_id has more digits than decimal(38,0) keeps",
        "attribute review_id is not a valid decimal(38,0)",
    }
    assert {row_key(REVIEWS, row): row["stars"] for row in spark.table(table).collect()} == {("a", Decimal(7)): Decimal(5), ("a#b", Decimal(7)): Decimal(3)}
    # The quarantine names the attribute and the types, never the value.
    assert all("7.5" not in record["reason"] for record in quarantined_records(s3, layout))
    # A key whose newest change is bad is held (dropped until fixed), its older changes not applied; other keys merge.
    held = merge(write_changes(s3, layout, 4, reviewed("MODIFY", 9, "a", "7", stars="1"), reviewed("MODIFY", 10, "a", "7", stars="x")))
    assert held.keys_held == 1 and ("a", Decimal(7)) not in {row_key(REVIEWS, row) for row in spark.table(table).collect()}


def test_keys_are_shown_whole_never_joined():
    assert key_text(("book-1",)) == "book-1"
    assert key_text(("a#b", "c")) != key_text(("a", "b#c"))
    assert key_text(("a", Decimal("7"))) == '["a", "7"]' and key_text((b"\xff",)) == '["/w=="]'
    assert item_key(REVIEWS, {"book_id": {"S": "a"}, "review_id": {"N": "7.0"}}) == item_key(REVIEWS, {"book_id": {"S": "a"}, "review_id": {"N": "7"}})
    assert item_key(BLOBS, {"blob": {"B": base64.b64encode(b"\x00").decode()}, "part": {"S": "x"}}) == (b"\x00", "x")
    with pytest.raises(InvalidKeyError, match="missing key attribute review_id"):
        item_key(REVIEWS, {"book_id": {"S": "a"}})


# An exported table keyed by customer and order number (immutable documents), partitioned by day.
LEDGER = TableSpec(
    "ledger",
    key=ColumnSpec("customer", "customer", "string"),
    sort_key=ColumnSpec("order_no", "order_no", "decimal", precision=38, scale=0),
    columns=(ColumnSpec("created_at", "created_at", "iso_timestamp", required=True), ColumnSpec("total", "total", "decimal", precision=12, scale=2)),
    partition_by=("days(created_at)",),
    properties=METADATA_UPKEEP_PROPERTIES,
    source="export",
)


def test_composite_keys_through_the_export_load_insert_each_document_once(spark, settings):
    s3, layout, table = settings.client("s3"), SourceLayout(settings.bucket, "ledger_export"), f"{settings.namespace}.ledger"
    rng = random.Random(7)
    documents = {}
    for day, customer in enumerate(PARTITION_VALUES):
        # A customer's orders at one moment: only the sort key tells them apart.
        for order_no in rng.sample(REVIEW_IDS, 3):
            created = datetime(2026, 11, 20, tzinfo=UTC) + timedelta(days=day % 3)
            item = {"customer": {"S": customer}, "order_no": {"N": str(order_no)}, "created_at": {"S": created.isoformat()}, "total": {"N": "1.50"}}
            documents[item_key(LEDGER, item)] = item
    items = list(documents.values())

    def load(lines: list[str]):
        written = write_export(s3, settings.bucket, layout.prefix, [lines])
        files = [ExportDataFile(layout.uri(key, "s3a"), count) for key, count in zip(written["data_files"], written["data_file_items"], strict=True)]
        return load_export_files(spark, LEDGER, table, files, layout.uri(f"{layout.quarantine_prefix}q", "s3a"), datetime(2026, 11, 23, tzinfo=UTC))

    # The first half, one of them twice.
    half = items[: len(items) // 2]
    first = load([full_line(item) for item in half] + [full_line(half[0])])
    assert first.rows_inserted == len(half) and first.duplicates_skipped == 1 and first.records_quarantined == 0
    # Everything again: only the second half is new; a changed document is counted and named by its whole key.
    mutated = {**items[1], "total": {"N": "9.99"}}
    second = load([full_line(item) for item in items[2:]] + [full_line(mutated)])
    assert second.rows_inserted == len(items) - len(half) and second.mutated_documents == 1
    assert second.mutated_keys_sample == [key_text(item_key(LEDGER, items[1]))]
    assert iceberg_items(spark, LEDGER, table) == {key: item_to_wire(item) for key, item in documents.items()}
