"""A bootstrap scan with writes landing between its pages still converges to DynamoDB exactly."""

from ddb_athena.lake.change_merge import merge_change_files
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.bootstrap import bootstrap_snapshot, with_snapshot_parts
from ddb_athena.streamed.capture.change_files import ChangeFileNamer, list_change_files
from ddb_athena.streamed.capture.stream_reader import StreamCapture
from ddb_athena_tests.lake.test_differential import dynamodb_rows, iceberg_rows


class WritesBetweenScanPages:
    """A DynamoDB client whose scans return small pages and let `on_page` write between them."""

    def __init__(self, dynamodb, on_page):
        self._dynamodb, self._on_page = dynamodb, on_page

    def get_paginator(self, operation):
        paginator = self._dynamodb.get_paginator(operation)
        outer = self

        class SmallPages:
            def paginate(self, **kwargs):
                for number, page in enumerate(paginator.paginate(**kwargs, PaginationConfig={"PageSize": 4})):
                    yield page
                    outer._on_page(number)

        return SmallPages()

    def __getattr__(self, name):
        return getattr(self._dynamodb, name)


def put(dynamodb, book_id, name):
    dynamodb.put_item(TableName="books", Item={"id": {"S": book_id}, "name": {"S": name}})


def test_changes_made_during_the_scan_are_ordered_after_it(spark, settings):
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    layout = SourceLayout(settings.bucket, "books_source")
    for index in range(16):
        put(dynamodb, f"b{index:02d}", "original")

    def write_during_scan(page_number):
        if page_number == 0:
            # Items the scan has already returned, and items it has not reached yet.
            put(dynamodb, "b00", "updated-after-it-was-scanned")
            dynamodb.delete_item(TableName="books", Key={"id": {"S": "b01"}})
            dynamodb.delete_item(TableName="books", Key={"id": {"S": "b15"}})
            put(dynamodb, "b14", "updated-before-it-was-scanned")
            put(dynamodb, "new", "inserted-during-the-scan")

    namer = ChangeFileNamer()
    capture = StreamCapture(dynamodb, settings.client("dynamodbstreams"), s3, "books", layout, namer=namer)
    positions = capture.present_end()
    # Parts of about five items: a snapshot of several parts, as a big table's is.
    snapshot = bootstrap_snapshot(WritesBetweenScanPages(dynamodb, write_during_scan), s3, "books", ("id",), layout, namer, part_bytes=500)
    assert snapshot.items >= 14 and len(snapshot.parts) >= 3
    capture.restart_from(positions)
    capture.capture()  # the stream from where it ended before the scan: the changes made during it
    table = f"{settings.namespace}.books"
    files = with_snapshot_parts(s3, layout, list_change_files(s3, layout))
    merge_change_files(spark, declared("books").spec, table, [layout.uri(k, "s3a") for k in files], layout.uri(layout.quarantine_prefix, "s3a"))
    expected = dynamodb_rows(dynamodb, "books")
    assert expected["b00"]["name"] == "updated-after-it-was-scanned" and "b01" not in expected
    assert iceberg_rows(spark, table) == expected
