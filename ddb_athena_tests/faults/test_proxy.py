"""The fault proxy against a real moto server, with boto3: botocore's retries get through its throttles, 500s and lost
responses, and a request whose response was lost took effect once."""

import random

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from ddb_athena_faults.proxy import Fault, FaultPlan, FaultProxy, service_of


@pytest.fixture
def proxy(moto_endpoint, aws_env):
    with FaultProxy(moto_endpoint, FaultPlan(random.Random(7))) as proxy:
        yield proxy


def client(service: str, endpoint: str, attempts: int = 10):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", config=Config(retries={"max_attempts": attempts, "mode": "standard"}))


def books(dynamodb):
    dynamodb.create_table(
        TableName="books",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def test_requests_are_told_apart_by_service():
    assert service_of("/", "DynamoDB_20120810.PutItem") == "dynamodb"
    assert service_of("/", "DynamoDBStreams_20120810.GetRecords") == "dynamodb"
    assert service_of("/", "AWSGlue.GetTable") is None
    assert service_of("/bucket/key", "") == "s3"
    assert service_of("/moto-api/reset", "") is None


def test_without_a_fault_window_everything_passes_through(proxy):
    s3 = client("s3", proxy.endpoint)
    s3.create_bucket(Bucket="plain")
    s3.put_object(Bucket="plain", Key="a", Body=b"x" * 200_000)
    assert s3.get_object(Bucket="plain", Key="a")["Body"].read() == b"x" * 200_000
    assert s3.head_object(Bucket="plain", Key="a")["ContentLength"] == 200_000
    assert not proxy.plan.injected


@pytest.mark.parametrize("fault", [Fault.DYNAMODB_THROUGHPUT_EXCEEDED, Fault.DYNAMODB_THROTTLING, Fault.DYNAMODB_INTERNAL_ERROR])
def test_dynamodb_errors_are_retried_by_botocore(proxy, fault):
    dynamodb = client("dynamodb", proxy.endpoint)
    books(dynamodb)
    # Throttles are retried after a backoff of up to a few seconds each: few requests keep the test short.
    proxy.plan.open_window(fault, share=0.3, seconds=60)
    for number in range(5):
        dynamodb.put_item(TableName="books", Item={"id": {"S": f"book-{number}"}})
    assert dynamodb.scan(TableName="books")["Count"] == 5
    assert proxy.plan.injected[fault] > 0


def test_the_error_is_what_botocore_parses_when_retries_run_out(proxy):
    dynamodb = client("dynamodb", proxy.endpoint, attempts=1)
    s3 = client("s3", proxy.endpoint, attempts=1)
    proxy.plan.open_window(Fault.DYNAMODB_THROUGHPUT_EXCEEDED, share=1.0, seconds=60)
    proxy.plan.open_window(Fault.S3_SLOW_DOWN, share=1.0, seconds=60)
    with pytest.raises(dynamodb.exceptions.ProvisionedThroughputExceededException):
        dynamodb.list_tables()
    with pytest.raises(ClientError) as raised:
        s3.list_buckets()
    assert raised.value.response["Error"]["Code"] == "SlowDown" and raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503


@pytest.mark.parametrize("fault", [Fault.S3_SLOW_DOWN, Fault.S3_INTERNAL_ERROR])
def test_s3_errors_are_retried_by_botocore(proxy, fault):
    s3 = client("s3", proxy.endpoint)
    s3.create_bucket(Bucket="throttled")
    proxy.plan.open_window(fault, share=0.3, seconds=60)
    for number in range(5):
        s3.put_object(Bucket="throttled", Key=f"k{number}", Body=b"x")
    assert len(s3.list_objects_v2(Bucket="throttled")["Contents"]) == 5
    assert proxy.plan.injected[fault] > 0


def test_a_lost_put_item_response_is_retried_and_the_item_is_there_once(proxy, moto_endpoint):
    dynamodb = client("dynamodb", proxy.endpoint)
    books(dynamodb)
    proxy.plan.open_window(Fault.LOST_RESPONSE, share=1.0, seconds=0.5)
    dynamodb.put_item(TableName="books", Item={"id": {"S": "once"}, "version": {"N": "1"}})
    assert proxy.plan.injected[Fault.LOST_RESPONSE] >= 1
    items = client("dynamodb", moto_endpoint).scan(TableName="books")["Items"]
    assert items == [{"id": {"S": "once"}, "version": {"N": "1"}}]


def test_a_lost_s3_put_response_is_retried(proxy, moto_endpoint):
    s3 = client("s3", proxy.endpoint)
    s3.create_bucket(Bucket="lost")
    proxy.plan.open_window(Fault.LOST_RESPONSE, share=1.0, seconds=0.5)
    s3.put_object(Bucket="lost", Key="k", Body=b"payload")
    assert proxy.plan.injected[Fault.LOST_RESPONSE] >= 1
    assert client("s3", moto_endpoint).get_object(Bucket="lost", Key="k")["Body"].read() == b"payload"


def test_a_refused_endpoint_comes_back_on_the_same_port(proxy):
    s3 = client("s3", proxy.endpoint)
    port = proxy.port
    proxy.refuse(0.5)
    assert proxy.port == port and proxy.refusals == 1
    s3.create_bucket(Bucket="after-restart")
    assert "after-restart" in [bucket["Name"] for bucket in s3.list_buckets()["Buckets"]]
