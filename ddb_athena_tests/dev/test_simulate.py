"""Traffic on any declared table from its seed items: several items per partition key, updates, deletes and
re-inserts, and the simulator's idea of the table is the table's."""

import base64
import json
import random
from decimal import Decimal

import pytest

from ddb_athena.dev import simulate
from ddb_athena.dev.local_stack import create_dynamodb_table
from ddb_athena.dev.simulate import SeededTraffic, plain, seed_items
from ddb_athena.lib.declarations import parse_declarations
from ddb_athena_tests.lib.test_declarations import REVIEWS

BLOBS = """
[blobs]
kind = "streamed"
dynamodb_table = "blobs"
iceberg_table = "blobs"
partition_key = { attribute = "digest", type = "B" }
columns = [{ name = "size", attribute = "size", transform = "decimal" }]
freshness_minutes = 2
"""


def table_keys(dynamodb, name: str) -> list[tuple]:
    items = dynamodb.scan(TableName=name)["Items"]
    keys = ("book_id", "review_id", "digest")
    return sorted(tuple(sorted((attribute, plain(value)) for attribute, value in item.items() if attribute in keys)) for item in items)


@pytest.mark.parametrize(
    ("declaration", "seeds"),
    [
        (REVIEWS, [{"book_id": "book-1", "review_id": Decimal(1), "stars": Decimal(4)}, {"book_id": "book-2", "review_id": Decimal(1), "stars": Decimal(2)}]),
        (BLOBS, [{"digest": b"\x00#\xff", "size": Decimal(3)}]),
    ],
)
def test_seeded_traffic_keeps_the_table_it_describes_whatever_the_key(settings, declaration, seeds):
    (table,) = parse_declarations(declaration).values()
    dynamodb = settings.client("dynamodb")
    create_dynamodb_table(dynamodb, f"t-{table.name}", table)
    traffic = SeededTraffic(dynamodb, table, f"t-{table.name}", seeds, random.Random(7))
    assert traffic.seed() == len(seeds)
    actions = [traffic.step() for _ in range(300)]
    assert {"insert", "update", "delete", "reinsert"} <= set(actions)
    expected = sorted(tuple(sorted(key.items())) for key in traffic.live)
    assert table_keys(dynamodb, f"t-{table.name}") == expected
    if table.spec.sort_key:
        partitions = [key["book_id"] for key in traffic.live]
        assert max(partitions.count(partition) for partition in partitions) >= 5  # several reviews per book
    # A simulator started later picks the table up where it is.
    later = SeededTraffic(dynamodb, table, f"t-{table.name}", seeds, random.Random(8))
    later.load_existing_keys()
    assert sorted(tuple(sorted(key.items())) for key in later.live) == expected


def test_seed_items_are_exact_numbers_and_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(simulate, "SEEDS", tmp_path)
    (tmp_path / "ledger.json").write_text(json.dumps([{"id": {"B": base64.b64encode(b"\x01").decode()}, "amount": 0.1, "n": 12345678901234567890}]))
    assert seed_items("ledger") == [{"id": b"\x01", "amount": Decimal("0.1"), "n": Decimal(12345678901234567890)}]
    assert seed_items("absent") is None
