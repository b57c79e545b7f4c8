"""A fake DynamoDB Streams API for what moto cannot show: many shards, splits, expiry, trimming."""

from datetime import UTC, datetime

from botocore.exceptions import ClientError

STREAM_ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/books/stream/2026-11-22T00:00:00.000"


def client_error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"fake {code}"}}, operation)


def stream_record(sequence: int, book_id: str, event: str = "MODIFY", name: str = "n", created: datetime = datetime(2026, 11, 22, tzinfo=UTC)) -> dict:
    change = {
        "Keys": {"id": {"S": book_id}},
        "SequenceNumber": str(sequence),
        "ApproximateCreationDateTime": created,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    if event != "REMOVE":
        change["NewImage"] = {"id": {"S": book_id}, "name": {"S": name}, "cover": {"B": b"\x00\x01"}}
    return {"eventName": event, "dynamodb": change}


class FakeShard:
    def __init__(self, shard_id: str, records: list[dict], parent: str | None = None, closed: bool = True, starting_sequence: int | None = None):
        self.shard_id, self.records, self.parent, self.closed = shard_id, records, parent, closed
        # DescribeStream's StartingSequenceNumber; by default the first record's (moto's numbering). AWS documents it
        # only as the first sequence number of the shard's range, which may lie below its first record's.
        self.starting_sequence = starting_sequence


class FakeStreams:
    """Iterators are `shard|position`; behaviour switches let a test inject AWS's failure modes."""

    def __init__(self, shards: list[FakeShard], page_size: int = 2, empty_page_before_each: bool = False):
        self.shards = {shard.shard_id: shard for shard in shards}
        self.page_size = page_size
        # As AWS may: an empty page mid-shard (a portion of the shard without records), its next iterator further on.
        self.empty_page_before_each = empty_page_before_each
        self.expire_next_get_records = 0
        self.trimmed_before: dict[str, int] = {}  # shard -> first retained sequence
        self.calls: list[str] = []

    def describe_stream(self, StreamArn, ExclusiveStartShardId=None):
        ids = sorted(self.shards)
        if ExclusiveStartShardId:
            ids = [shard_id for shard_id in ids if shard_id > ExclusiveStartShardId]
        page, rest = ids[:2], ids[2:]  # two shards per page, to exercise pagination
        shards = []
        for shard_id in page:
            shard = self.shards[shard_id]
            first_record = shard.records[0]["dynamodb"]["SequenceNumber"] if shard.records else "1"
            sequence_range = {"StartingSequenceNumber": str(shard.starting_sequence) if shard.starting_sequence is not None else first_record}
            if shard.closed:
                sequence_range["EndingSequenceNumber"] = shard.records[-1]["dynamodb"]["SequenceNumber"] if shard.records else "1"
            shards.append({"ShardId": shard_id, "SequenceNumberRange": sequence_range, **({"ParentShardId": shard.parent} if shard.parent else {})})
        description = {"StreamArn": StreamArn, "Shards": shards}
        if rest:
            description["LastEvaluatedShardId"] = page[-1]
        return {"StreamDescription": description}

    def _position_after(self, shard: FakeShard, sequence: str) -> int:
        for index, record in enumerate(shard.records):
            if int(record["dynamodb"]["SequenceNumber"]) > int(sequence):
                return index
        return len(shard.records)

    def get_shard_iterator(self, StreamArn, ShardId, ShardIteratorType, SequenceNumber=None):
        shard = self.shards[ShardId]
        first_retained = self.trimmed_before.get(ShardId)
        if ShardIteratorType == "TRIM_HORIZON":
            position = 0 if first_retained is None else self._position_after(shard, str(first_retained - 1))
        elif ShardIteratorType == "AT_SEQUENCE_NUMBER":
            if first_retained is not None and int(SequenceNumber) < first_retained:
                raise client_error("TrimmedDataAccessException", "GetShardIterator")
            position = self._position_after(shard, str(int(SequenceNumber) - 1))
        else:
            if first_retained is not None and int(SequenceNumber) + 1 < first_retained:
                raise client_error("TrimmedDataAccessException", "GetShardIterator")
            position = self._position_after(shard, SequenceNumber)
        return {"ShardIterator": f"{ShardId}|{position}"}

    def get_records(self, ShardIterator, Limit):
        if self.expire_next_get_records:
            self.expire_next_get_records -= 1
            raise client_error("ExpiredIteratorException", "GetRecords")
        shard_id, position = ShardIterator.split("|")
        self.calls.append(shard_id)
        if self.empty_page_before_each and not position.endswith("~"):
            return {"Records": [], "NextShardIterator": f"{shard_id}|{position}~"}
        shard, position = self.shards[shard_id], int(position.rstrip("~"))
        page = shard.records[position : position + min(Limit, self.page_size)]
        end = position + len(page)
        response = {"Records": page}
        if end < len(shard.records) or not shard.closed:
            response["NextShardIterator"] = f"{shard_id}|{end}"
        return response


class FakeDynamoDB:
    def __init__(self, stream_arn: str = STREAM_ARN):
        self.stream_arn = stream_arn

    def describe_table(self, TableName):
        return {"Table": {"TableName": TableName, "StreamSpecification": {"StreamEnabled": True}, "LatestStreamArn": self.stream_arn}}
