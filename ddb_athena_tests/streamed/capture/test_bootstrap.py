import json

import pytest
from botocore.exceptions import ClientError

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.bootstrap import bootstrap_snapshot, delete_unsealed_parts, pending_snapshot, with_snapshot_parts
from ddb_athena.streamed.capture.change_files import ChangeFileNamer, list_change_files, list_keys


def put_items(settings, count: int) -> None:
    dynamodb = settings.client("dynamodb")
    for index in range(count):
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"b{index:04d}"}, "blob": {"B": b"\x00" * 300}})


def test_a_bootstrap_snapshot_holds_every_item_in_bounded_parts_and_is_found_until_merged(settings):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    layout = SourceLayout(settings.bucket, "books_source")
    put_items(settings, 1500)  # several scan pages
    assert pending_snapshot(s3, layout) is None

    result = bootstrap_snapshot(dynamodb, s3, settings.dynamodb_tables["books"], ("id",), layout, ChangeFileNamer(), part_bytes=100_000)
    assert result.items == 1500
    # The seal is the only change file; the merge reads it with its parts.
    assert list_change_files(s3, layout) == [result.change_file] and pending_snapshot(s3, layout) == result.change_file
    assert with_snapshot_parts(s3, layout, [result.change_file]) == [result.change_file, *result.parts]
    sizes = [s3.head_object(Bucket=settings.bucket, Key=key)["ContentLength"] for key in result.parts]
    assert len(sizes) >= 5 and max(sizes) < 100_000 + 1_000  # a part ends at the first record past the bound
    records = [json.loads(line) for key in result.parts for line in s3.get_object(Bucket=settings.bucket, Key=key)["Body"].read().splitlines()]
    assert {r["keys"]["id"]["S"] for r in records} == {f"b{index:04d}" for index in range(1500)} and len(records) == 1500
    assert {r["event_name"] for r in records} == {"SNAPSHOT"} and {r["sequence_number"] for r in records} == {"0"}
    assert records[0]["new_image"]["blob"] == {"B": "AAAA" * 100}


class FailingScan:
    """A DynamoDB client whose scan is throttled after `pages` pages."""

    def __init__(self, dynamodb, pages: int):
        self._dynamodb, self._pages = dynamodb, pages

    def get_paginator(self, operation):
        paginator, pages = self._dynamodb.get_paginator(operation), self._pages

        class Throttled:
            def paginate(self, **kwargs):
                for number, page in enumerate(paginator.paginate(**kwargs, PaginationConfig={"PageSize": 100})):
                    if number == pages:
                        raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "throttled"}}, "Scan")
                    yield page

        return Throttled()


def test_a_scan_that_fails_leaves_no_snapshot_and_its_parts_are_deleted_by_the_next_bootstrap(settings):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    layout = SourceLayout(settings.bucket, "books_source")
    put_items(settings, 500)
    with pytest.raises(ClientError, match="throttled"):
        bootstrap_snapshot(FailingScan(dynamodb, pages=3), s3, settings.dynamodb_tables["books"], ("id",), layout, ChangeFileNamer(), part_bytes=20_000)
    assert list(list_keys(s3, settings.bucket, layout.snapshots_prefix))  # parts were written as the scan went
    assert list_change_files(s3, layout) == [] and pending_snapshot(s3, layout) is None  # but nothing a merge reads

    sealed = bootstrap_snapshot(dynamodb, s3, settings.dynamodb_tables["books"], ("id",), layout, ChangeFileNamer(), part_bytes=20_000)
    assert delete_unsealed_parts(s3, layout) > 0
    assert sorted(obj["Key"] for obj in list_keys(s3, settings.bucket, layout.snapshots_prefix)) == sealed.parts  # a sealed one's stay


def test_an_empty_table_has_a_snapshot_too(settings):
    s3 = settings.client("s3")
    layout = SourceLayout(settings.bucket, "books_source")
    result = bootstrap_snapshot(settings.client("dynamodb"), s3, settings.dynamodb_tables["books"], ("id",), layout, ChangeFileNamer())
    assert result.items == 0 and len(result.parts) == 1 and pending_snapshot(s3, layout) == result.change_file
