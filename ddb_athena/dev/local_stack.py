"""The local AWS: a moto server on 127.0.0.1, and the demo tables and bucket (also used by `init` on AWS)."""

import time
import urllib.request

from ddb_athena.lib.settings import Settings


def start_moto_server(port: int):
    """Starts moto in server mode in a background thread; returns the server (call .stop())."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    wait_for_endpoint(f"http://127.0.0.1:{port}")
    return server


def wait_for_endpoint(url: str, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no AWS emulator answered at {url} within {timeout_seconds:.0f} s") from None
            time.sleep(0.2)


def _table_exists(dynamodb, name: str) -> bool:
    try:
        dynamodb.describe_table(TableName=name)
        return True
    except dynamodb.exceptions.ResourceNotFoundException:
        return False


def create_demo_resources(settings: Settings) -> list[str]:
    """Creates, if missing, the books and orders tables and the bucket. Returns what it did."""
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    done = []
    if not _table_exists(dynamodb, settings.books_table):
        dynamodb.create_table(
            TableName=settings.books_table,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        )
        done.append(f"created table {settings.books_table} (stream NEW_AND_OLD_IMAGES)")
    if not _table_exists(dynamodb, settings.orders_table):
        dynamodb.create_table(
            TableName=settings.orders_table,
            KeySchema=[{"AttributeName": "order_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "order_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        done.append(f"created table {settings.orders_table}")
    dynamodb.get_waiter("table_exists").wait(TableName=settings.orders_table)
    dynamodb.update_continuous_backups(TableName=settings.orders_table, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True})
    existing = {bucket["Name"] for bucket in s3.list_buckets().get("Buckets", [])}
    if settings.bucket not in existing:
        if settings.region == "us-east-1":
            s3.create_bucket(Bucket=settings.bucket)
        else:
            s3.create_bucket(Bucket=settings.bucket, CreateBucketConfiguration={"LocationConstraint": settings.region})
        done.append(f"created bucket {settings.bucket}")
    return done
