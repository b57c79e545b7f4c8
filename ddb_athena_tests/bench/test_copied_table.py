"""A table ten times what the benchmark can seed (`make bench-cost --copies`): the memory table holds the copies as
they are read, and behaves as a table holding every one of them; Spark writes the same copies into Iceberg."""

import json
import random

from ddb_athena.dev.simulate import book_item
from ddb_athena.lib.declarations import declared
from ddb_athena_bench.memory_dynamodb import MemoryDynamoDB
from ddb_athena_bench.sync_capacity import copy_rows
from ddb_athena_tests.lake.helpers import ChangeFiles, change
from ddb_athena_tests.lake.test_schema_evolution import read_by_pyiceberg


def _stream(table: MemoryDynamoDB) -> list[tuple[str, str, dict | None]]:
    """Every record of every shard, in order: event, key, new image."""
    records = []
    for shard in table.describe_stream(StreamArn=table.stream_arn)["StreamDescription"]["Shards"]:
        iterator = table.get_shard_iterator(StreamArn=table.stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while (page := table.get_records(ShardIterator=iterator))["Records"]:
            records += [(record["eventName"], record["dynamodb"]["Keys"]["id"]["S"], record["dynamodb"].get("NewImage")) for record in page["Records"]]
            iterator = page["NextShardIterator"]
    return records


def test_a_copied_table_is_a_table_holding_every_copy_through_puts_updates_and_deletes():
    """25 items copied 4 times against a table seeded with the 100 items outright: after the same 1,500 random writes
    (puts, updates and deletes of originals, copies, new keys and keys that are no copy), the same items, count, scan
    and stream."""
    rng = random.Random(11)
    originals = [book_item(f"book-{number}", rng) for number in range(25)]
    copied, plain = MemoryDynamoDB("books", shards=2), MemoryDynamoDB("books", shards=2)
    copied.seed(originals)
    copied.copy_items(4)
    plain.seed([{**item, "id": {"S": f"{item['id']['S']}{suffix}"}} for item in originals for suffix in ("", "~1", "~2", "~3")])
    assert dict(copied.items) == dict(plain.items) and len(copied.items) == 100
    assert "book-1~0" not in copied.items and "book-1~4" not in copied.items and "book-99~1" not in copied.items

    keys = [*plain.items, "book-1~4", "book-1~0", "book-7~x", "new-1", "new-2~1"]
    for _ in range(1500):
        key, roll = rng.choice(keys), rng.random()
        for table in (copied, plain):
            writes = random.Random(roll)  # the same item for both
            if roll < 0.4:
                table.put_item(TableName="books", Item={**book_item(key, writes), "id": {"S": key}})
            elif roll < 0.7:
                table.update_item(
                    TableName="books", Key={"id": {"S": key}}, UpdateExpression="SET name = :n", ExpressionAttributeValues={":n": {"S": f"{roll}"}}
                )
            else:
                table.delete_item(TableName="books", Key={"id": {"S": key}})
    assert dict(copied.items) == dict(plain.items) and len(copied.items) == len(plain.items)

    def scanned(table: MemoryDynamoDB) -> dict:
        return {item["id"]["S"]: item for page in table.get_paginator("scan").paginate(TableName="books") for item in page["Items"]}

    assert scanned(copied) == scanned(plain) == dict(plain.items)
    stream = _stream(plain)
    assert _stream(copied) == stream and len(stream) > 1000
    assert copied.describe_table(TableName="books")["Table"]["ItemCount"] == len(plain.items)


def test_rows_copied_by_spark_are_their_originals_under_the_copies_keys_read_back_with_pyiceberg(spark, settings):
    files = ChangeFiles(spark, settings)
    files.write(*(change(1, f"book-{number}", name=f'"quoted" {number} \\ and "id":{{"S":"book-{number}"}} in a name') for number in range(5)))
    files.merge()
    copy_rows(spark, files.table, declared("books"), 3)

    rows = read_by_pyiceberg(settings, files.table)
    assert set(rows) == {f"book-{number}{suffix}" for number in range(5) for suffix in ("", "~1", "~2")}
    for key, row in rows.items():
        original = rows[key.split("~")[0]]
        item = json.loads(row["item"])
        assert item == {**json.loads(original["item"]), "id": {"S": key}}
        assert item["name"] == json.loads(original["item"])["name"]  # the same text in another attribute is left alone
        assert {**row, "id": None, "item": None} == {**original, "id": None, "item": None}
