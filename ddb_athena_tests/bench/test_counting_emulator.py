"""The benchmarks' emulator counts what the deployment asks AWS for, by service, operation and files, so that the
volume benchmark's requests per commit are counted, not estimated."""

import subprocess
import sys
import time

import boto3
import pytest

from ddb_athena.dev.local_stack import wait_for_endpoint
from ddb_athena_bench.counting_emulator import FILE_COUNTS_PATH, PROBE_ACCESS_KEY
from ddb_athena_bench.freshness import request_counts
from ddb_athena_tests.conftest import _free_port

# Each test starts a process of its own (out of `make test-fast`).
pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def counting_endpoint():
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "ddb_athena_bench.counting_emulator", "--port", str(port)])
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for_endpoint(endpoint)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


def _client(service: str, endpoint: str, key: str = "testing"):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key, aws_secret_access_key="testing")


def test_requests_are_counted_by_service_operation_and_files_and_a_reset_starts_again(counting_endpoint):
    s3, dynamodb = _client("s3", counting_endpoint), _client("dynamodb", counting_endpoint)
    s3.create_bucket(Bucket="counted")
    request_counts(counting_endpoint, reset=True)
    for number in range(3):
        s3.put_object(Bucket="counted", Key=f"warehouse/library/books/metadata/v{number}.metadata.json", Body=b"{}")
    s3.put_object(Bucket="counted", Key="books_source/changes/one.json", Body=b"{}")
    s3.get_object(Bucket="counted", Key="books_source/changes/one.json")
    s3.head_object(Bucket="counted", Key="warehouse/library/books/metadata/v0.metadata.json")
    s3.list_objects_v2(Bucket="counted", Prefix="books_source/changes/")
    s3.copy_object(Bucket="counted", Key="books_source/two.json", CopySource="counted/books_source/changes/one.json")
    s3.delete_objects(Bucket="counted", Delete={"Objects": [{"Key": "books_source/two.json"}]})
    dynamodb.list_tables()
    _client("s3", counting_endpoint, key=PROBE_ACCESS_KEY).get_object(Bucket="counted", Key="books_source/changes/one.json")

    assert request_counts(counting_endpoint, reset=True) == {
        "s3 PutObject books/metadata": 3,
        "s3 PutObject books_source/changes/": 1,
        "s3 GetObject books_source/changes/": 1,
        "s3 HeadObject books/metadata": 1,
        "s3 ListObjects books_source/changes/": 1,
        "s3 CopyObject books_source/": 1,
        "s3 DeleteObjects (bucket)": 1,
        "dynamodb ListTables": 1,
        "probe GetObject books_source/changes/": 1,
    }
    time.sleep(0.1)


def test_what_only_hadoops_file_system_and_catalog_write_is_tagged(counting_endpoint):
    """A directory marker and the version hint: the bill keeps them apart, as a deployment (Glue, S3FileIO) makes neither."""
    s3 = _client("s3", counting_endpoint)
    s3.create_bucket(Bucket="tagged")
    request_counts(counting_endpoint, reset=True)
    s3.put_object(Bucket="tagged", Key="warehouse/library/books/data/", Body=b"")
    s3.put_object(Bucket="tagged", Key="warehouse/library/books/metadata/0f2c-version-hint.temp", Body=b"3")
    s3.put_object(Bucket="tagged", Key="warehouse/library/books/metadata/version-hint.text", Body=b"3")

    assert request_counts(counting_endpoint, reset=True) == {
        "s3 PutObject warehouse/library/ marker": 1,
        "s3 PutObject books/metadata version-hint": 2,
    }
    assert request_counts(counting_endpoint) == {}


def test_requests_on_a_tables_files_are_counted_by_kind_of_file(counting_endpoint):
    """What a commit writes, file by file (`make bench-requests`): the floor of a cycle's requests."""
    s3 = _client("s3", counting_endpoint)
    s3.create_bucket(Bucket="files")
    request_counts(counting_endpoint, reset=True, path=FILE_COUNTS_PATH)
    table = "warehouse/library/books"
    for key in (
        "data/00000-1-a-00001.parquet",
        "data/00000-1-a-00001-deletes.parquet",
        "metadata/7c1e-m0.avro",
        "metadata/7c1e-m1.avro",
        "metadata/snap-123-1-7c1e.avro",
        "metadata/7c1e.metadata.json",
        "metadata/0f2c-version-hint.temp",
    ):
        s3.put_object(Bucket="files", Key=f"{table}/{key}", Body=b"x")
    s3.get_object(Bucket="files", Key=f"{table}/metadata/snap-123-1-7c1e.avro")
    s3.put_object(Bucket="files", Key="books_source/changes/one.json", Body=b"{}")  # not a table's file
    _client("s3", counting_endpoint, key=PROBE_ACCESS_KEY).get_object(Bucket="files", Key=f"{table}/data/00000-1-a-00001.parquet")

    assert request_counts(counting_endpoint, reset=True, path=FILE_COUNTS_PATH) == {
        "PutObject books data": 1,
        "PutObject books position deletes": 1,
        "PutObject books manifest": 2,
        "PutObject books manifest list": 1,
        "PutObject books metadata": 1,
        "PutObject books version hint": 1,
        "GetObject books manifest list": 1,
    }
    assert request_counts(counting_endpoint, path=FILE_COUNTS_PATH) == {}
