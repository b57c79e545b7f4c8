import json

from ddb_athena.capture.bootstrap import bootstrap_snapshot, pending_snapshot
from ddb_athena.capture.change_files import ChangeFileNamer, SourceLayout, list_change_files


def test_a_bootstrap_snapshot_holds_every_item_and_is_found_until_merged(settings):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    layout = SourceLayout(settings.bucket, "books_source")
    items = [{"id": {"S": f"b{index:04d}"}, "blob": {"B": b"\x00" * 300}} for index in range(1500)]  # several scan pages
    for item in items:
        dynamodb.put_item(TableName=settings.books_table, Item=item)
    assert pending_snapshot(s3, layout) is None

    result = bootstrap_snapshot(dynamodb, s3, settings.books_table, "id", layout, ChangeFileNamer())
    assert result.items == 1500
    assert list_change_files(s3, layout) == [result.change_file] and pending_snapshot(s3, layout) == result.change_file
    records = [json.loads(line) for line in s3.get_object(Bucket=settings.bucket, Key=result.change_file)["Body"].read().splitlines()]
    assert {r["keys"]["id"]["S"] for r in records} == {f"b{index:04d}" for index in range(1500)}
    assert {r["event_name"] for r in records} == {"SNAPSHOT"} and {r["sequence_number"] for r in records} == {"0"}
    assert records[0]["new_image"]["blob"] == {"B": "AAAA" * 100}
