"""`ddb-athena replay-failures` against the emulator: what it moves from the on-failure queue, replays, keeps, and its exit code."""

from ddb_athena.dev.cli import main
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files
from ddb_athena.streamed.capture.failed_batches import kept_failed_batches
from ddb_athena.streamed.capture.stream_reader import latest_stream_arn, list_shards
from ddb_athena_tests.streamed.capture.test_failed_batches import failure_queue_depth, on_failure_message, queue


def written_sequences(settings, count: int) -> tuple[str, str, list[str]]:
    """Writes `count` books; their stream's ARN, its shard and their sequence numbers."""
    dynamodb, streams = settings.client("dynamodb"), settings.client("dynamodbstreams")
    for index in range(count):
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"b{index}"}, "name": {"S": "n"}})
    stream_arn = latest_stream_arn(dynamodb, settings.dynamodb_tables["books"])
    (shard,) = list_shards(streams, stream_arn)
    iterator = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    return stream_arn, shard["ShardId"], [record["dynamodb"]["SequenceNumber"] for record in streams.get_records(ShardIterator=iterator)["Records"]]


def test_a_range_read_to_its_end_is_replayed_and_its_message_deleted(settings, capsys):
    stream_arn, shard_id, sequences = written_sequences(settings, 3)
    sqs, url = settings.client("sqs"), queue(settings)
    sqs.send_message(QueueUrl=url, MessageBody=on_failure_message(stream_arn, shard_id, sequences[0], sequences[-1], 3))
    assert main(["replay-failures", "--queue-url", url]) == 0
    assert failure_queue_depth(sqs, url) == 0
    assert kept_failed_batches(settings.client("s3"), SourceLayout(settings.bucket, declared("books").source_prefix)) == {}
    assert len(list_change_files(settings.client("s3"), SourceLayout(settings.bucket, declared("books").source_prefix))) == 1
    assert capsys.readouterr().err == ""


def test_a_range_whose_end_is_never_reached_keeps_its_message_and_fails(settings, capsys):
    stream_arn, shard_id, sequences = written_sequences(settings, 3)
    sqs, url = settings.client("sqs"), queue(settings)
    beyond = str(int(sequences[-1]) + 10)  # a batch end the open shard never reaches
    sqs.send_message(QueueUrl=url, MessageBody=on_failure_message(stream_arn, shard_id, sequences[0], beyond, 13))
    assert main(["replay-failures", "--queue-url", url]) != 0
    assert failure_queue_depth(sqs, url) == 0  # moved to S3, where it stays for a later replay
    assert len(kept_failed_batches(settings.client("s3"), SourceLayout(settings.bucket, declared("books").source_prefix))) == 1
    assert list_change_files(settings.client("s3"), SourceLayout(settings.bucket, declared("books").source_prefix)) == []
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "kept" in error
