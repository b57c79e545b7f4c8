"""Differential test: random DynamoDB traffic, captured and merged in rounds, must equal a scan of DynamoDB."""

import json
import random
from datetime import UTC, datetime
from decimal import Decimal

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lake import change_merge
from ddb_athena.lake.change_merge import merge_change_files
from ddb_athena.lake.dynamodb_json import item_to_wire
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeFileNamer, list_change_files
from ddb_athena.streamed.capture.commit_manifests import delete_committed_files, write_commit_manifest
from ddb_athena.streamed.capture.stream_reader import StreamCapture

ROUNDS = 6
OPERATIONS_PER_ROUND = 60


def dynamodb_rows(dynamodb, table: str) -> dict[str, dict]:
    """What library.books must hold, computed independently from a scan (not through the merge's SQL)."""
    rows, kwargs = {}, {"TableName": table, "ConsistentRead": True}
    while True:
        page = dynamodb.scan(**kwargs)
        for item in page["Items"]:
            wire = item_to_wire(item)
            nanos = int(Decimal(item["date"]["N"])) if "date" in item else None
            rows[item["id"]["S"]] = {
                "id": item["id"]["S"],
                "name": item.get("name", {}).get("S"),
                "author": item.get("author", {}).get("S"),
                "summary": item.get("summary", {}).get("S"),
                "published_at": datetime.fromtimestamp(nanos // 1000 / 1_000_000, tz=UTC).replace(tzinfo=None) if nanos is not None else None,
                "item": wire,
            }
        if "LastEvaluatedKey" not in page:
            return rows
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def iceberg_rows(spark, table: str) -> dict[str, dict]:
    columns = ["id", "name", "author", "summary", "published_at", "item"]
    return {
        row["id"]: {**{column: row[column] for column in columns}, "item": json.loads(row["item"])} for row in spark.table(table).select(*columns).collect()
    }


def test_rounds_of_random_changes_converge_to_dynamodb_column_by_column(spark, settings, monkeypatch):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    layout = SourceLayout(settings.bucket, "books_source")
    table = f"{settings.namespace}.books"
    capture = StreamCapture(dynamodb, settings.client("dynamodbstreams"), s3, settings.dynamodb_tables["books"], layout, namer=ChangeFileNamer())
    simulator = BookSimulator(dynamodb, settings.dynamodb_tables["books"], rng=random.Random(20261122))
    seen_actions, one_merge_below_rows = set(), change_merge.ONE_MERGE_BELOW_ROWS
    for round_number in range(ROUNDS):
        for _ in range(OPERATIONS_PER_ROUND):
            seen_actions.add(simulator.step())
        capture.capture()
        files = list_change_files(s3, layout)
        # Both shapes of a cycle, in turns: one MERGE (a small table's), a MERGE of the keys held and an append.
        monkeypatch.setattr(change_merge, "ONE_MERGE_BELOW_ROWS", 0 if round_number % 2 else one_merge_below_rows)
        result = merge_change_files(
            spark, declared("books").spec, table, [layout.uri(k, "s3a") for k in files], layout.uri(f"{layout.quarantine_prefix}r{round_number}", "s3a")
        )
        assert result.records_quarantined == 0
        manifest = write_commit_manifest(s3, layout, f"round-{round_number}", files, table, result.snapshot_id)
        if round_number % 2 == 0:  # every other cleanup "fails": the next round replays those files too
            delete_committed_files(s3, settings.bucket, manifest)

        expected, actual = dynamodb_rows(dynamodb, settings.dynamodb_tables["books"]), iceberg_rows(spark, table)
        assert actual.keys() == expected.keys(), f"round {round_number}: ids differ"
        for book_id, row in expected.items():
            assert actual[book_id] == row, f"round {round_number}: {book_id} differs"
    # The traffic exercised every kind of change, including deleting and re-inserting the same ids.
    assert seen_actions == {"insert", "update", "delete", "reinsert"}
