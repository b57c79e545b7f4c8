import json
from datetime import UTC, datetime, timedelta

import pytest

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files, list_keys
from ddb_athena.streamed.capture.checkpoints import CheckpointStore, ShardCheckpoint
from ddb_athena.streamed.capture.stream_reader import StreamCapture, StreamGapError, StreamNotEnabledError, parents_first
from ddb_athena_tests.streamed.capture.fakes import STREAM_ARN, FakeDynamoDB, FakeShard, FakeStreams, stream_record


def read_records(s3, bucket: str, key: str) -> list[dict]:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    return [json.loads(line) for line in body.splitlines()]


def captured_sequences(s3, layout) -> list[str]:
    return [r["sequence_number"] for key in list_change_files(s3, layout) for r in read_records(s3, layout.bucket, key)]


@pytest.fixture
def layout(settings):
    return SourceLayout(settings.bucket, "books_source")


def fake_capture(settings, layout, streams, **kwargs) -> StreamCapture:
    return StreamCapture(FakeDynamoDB(), streams, settings.client("s3"), "books", layout, **kwargs)


# --- against moto's real stream ---------------------------------------------------------------


def put_book(dynamodb, book_id: str, name: str = "x"):
    dynamodb.put_item(TableName="books", Item={"id": {"S": book_id}, "name": {"S": name}})


def test_captures_every_change_and_resumes_from_its_checkpoint(settings, layout):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    capture = StreamCapture(dynamodb, settings.client("dynamodbstreams"), s3, "books", layout)
    for index in range(3):
        put_book(dynamodb, f"b{index}")
    first = capture.capture()
    assert first.records == 3 and first.events == {"INSERT": 3} and len(first.change_files) == 1

    assert capture.capture().records == 0  # nothing new, nothing written
    put_book(dynamodb, "b0", "renamed")
    dynamodb.delete_item(TableName="books", Key={"id": {"S": "b1"}})
    again = StreamCapture(dynamodb, settings.client("dynamodbstreams"), s3, "books", layout).capture()  # a restart
    assert again.events == {"MODIFY": 1, "REMOVE": 1}
    records = read_records(s3, settings.bucket, again.change_files[0])
    assert [r["event_name"] for r in records] == ["MODIFY", "REMOVE"]
    assert records[0]["new_image"]["name"] == {"S": "renamed"} and records[1]["new_image"] is None
    assert records[1]["keys"] == {"id": {"S": "b1"}}
    sequences = captured_sequences(s3, layout)
    assert len(sequences) == len(set(sequences)) == 5


def test_a_capture_reads_the_checkpoints_once_and_then_keeps_what_it_writes(settings, layout):
    """A cycle every few seconds costs what the stream brings, not a listing and a read of every checkpoint."""
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    capture = StreamCapture(dynamodb, settings.client("dynamodbstreams"), s3, "books", layout)
    put_book(dynamodb, "b0")
    assert capture.capture().records == 1
    reads = []
    s3.meta.events.register("before-call.s3.*", lambda model, params, **_: reads.append((model.name, params.get("Prefix") or params.get("Key"))))
    put_book(dynamodb, "b1")
    assert capture.capture().records == 1 and capture.capture().records == 0
    assert not [read for read in reads if read[0] in ("ListObjectsV2", "GetObject") and layout.checkpoints_prefix in read[1]], reads
    # What it kept is what S3 holds: a restart resumes from the same position.
    put_book(dynamodb, "b2")
    assert StreamCapture(dynamodb, settings.client("dynamodbstreams"), s3, "books", layout).capture().records == 1
    assert len(set(captured_sequences(s3, layout))) == 3


class FailingChangeFileS3:
    """An S3 client whose change-file writes fail: the checkpoint must not move."""

    def __init__(self, s3):
        self._s3 = s3

    def put_object(self, **kwargs):
        if "/changes/" in kwargs["Key"]:
            raise ConnectionError("S3 unavailable")
        return self._s3.put_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self._s3, name)


def test_the_checkpoint_moves_only_after_the_change_file_is_durable(settings, layout):
    dynamodb, s3, streams = settings.client("dynamodb"), settings.client("s3"), settings.client("dynamodbstreams")
    put_book(dynamodb, "b1")
    StreamCapture(dynamodb, streams, s3, "books", layout).capture()
    put_book(dynamodb, "b2")
    with pytest.raises(ConnectionError):
        StreamCapture(dynamodb, streams, FailingChangeFileS3(s3), "books", layout).capture()
    retried = StreamCapture(dynamodb, streams, s3, "books", layout).capture()
    assert retried.records == 1 and read_records(s3, settings.bucket, retried.change_files[0])[0]["keys"] == {"id": {"S": "b2"}}


def test_a_table_without_a_stream_is_reported_with_the_fix(settings, layout):
    dynamodb = settings.client("dynamodb")
    dynamodb.create_table(
        TableName="plain",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    capture = StreamCapture(dynamodb, settings.client("dynamodbstreams"), settings.client("s3"), "plain", layout)
    with pytest.raises(StreamNotEnabledError, match="--stream-specification StreamEnabled=true"):
        capture.capture()


# --- AWS behaviours moto does not have --------------------------------------------------------


def split_stream() -> FakeStreams:
    """A parent shard that split into two children; pages of two records."""
    return FakeStreams(
        [
            FakeShard("shard-0-parent", [stream_record(s, "a") for s in (100, 101, 102)]),
            FakeShard("shard-1-child", [stream_record(s, "a") for s in (200, 201)], parent="shard-0-parent"),
            FakeShard("shard-2-child", [stream_record(s, "b") for s in (300,)], parent="shard-0-parent", closed=False),
            FakeShard("shard-3-grandchild", [stream_record(400, "a")], parent="shard-1-child", closed=False),
        ]
    )


def test_parents_are_ordered_before_children_whatever_the_listing_order():
    shards = split_stream().describe_stream(StreamArn=STREAM_ARN)["StreamDescription"]["Shards"]
    shards += split_stream().describe_stream(StreamArn=STREAM_ARN, ExclusiveStartShardId="shard-1-child")["StreamDescription"]["Shards"]
    ordered = [shard["ShardId"] for shard in parents_first(list(reversed(shards)))]
    assert ordered.index("shard-0-parent") < ordered.index("shard-1-child") < ordered.index("shard-3-grandchild")
    assert ordered.index("shard-0-parent") < ordered.index("shard-2-child")


def test_split_shards_are_read_parent_first_and_closed_shards_are_finished(settings, layout):
    streams = split_stream()
    result = fake_capture(settings, layout, streams).capture()
    assert result.records == 7 and result.shards_read == 4
    # Files are named in capture order, so every parent's records precede its children's.
    order = captured_sequences(settings.client("s3"), layout)
    assert sorted(order) == ["100", "101", "102", "200", "201", "300", "400"]
    assert order[:3] == ["100", "101", "102"] and order.index("201") < order.index("400")
    checkpoints = {c.shard_id: c for c in CheckpointStore(settings.client("s3"), layout).load_all()}
    # Finished shards whose children have gone past them are forgotten: a capture reads the open shards' checkpoints.
    assert "shard-0-parent" not in checkpoints and "shard-1-child" not in checkpoints
    assert checkpoints["shard-3-grandchild"].sequence_number == "400"
    assert not checkpoints["shard-2-child"].finished and checkpoints["shard-2-child"].sequence_number == "300"
    # The finished parent is not read again.
    streams.calls.clear()
    assert fake_capture(settings, layout, streams).capture().records == 0
    assert "shard-0-parent" not in streams.calls


def test_children_wait_until_their_parent_is_read_to_the_end(settings, layout):
    streams = split_stream()
    first = fake_capture(settings, layout, streams, max_records=2).capture()
    assert first.records == 2 and set(streams.calls) == {"shard-0-parent"}
    rest = fake_capture(settings, layout, streams).capture()
    assert rest.records == 5
    assert sorted(captured_sequences(settings.client("s3"), layout)) == ["100", "101", "102", "200", "201", "300", "400"]


def test_an_expired_iterator_is_renewed_without_losing_or_repeating_records(settings, layout):
    streams = FakeStreams([FakeShard("shard-0", [stream_record(s, f"k{s}") for s in range(1, 8)])])
    original = streams.get_records
    calls = {"n": 0}

    def expire_on_second_page(**kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            streams.expire_next_get_records = 1
        return original(**kwargs)

    streams.get_records = expire_on_second_page
    result = fake_capture(settings, layout, streams).capture()
    assert result.records == 7
    assert captured_sequences(settings.client("s3"), layout) == [str(s) for s in range(1, 8)]


def test_a_trimmed_checkpoint_fails_loudly_with_the_bootstrap_path(settings, layout):
    streams = FakeStreams([FakeShard("shard-0", [stream_record(s, "a") for s in range(1, 6)], closed=False)])
    CheckpointStore(settings.client("s3"), layout).save(ShardCheckpoint(STREAM_ARN, "shard-0", sequence_number="1"))
    streams.trimmed_before["shard-0"] = 4  # records 2 and 3 are gone
    with pytest.raises(StreamGapError, match="bootstrap"):
        fake_capture(settings, layout, streams).capture()
    assert list_change_files(settings.client("s3"), layout) == []


def test_an_unfinished_shard_that_vanished_fails_loudly(settings, layout):
    CheckpointStore(settings.client("s3"), layout).save(ShardCheckpoint(STREAM_ARN, "shard-gone", sequence_number="5"))
    streams = FakeStreams([FakeShard("shard-new", [stream_record(9, "a")], closed=False)])
    with pytest.raises(StreamGapError, match="shard-gone was trimmed"):
        fake_capture(settings, layout, streams).capture()


def test_a_recreated_stream_is_not_mistaken_for_a_fresh_start(settings, layout):
    CheckpointStore(settings.client("s3"), layout).save(ShardCheckpoint(STREAM_ARN.replace("2026", "2025"), "shard-0", sequence_number="5"))
    streams = FakeStreams([FakeShard("shard-0", [stream_record(1, "a")], closed=False)])
    with pytest.raises(StreamGapError, match="stream of 'books' changed"):
        fake_capture(settings, layout, streams).capture()
    # The bootstrap path: the new stream's present end before the scan replaces the positions; the capture goes on
    # from there, never re-applying what the scan has seen.
    capture = fake_capture(settings, layout, streams)
    positions = capture.present_end()
    assert [(p.shard_id, p.sequence_number, p.finished) for p in positions] == [("shard-0", "1", False)]
    streams.shards["shard-0"].records.append(stream_record(2, "b"))
    capture.restart_from(positions)
    assert capture.capture().records == 1
    assert captured_sequences(settings.client("s3"), layout) == ["2"]


def test_an_empty_page_is_not_the_end_of_a_shard(settings, layout):
    streams = split_stream()
    streams.empty_page_before_each = True  # every page of records comes after an empty one
    result = fake_capture(settings, layout, streams).capture()
    assert result.records == 7
    assert sorted(captured_sequences(settings.client("s3"), layout)) == ["100", "101", "102", "200", "201", "300", "400"]
    # The closed parent was read to its end (no next iterator) and its children started in the same capture.
    assert fake_capture(settings, layout, streams).capture().records == 0


def test_a_closed_parent_with_nothing_left_is_finished_so_its_children_start(settings, layout):
    streams = split_stream()
    store = CheckpointStore(settings.client("s3"), layout)
    store.save(ShardCheckpoint(STREAM_ARN, "shard-0-parent", sequence_number="102"))  # every record read, end not yet seen
    result = fake_capture(settings, layout, streams).capture()
    assert sorted(captured_sequences(settings.client("s3"), layout)) == ["200", "201", "300", "400"] and result.records == 4


def test_pruned_parents_are_still_known_as_finished_after_the_stream_trims_them(settings, layout):
    streams = split_stream()
    streams.shards["shard-2-child"].records = []  # a child that has had no record yet
    fake_capture(settings, layout, streams).capture()
    assert "shard-0-parent" not in {c.shard_id for c in CheckpointStore(settings.client("s3"), layout).load_all()}
    # A day later the stream has trimmed the parent: its silent child is no gap, and the parent is not read again.
    del streams.shards["shard-0-parent"]
    streams.shards["shard-2-child"].records = [stream_record(301, "b")]
    assert fake_capture(settings, layout, streams).capture().records == 1


class SlowStreams(FakeStreams):
    """Each GetRecords takes `seconds_per_call` of a fake clock: a stream the capture cannot keep up with."""

    def __init__(self, shards, seconds_per_call: float):
        super().__init__(shards)
        self.now, self.seconds_per_call = 0.0, seconds_per_call

    def clock(self) -> float:
        return self.now

    def get_records(self, ShardIterator, Limit):
        self.now += self.seconds_per_call
        return super().get_records(ShardIterator=ShardIterator, Limit=Limit)


def test_behind_a_slow_stream_each_capture_ends_after_its_time_and_the_next_goes_on(settings, layout):
    streams = SlowStreams([FakeShard("shard-0", [stream_record(s, f"k{s}") for s in range(1, 41)], closed=False)], seconds_per_call=1.0)

    def capture():
        return fake_capture(settings, layout, streams, max_seconds=10, clock=streams.clock).capture()

    first = capture()
    assert not first.caught_up and 0 < first.records <= 22  # ten pages of two, not the whole backlog
    captures = [first]
    while captures[-1].records:
        captures.append(capture())
    assert captures[-1].caught_up and len(captures) >= 3  # two behind, then caught up
    # Nothing lost, nothing twice, in stream order.
    assert captured_sequences(settings.client("s3"), layout) == [str(s) for s in range(1, 41)]


def test_a_shard_written_to_all_the_time_is_read_to_where_it_ended_when_the_capture_began(settings, layout):
    """It never reads empty: the capture stops at the first page holding a record written after it began (a second
    after, as DynamoDB stamps records to the second), instead of chasing the shard's tail until its time bound."""
    before = [stream_record(s, f"k{s}") for s in range(1, 7)]
    written_since = [stream_record(s, f"k{s}", created=datetime.now(UTC) + timedelta(minutes=5)) for s in range(7, 27)]
    streams = FakeStreams([FakeShard("shard-0", before + written_since, closed=False)], page_size=2)
    capture = fake_capture(settings, layout, streams)
    first = capture.capture()
    # Three pages from before the start, and the page that reached past it: caught up, the rest for the next capture.
    assert first.caught_up and first.records == 8
    assert len(streams.calls) == 4
    while capture.capture().records:
        pass
    assert captured_sequences(settings.client("s3"), layout) == [str(s) for s in range(1, 27)]  # nothing lost or twice


# --- a shard read while empty, and the 24-hour trim ------------------------------------------------


def age_checkpoints(s3, layout, hours: float) -> None:
    """Moves every time a checkpoint records `hours` into the past: as if the last capture had run that long ago."""
    for key in [obj["Key"] for obj in list_keys(s3, layout.bucket, layout.checkpoints_prefix)]:
        fields = json.loads(s3.get_object(Bucket=layout.bucket, Key=key)["Body"].read())
        for name, value in fields.items():
            if name.endswith("_at") and value:
                fields[name] = (datetime.fromisoformat(value) - timedelta(hours=hours)).isoformat()
        s3.put_object(Bucket=layout.bucket, Key=key, Body=json.dumps(fields).encode())


def empty_open_shard(**kwargs) -> FakeStreams:
    return FakeStreams([FakeShard("shard-0", [], closed=False, **kwargs)])


def test_records_trimmed_after_a_shard_was_read_empty_fail_loudly(settings, layout):
    s3, streams = settings.client("s3"), empty_open_shard()
    assert fake_capture(settings, layout, streams).capture().records == 0
    # The captures stop for 30 hours: records 1-5 are written meanwhile, and 1-3 are trimmed before the next one.
    age_checkpoints(s3, layout, hours=30)
    streams.shards["shard-0"].records = [stream_record(s, f"k{s}") for s in range(1, 6)]
    streams.trimmed_before["shard-0"] = 4
    with pytest.raises(StreamGapError, match="shard-0 .*trimmed.*bootstrap"):
        fake_capture(settings, layout, streams).capture()
    assert list_change_files(s3, layout) == []  # records 4-5 are not captured as if nothing was missing


def test_a_shard_still_empty_long_after_its_empty_read_fails_loudly(settings, layout):
    """Whatever was written to it since may all have been trimmed: nothing in the stream shows it was not."""
    s3, streams = settings.client("s3"), empty_open_shard()
    fake_capture(settings, layout, streams).capture()
    age_checkpoints(s3, layout, hours=30)
    with pytest.raises(StreamGapError, match="bootstrap"):
        fake_capture(settings, layout, streams).capture()


def test_an_empty_shard_that_gets_its_first_records_later_is_no_gap(settings, layout):
    # Numbered as AWS may: the shard's starting sequence number below its first record's.
    streams = empty_open_shard(starting_sequence=5)
    assert fake_capture(settings, layout, streams).capture().records == 0
    age_checkpoints(settings.client("s3"), layout, hours=20)  # within the stream's 24 hours: nothing can be trimmed
    streams.shards["shard-0"].records = [stream_record(s, f"k{s}") for s in (7, 8)]
    assert fake_capture(settings, layout, streams).capture().records == 2
    assert captured_sequences(settings.client("s3"), layout) == ["7", "8"]


def test_a_shard_whose_first_record_is_still_there_is_no_gap_however_late(settings, layout):
    s3, streams = settings.client("s3"), empty_open_shard()
    fake_capture(settings, layout, streams).capture()
    age_checkpoints(s3, layout, hours=30)
    streams.shards["shard-0"].records = [stream_record(s, f"k{s}") for s in range(1, 6)]  # the shard's first record is 1
    assert fake_capture(settings, layout, streams).capture().records == 5


def test_a_shard_that_stays_empty_while_the_captures_run_is_no_gap(settings, layout):
    s3, streams = settings.client("s3"), empty_open_shard(starting_sequence=5)
    for _ in range(3):  # three captures twenty hours apart, sixty hours after the first empty read
        assert fake_capture(settings, layout, streams).capture().records == 0
        age_checkpoints(s3, layout, hours=20)
    streams.shards["shard-0"].records = [stream_record(7, "a")]
    assert fake_capture(settings, layout, streams).capture().records == 1


def test_a_bootstrap_scan_longer_than_the_streams_retention_reports_the_gap(settings, layout):
    streams = FakeStreams([FakeShard("shard-0", [stream_record(1, "a"), stream_record(2, "b")], closed=False)])
    capture = fake_capture(settings, layout, streams)
    positions = capture.present_end()  # before the scan
    # The scan takes more than a day: changes made during it (3, 4) are trimmed before the capture resumes.
    streams.shards["shard-0"].records += [stream_record(3, "a"), stream_record(4, "c"), stream_record(5, "d")]
    streams.trimmed_before["shard-0"] = 5
    capture.restart_from(positions)
    with pytest.raises(StreamGapError, match="shard-0: records after sequence 2 were trimmed.*bootstrap"):
        capture.capture(bounded=False)


def parent_read_child_not(settings, layout, child_starting_sequence: int | None = None) -> FakeStreams:
    """A parent read to its end by a capture whose record bound stopped before its child (behind a busy shard)."""
    parent = FakeShard("shard-a", [stream_record(s, f"k{s}") for s in range(1, 5)])
    child = FakeShard("shard-b", [stream_record(s, f"k{s}") for s in range(5, 9)], parent="shard-a", closed=False, starting_sequence=child_starting_sequence)
    streams = FakeStreams([parent, child])
    result = fake_capture(settings, layout, streams, max_records=4).capture()
    assert result.records == 4 and not result.caught_up
    assert [c.shard_id for c in CheckpointStore(settings.client("s3"), layout).load_all()] == ["shard-a"]
    return streams


def test_a_child_shard_trimmed_before_its_first_read_fails_loudly(settings, layout):
    """Its parent was read to its end 30 hours ago and the child never since: its first records (5, 6) were trimmed.
    TRIM_HORIZON starts at 7, and nothing else would tell."""
    s3 = settings.client("s3")
    streams = parent_read_child_not(settings, layout)
    age_checkpoints(s3, layout, hours=30)
    streams.trimmed_before["shard-b"] = 7
    with pytest.raises(StreamGapError, match=r"shard-b was not read since its parent shard-a was read to its end .*trimmed.*bootstrap"):
        fake_capture(settings, layout, streams).capture()
    assert captured_sequences(s3, layout) == ["1", "2", "3", "4"]  # 7 and 8 are not captured as if nothing was missing


def test_a_child_shard_read_late_with_its_first_record_still_there_or_soon_enough_is_no_gap(settings, layout):
    s3 = settings.client("s3")
    streams = parent_read_child_not(settings, layout)
    age_checkpoints(s3, layout, hours=30)
    assert fake_capture(settings, layout, streams).capture().records == 4  # its first record, 5, is still there
    # Within the stream's 24 hours nothing can be trimmed: a child numbered as AWS may (its range starting below its
    # first record) is read without a check.
    other = SourceLayout(settings.bucket, "reviews_source")  # a prefix of its own, one the runs may write
    streams = parent_read_child_not(settings, other, child_starting_sequence=3)
    age_checkpoints(s3, other, hours=20)
    assert fake_capture(settings, other, streams).capture().records == 4


def test_a_busy_shard_does_not_starve_the_others_behind_a_capture_bound(settings, layout):
    """Each capture stops at its record bound inside the busy shard, which keeps getting records: the next capture
    starts after it, so the quiet shard is read now, not once the busy one is drained (which may be never)."""
    busy = FakeShard("shard-a", [stream_record(s, f"a{s}") for s in range(1, 11)], closed=False)
    quiet = FakeShard("shard-b", [stream_record(s, f"b{s}") for s in (100, 101)], closed=False)
    streams = FakeStreams([busy, quiet])
    capture = fake_capture(settings, layout, streams, max_records=4)
    first = capture.capture()
    assert not first.caught_up and captured_sequences(settings.client("s3"), layout) == ["1", "2", "3", "4"]
    busy.records += [stream_record(s, f"a{s}") for s in range(11, 21)]
    capture.capture()
    assert {"100", "101"} <= set(captured_sequences(settings.client("s3"), layout))
