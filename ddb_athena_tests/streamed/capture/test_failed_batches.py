"""Batches the capture Lambda gave up on: counted, and captured again from the stream while it holds them."""

import json

from dagster import DagsterInstance

from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files
from ddb_athena.streamed.capture.failed_batches import (
    MAX_PAGES_PER_RANGE,
    forget_covered,
    keep_failed_batches,
    kept_failed_batches,
    replay,
)
from ddb_athena.streamed.capture.stream_reader import latest_stream_arn, list_shards
from ddb_athena_tests.books_and_orders import books_capture_failures
from ddb_athena_tests.dagster_helpers import check_results, local_resources, sync_books
from ddb_athena_tests.streamed.capture.fakes import STREAM_ARN, FakeShard, FakeStreams, stream_record


def on_failure_message(stream_arn: str, shard_id: str, first: str, last: str, size: int) -> str:
    """What a DynamoDB stream event source mapping sends to its on-failure destination (AWS's documented format)."""
    return json.dumps(
        {
            "requestContext": {
                "requestId": "r",
                "functionArn": "arn:aws:lambda:us-east-1:123456789012:function:capture",
                "condition": "RetryAttemptsExhausted",
                "approximateInvokeCount": 6,
            },
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "version": "1.0",
            "timestamp": "2026-11-25T10:00:00.000Z",
            "DDBStreamBatchInfo": {"shardId": shard_id, "startSequenceNumber": first, "endSequenceNumber": last, "batchSize": size, "streamArn": stream_arn},
        }
    )


def failure_queue_depth(sqs, queue_url: str) -> int:
    """Messages in the queue, visible or being handled."""
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    return sum(int(value) for value in attributes["Attributes"].values())


def queue(settings) -> str:
    return settings.client("sqs").create_queue(QueueName="capture-failures")["QueueUrl"]


def test_a_failed_range_is_captured_again_and_one_the_stream_no_longer_holds_is_kept(settings):
    sqs, s3 = settings.client("sqs"), settings.client("s3")
    layout, url = SourceLayout(settings.bucket, "books_source"), queue(settings)
    streams = FakeStreams([FakeShard("shard-0", [stream_record(s, f"k{s}") for s in range(1, 9)], closed=False)], empty_page_before_each=True)
    streams.trimmed_before["shard-old"] = 50
    streams.shards["shard-old"] = FakeShard("shard-old", [stream_record(60, "z")])
    sqs.send_message(QueueUrl=url, MessageBody=on_failure_message(STREAM_ARN, "shard-0", "3", "5", 3))
    sqs.send_message(QueueUrl=url, MessageBody=on_failure_message(STREAM_ARN, "shard-old", "10", "12", 3))
    assert failure_queue_depth(sqs, url) == 2

    assert keep_failed_batches(sqs, s3, url, lambda arn: layout) == 2
    assert failure_queue_depth(sqs, url) == 0 and len(kept_failed_batches(s3, layout)) == 2
    result = replay(streams, s3, [layout], log=lambda line: None)
    assert result.records == 3 and len(result.replayed) == 1 and list_change_files(s3, layout) == result.replayed
    body = s3.get_object(Bucket=settings.bucket, Key=result.replayed[0])["Body"].read().decode()
    assert [json.loads(line)["sequence_number"] for line in body.splitlines()] == ["3", "4", "5"]
    assert [batch.shard_id for batch in result.not_replayable] == ["shard-old"]
    # Kept: the check stays red until a bootstrap's published snapshot covers it.
    assert [batch.shard_id for batch in kept_failed_batches(s3, layout).values()] == ["shard-old"]
    assert forget_covered(s3, layout, "11") == 0  # a scan that began before the batch's end does not cover it
    assert forget_covered(s3, layout, "12") == 1 and kept_failed_batches(s3, layout) == {}


class SlowToRecordsStreams(FakeStreams):
    """As AWS may: several empty pages before each page of records (each with its next iterator further on)."""

    def __init__(self, shards, empty_pages_before_each: int):
        super().__init__(shards)
        self.empty_pages_before_each = empty_pages_before_each

    def get_records(self, ShardIterator, Limit):
        shard_id, position = ShardIterator.split("|")
        waited = position.count("~")
        if waited < self.empty_pages_before_each:
            self.calls.append(shard_id)
            return {"Records": [], "NextShardIterator": f"{ShardIterator}~"}
        return super().get_records(ShardIterator=ShardIterator.rstrip("~"), Limit=Limit)


def replay_one(settings, streams, shard_id: str, first: str, last: str):
    sqs, s3 = settings.client("sqs"), settings.client("s3")
    layout, url = SourceLayout(settings.bucket, "books_source"), queue(settings)
    sqs.send_message(QueueUrl=url, MessageBody=on_failure_message(STREAM_ARN, shard_id, first, last, 3))
    lines = []
    keep_failed_batches(sqs, s3, url, lambda arn: layout)
    result = replay(streams, s3, [layout], log=lines.append)
    return result, len(kept_failed_batches(s3, layout)), list_change_files(s3, layout), lines


def test_a_range_behind_several_empty_pages_is_read_to_its_end_and_its_batch_deleted(settings):
    records = [stream_record(s, f"k{s}") for s in range(1, 9)]
    streams = SlowToRecordsStreams([FakeShard("shard-0", records, closed=False)], empty_pages_before_each=4)
    result, depth, files, _ = replay_one(settings, streams, "shard-0", "3", "6")
    assert depth == 0 and result.records == 4 and files == result.replayed and len(files) == 1


def test_a_range_whose_end_is_never_reached_is_kept(settings):
    streams = FakeStreams([FakeShard("shard-0", [stream_record(s, f"k{s}") for s in range(1, 6)], closed=False)])
    result, depth, files, lines = replay_one(settings, streams, "shard-0", "3", "9")  # 6-9 never show up
    assert depth == 1 and files == [] and result.records == 0
    assert [batch.last_sequence for batch in result.unfinished] == ["9"] and not result.not_replayable
    assert "shard-0 3..9" in lines[0] and "not read to its end" in lines[0]
    assert len(streams.calls) <= MAX_PAGES_PER_RANGE  # a bounded number of GetRecords calls per range


def test_a_closed_shard_that_ends_before_the_range_does_is_kept(settings):
    streams = FakeStreams([FakeShard("shard-0", [stream_record(s, f"k{s}") for s in range(1, 6)])])
    result, depth, files, _ = replay_one(settings, streams, "shard-0", "3", "9")
    assert depth == 1 and files == [] and [batch.first_sequence for batch in result.unfinished] == ["3"]


class IteratorFromTrimHorizonStreams(FakeStreams):
    """A stream that, asked for a trimmed sequence number, starts at its oldest record instead of refusing."""

    def get_shard_iterator(self, StreamArn, ShardId, ShardIteratorType, SequenceNumber=None):
        if ShardIteratorType == "AT_SEQUENCE_NUMBER" and int(SequenceNumber) < self.trimmed_before.get(ShardId, 0):
            ShardIteratorType, SequenceNumber = "TRIM_HORIZON", None
        return super().get_shard_iterator(StreamArn, ShardId, ShardIteratorType, SequenceNumber)


def test_a_range_whose_start_was_trimmed_is_kept(settings):
    streams = IteratorFromTrimHorizonStreams([FakeShard("shard-0", [stream_record(s, f"k{s}") for s in range(1, 9)], closed=False)])
    streams.trimmed_before["shard-0"] = 5  # 3 and 4 are gone, 5 and 6 are still there
    result, depth, files, lines = replay_one(settings, streams, "shard-0", "3", "6")
    assert depth == 1 and files == [] and [batch.shard_id for batch in result.not_replayable] == ["shard-0"]
    assert "bootstrap" in lines[0]


def test_the_check_is_red_while_a_batch_waits_and_the_replayed_changes_reach_the_table(spark, settings):
    dynamodb, sqs = settings.client("dynamodb"), settings.client("sqs")
    url = queue(settings)
    with DagsterInstance.ephemeral() as instance:
        sync_books(instance)  # the bootstrap of an empty table (the Lambda then writes every change file)
        for index in range(3):
            dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"lost-{index}"}, "name": {"S": "n"}})
        # The Lambda failed on the whole batch of these three: nothing reached the change prefix.
        stream_arn = latest_stream_arn(dynamodb, settings.dynamodb_tables["books"])
        streams = settings.client("dynamodbstreams")
        (shard,) = list_shards(streams, stream_arn)
        iterator = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        sequences = [record["dynamodb"]["SequenceNumber"] for record in streams.get_records(ShardIterator=iterator)["Records"]]
        sqs.send_message(QueueUrl=url, MessageBody=on_failure_message(stream_arn, shard["ShardId"], sequences[0], sequences[-1], 3))

        options = {"books_capture": "lambda", "capture_failure_queue_urls": {"books": url}}
        red = check_results(sync_books(instance, **options))["books_capture_failures"]
        assert not red.passed and red.metadata["failed_batches"].value == 1

        resources = local_resources(**options)
        result = replay(streams, settings.client("s3"), [resources["sync"].layout_of(declared("books"))], log=lambda line: None)
        assert result.records == 3 and not result.not_replayable
        green = check_results(sync_books(instance, **options))["books_capture_failures"]
        assert green.passed and books_capture_failures(aws=resources["aws"], sync=resources["sync"]).passed
    assert sorted(row["id"] for row in spark.table(f"{settings.namespace}.books").collect()) == ["lost-0", "lost-1", "lost-2"]


def test_a_batch_one_table_lost_turns_only_that_tables_check_red(settings):
    """Each streamed table has its own failure queue (the stack renders one a table): a batch of books given up on
    leaves reviews' capture_failures green."""
    from ddb_athena.streamed.check_results import capture_failures_result

    sqs = settings.client("sqs")
    urls = {name: sqs.create_queue(QueueName=f"{name}-capture-failures")["QueueUrl"] for name in ("books", "reviews")}
    arn = f"arn:aws:dynamodb:us-east-1:123456789012:table/{settings.dynamodb_tables['books']}/stream/2026-01-01T00:00:00.000"
    sqs.send_message(QueueUrl=urls["books"], MessageBody=on_failure_message(arn, "shardId-1", "100", "200", 2))
    resources = local_resources(books_capture="lambda", capture_failure_queue_urls=urls)
    books, reviews = (capture_failures_result(resources["aws"], resources["sync"], declared(name)) for name in ("books", "reviews"))
    assert not books.passed and books.metadata["failed_batches"].value == 1 and books.metadata["queue"].value == urls["books"]
    assert reviews.passed and reviews.metadata["failed_batches"].value == 0


def test_a_lambda_capture_without_its_failure_queue_is_red_and_the_runs_own_capture_needs_none(settings):
    """With the capture Lambda, batches it gives up on go to its table's queue: a check that cannot see that queue
    cannot say none was lost (the old check passed, saying the run read the stream)."""
    from ddb_athena.streamed.check_results import capture_failures_result

    lambda_capture, run_capture = local_resources(books_capture="lambda"), local_resources(books_capture="run")
    unseen = capture_failures_result(lambda_capture["aws"], lambda_capture["sync"], declared("books"))
    assert not unseen.passed and "no failure queue is set" in unseen.description
    own = capture_failures_result(run_capture["aws"], run_capture["sync"], declared("books"))
    assert own.passed and own.metadata["queue"].value == "none: the sync run reads the stream itself"


def test_a_batch_whose_message_the_queue_drops_after_14_days_keeps_the_check_red_until_a_bootstrap_covers_it(spark, settings):
    """The check moves the queue's messages to S3: a queue that then drops its messages (at 14 days; purged here, as
    an operator might) leaves the check red with the changes still missing, until a bootstrap's snapshot covers them."""
    from ddb_athena.streamed.check_results import capture_failures_result

    sqs, url = settings.client("sqs"), queue(settings)
    with DagsterInstance.ephemeral() as instance:
        sync_books(instance)
        settings.client("dynamodb").put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": "lost"}, "name": {"S": "n"}})
        stream_arn = latest_stream_arn(settings.client("dynamodb"), settings.dynamodb_tables["books"])
        streams = settings.client("dynamodbstreams")
        (shard,) = list_shards(streams, stream_arn)
        iterator = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        (sequence,) = [record["dynamodb"]["SequenceNumber"] for record in streams.get_records(ShardIterator=iterator)["Records"]]
        sqs.send_message(QueueUrl=url, MessageBody=on_failure_message(stream_arn, shard["ShardId"], sequence, sequence, 1))
        resources = local_resources(books_capture="lambda", capture_failure_queue_urls={"books": url})
        assert not capture_failures_result(resources["aws"], resources["sync"], declared("books")).passed
        sqs.purge_queue(QueueUrl=url)  # what the queue's retention does after 14 days
        still = capture_failures_result(resources["aws"], resources["sync"], declared("books"))
        assert not still.passed and still.metadata["failed_batches"].value == 1
        # A bootstrap scans DynamoDB after the lost change: once its snapshot is published, the check is green.
        sync_books(instance, config={"bootstrap": True}, books_capture="lambda", capture_failure_queue_urls={"books": url})
        assert capture_failures_result(resources["aws"], resources["sync"], declared("books")).passed
    assert [row["id"] for row in spark.table(f"{settings.namespace}.books").collect()] == ["lost"]
