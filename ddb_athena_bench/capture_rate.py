"""Where a stream capture's time goes, and how many records a second it can take (`make bench-capture`).

Two sources of the same ~1 KB changes, captured into change files on the emulator's S3 (the emulator in a process
of its own, so the capture process's CPU is the capture's alone):
- the emulator's DynamoDB stream (what `make dev` reads): wall time against the capture's own CPU tells how much of
  the time is waiting for the emulator;
- a stream served from memory, pages of 1,000 records as AWS serves them at most: the capture's own capacity, with
  a profile of its CPU by step (GetRecords, reading the records, encoding the change file, writing it to S3).
"""

import argparse
import cProfile
import pstats
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime

import boto3

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.stream_reader import StreamCapture

STREAM_ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/books/stream/2026-11-25T00:00:00.000"
# The functions that do the capture's steps (their cumulative time in the profile).
FUNCTIONS = {
    "capture": ("stream_reader.py", "capture"),
    "source": ("capture_rate.py", "get_records"),
    "read": ("change_files.py", "change_record"),
    "encode": ("change_files.py", "to_json"),
    "file": ("change_files.py", "write_change_file"),
    "save": ("checkpoints.py", "save"),
    "load": ("checkpoints.py", "load_all"),
}


def book_item(index: int) -> dict:
    return {
        "id": {"S": f"book-{index:08d}"},
        "name": {"S": f"Name {index}"},
        "author": {"S": "A. Author"},
        "summary": {"S": "x" * 900},
        "date": {"N": str(1_700_000_000_000_000_000 + index)},
    }


class MemoryStream:
    """A DynamoDB Streams client serving `records` MODIFY records of ~1 KB from one open shard, 1,000 a page."""

    def __init__(self, records: int):
        now = datetime.now(UTC)
        self.records = [
            {
                "eventName": "MODIFY",
                "dynamodb": {
                    "Keys": {"id": {"S": f"book-{index:08d}"}},
                    "NewImage": book_item(index),
                    "SequenceNumber": str(10**20 + index),
                    "ApproximateCreationDateTime": now,
                    "StreamViewType": "NEW_AND_OLD_IMAGES",
                },
            }
            for index in range(records)
        ]

    def describe_stream(self, StreamArn, ExclusiveStartShardId=None):
        return {"StreamDescription": {"Shards": [{"ShardId": "shard-0", "SequenceNumberRange": {"StartingSequenceNumber": str(10**20)}}]}}

    def get_shard_iterator(self, ShardIteratorType, SequenceNumber=None, **kwargs):
        # Sequence numbers are 10**20 + the record's index: AFTER_SEQUENCE_NUMBER resumes at the next index.
        return {"ShardIterator": "0" if ShardIteratorType == "TRIM_HORIZON" else str(int(SequenceNumber) - 10**20 + 1)}

    def get_records(self, ShardIterator, Limit):
        start = int(ShardIterator)
        return {"Records": self.records[start : start + Limit], "NextShardIterator": str(min(start + Limit, len(self.records)))}


class MemoryTable:
    def describe_table(self, TableName):
        return {"Table": {"StreamSpecification": {"StreamEnabled": True}, "LatestStreamArn": STREAM_ARN}}


def _emulator() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "ddb_athena.dev.cli", "local-stack", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    process.stdout.readline()  # its banner: listening
    return process, f"http://127.0.0.1:{port}"


def _client(service: str, endpoint: str):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")


def _timed(capture: StreamCapture) -> tuple[int, float, float]:
    wall, cpu = time.monotonic(), time.process_time()
    records = 0
    while True:
        result = capture.capture()
        records += result.records
        if not result.records:
            return records, time.monotonic() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()
    emulator, endpoint = _emulator()
    try:
        s3, dynamodb = _client("s3", endpoint), _client("dynamodb", endpoint)
        s3.create_bucket(Bucket="bench")
        dynamodb.create_table(
            TableName="books",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        )
        for start in range(0, args.records, 1000):
            batch = [{"PutRequest": {"Item": book_item(index)}} for index in range(start, min(args.records, start + 1000))]
            dynamodb.batch_write_item(RequestItems={"books": batch})  # the emulator takes more than AWS's 25
        emulated = StreamCapture(dynamodb, _client("dynamodbstreams", endpoint), s3, "books", SourceLayout("bench", "emulated"))
        records, wall, cpu = _timed(emulated)
        print("| source | records | wall s | records/s | capture CPU s | CPU ms a record |\n| --- | ---: | ---: | ---: | ---: | ---: |")
        print(f"| the emulator's stream | {records:,} | {wall:.1f} | {records / wall:,.0f} | {cpu:.1f} | {1000 * cpu / records:.2f} |")

        memory = StreamCapture(MemoryTable(), MemoryStream(args.records), s3, "books", SourceLayout("bench", "memory"))
        profile = cProfile.Profile()
        profile.enable()
        records, wall, cpu = _timed(memory)
        profile.disable()
        print(f"| a stream served from memory | {records:,} | {wall:.1f} | {records / wall:,.0f} | {cpu:.1f} | {1000 * cpu / records:.2f} |")
        stats = pstats.Stats(profile).stats
        spent = {
            step: sum(timing[3] for (path, _, name), timing in stats.items() if path.endswith(suffix) and name == function)
            for step, (suffix, function) in FUNCTIONS.items()
        }
        steps = {
            "GetRecords (served from memory)": spent["source"],
            "reading the records (change_record)": spent["read"],
            "encoding the change file (to_json)": spent["encode"],
            "writing the change file to S3": spent["file"] - spent["encode"],
            "checkpoints in S3 (read, write)": spent["save"] + spent["load"],
        }
        steps["the rest"] = spent["capture"] - sum(steps.values())
        print("\nWhere the capture's time goes (stream served from memory; profiled, so slower than above):\n")
        print("| step | s | share |\n| --- | ---: | ---: |")
        for step, seconds in steps.items():
            print(f"| {step} | {seconds:.2f} | {seconds / spent['capture']:.0%} |")
    finally:
        emulator.terminate()
        emulator.wait()


if __name__ == "__main__":
    main()
