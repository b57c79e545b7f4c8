"""Batches the capture Lambda gave up on: counted, and captured again from the stream while it holds them."""

import json

from dagster import DagsterInstance

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files
from ddb_athena.streamed.capture.failed_batches import failure_queue_depth, replay
from ddb_athena.streamed.capture.stream_reader import latest_stream_arn, list_shards
from ddb_athena.streamed.checks import books_capture_failures
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

    result = replay(sqs, streams, s3, url, layout, log=lambda line: None)
    assert result.records == 3 and len(result.replayed) == 1 and list_change_files(s3, layout) == result.replayed
    body = s3.get_object(Bucket=settings.bucket, Key=result.replayed[0])["Body"].read().decode()
    assert [json.loads(line)["sequence_number"] for line in body.splitlines()] == ["3", "4", "5"]
    assert [batch.shard_id for batch in result.not_replayable] == ["shard-old"]
    assert failure_queue_depth(sqs, url) == 1  # kept: the check stays red until a bootstrap (and the queue is purged)


def test_the_check_is_red_while_a_batch_waits_and_the_replayed_changes_reach_the_table(spark, settings):
    dynamodb, sqs = settings.client("dynamodb"), settings.client("sqs")
    url = queue(settings)
    with DagsterInstance.ephemeral() as instance:
        sync_books(instance)  # the bootstrap of an empty table (the Lambda then writes every change file)
        for index in range(3):
            dynamodb.put_item(TableName=settings.books_table, Item={"id": {"S": f"lost-{index}"}, "name": {"S": "n"}})
        # The Lambda failed on the whole batch of these three: nothing reached the change prefix.
        stream_arn = latest_stream_arn(dynamodb, settings.books_table)
        streams = settings.client("dynamodbstreams")
        (shard,) = list_shards(streams, stream_arn)
        iterator = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        sequences = [record["dynamodb"]["SequenceNumber"] for record in streams.get_records(ShardIterator=iterator)["Records"]]
        sqs.send_message(QueueUrl=url, MessageBody=on_failure_message(stream_arn, shard["ShardId"], sequences[0], sequences[-1], 3))

        options = {"books_capture": "lambda", "capture_failure_queue_url": url}
        red = check_results(sync_books(instance, **options))["books_capture_failures"]
        assert not red.passed and red.metadata["failed_batches"].value == 1

        resources = local_resources(**options)
        result = replay(sqs, streams, settings.client("s3"), url, resources["sync"].books_layout, log=lambda line: None)
        assert result.records == 3 and not result.not_replayable
        green = check_results(sync_books(instance, **options))["books_capture_failures"]
        assert green.passed and books_capture_failures(aws=resources["aws"], sync=resources["sync"]).passed
    assert sorted(row["id"] for row in spark.table(f"{settings.namespace}.books").collect()) == ["lost-0", "lost-1", "lost-2"]
