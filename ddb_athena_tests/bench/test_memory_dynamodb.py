"""The table and stream served from memory (the sync capacity benchmark's source) behave as DynamoDB's do for a
capture: every write once, in order per key, resumable from a checkpoint, 1,000 records a page at most."""

import json
import random

import pytest

from ddb_athena.dev.simulate import BookSimulator, book_item
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files
from ddb_athena.streamed.capture.stream_reader import StreamCapture
from ddb_athena_bench.memory_dynamodb import MemoryDynamoDB


@pytest.fixture
def layout(settings):
    return SourceLayout(settings.bucket, "books_source")


def _captured(s3, layout) -> list[dict]:
    lines = []
    for key in list_change_files(s3, layout):
        lines += s3.get_object(Bucket=layout.bucket, Key=key)["Body"].read().decode().splitlines()
    return [json.loads(line) for line in lines]


def test_a_capture_takes_every_write_once_and_replaying_them_gives_the_table(settings, layout):
    table, rng = MemoryDynamoDB("books", shards=3), random.Random(3)
    table.seed([book_item(f"seeded-{number}", rng) for number in range(20)])  # before the stream: not in it
    simulator = BookSimulator(table, "books", rng=rng)
    simulator.load_existing_ids()
    s3 = settings.client("s3")
    for _ in range(1500):
        simulator.step()
    first = StreamCapture(table, table, s3, "books", layout).capture()
    for _ in range(700):
        simulator.step()
    second = StreamCapture(table, table, s3, "books", layout).capture()  # a restart: from the checkpoints
    assert first.records + second.records == 2200 == len(table.take_served())
    assert table.records_waiting() == 0 and first.shards_read == 3

    records = _captured(s3, layout)
    assert len({record["sequence_number"] for record in records}) == 2200
    replayed = {f"seeded-{number}" for number in range(20)}
    for record in sorted(records, key=lambda record: int(record["sequence_number"])):
        key = record["keys"]["id"]["S"]
        if record["event_name"] == "REMOVE":
            replayed.remove(key)  # only a key that exists is removed
        else:
            assert (record["event_name"] == "INSERT") == (key not in replayed)
            replayed.add(key)
    assert replayed == set(table.items)
    assert simulator.counts["update"] and simulator.counts["delete"] and simulator.counts["reinsert"]


def test_a_page_holds_at_most_a_thousand_records():
    table = MemoryDynamoDB("books", shards=1)
    for number in range(2500):
        table.put_item(TableName="books", Item={"id": {"S": f"b{number}"}})
    shard = table.describe_stream(StreamArn=table.stream_arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = table.get_shard_iterator(StreamArn=table.stream_arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    sizes = []
    while True:
        page = table.get_records(ShardIterator=iterator, Limit=5000)
        if not page["Records"]:
            break
        sizes.append(len(page["Records"]))
        iterator = page["NextShardIterator"]
    assert sizes == [1000, 1000, 500] and len(table.take_served()) == 2500 and table.take_served() == []
    with pytest.raises(ValueError, match="dropped once served"):  # a reader cannot go back before what it was served
        table.get_records(ShardIterator=f"{shard.removeprefix('shard-')}:0")
    assert table.describe_table(TableName="books")["Table"]["ItemCount"] == 2500
