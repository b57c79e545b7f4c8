"""The local AWS: a moto server on 127.0.0.1, and the demo tables and bucket (also used by `init` on AWS)."""

import time
import urllib.request

from ddb_athena.lib.declarations import TableDeclaration, declared_tables
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


def create_dynamodb_table(dynamodb, name: str, table: TableDeclaration) -> None:
    """A DynamoDB table with the declared key (and a stream of new and old images, if streamed)."""
    roles = zip(table.spec.key_columns, ("HASH", "RANGE"), strict=False)
    keys = [(column.attribute, role, column.type_tag) for column, role in roles]
    stream = {"StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}} if table.kind == "streamed" else {}
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": attribute, "KeyType": role} for attribute, role, _ in keys],
        AttributeDefinitions=[{"AttributeName": attribute, "AttributeType": tag} for attribute, _, tag in keys],
        BillingMode="PAY_PER_REQUEST",
        **stream,
    )


def table_exists(dynamodb, name: str) -> bool:
    try:
        dynamodb.describe_table(TableName=name)
        return True
    except dynamodb.exceptions.ResourceNotFoundException:
        return False


def create_demo_resources(settings: Settings) -> list[str]:
    """Creates, if missing, every declared table (ddb_athena/tables.toml: its key, point-in-time recovery, a stream for a
    streamed one) and the bucket. Returns what it did."""
    dynamodb, s3 = settings.client("dynamodb"), settings.client("s3")
    done = []
    for table in declared_tables().values():
        name = settings.dynamodb_tables.get(table.name, table.dynamodb_table)
        if not table_exists(dynamodb, name):
            create_dynamodb_table(dynamodb, name, table)
            done.append(f"created table {name}" + (" (stream NEW_AND_OLD_IMAGES)" if table.kind == "streamed" else ""))
        # Every source table can be restored (an exported one's exports need it besides), as the runbook has it.
        dynamodb.get_waiter("table_exists").wait(TableName=name)
        dynamodb.update_continuous_backups(TableName=name, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True})
    existing = {bucket["Name"] for bucket in s3.list_buckets().get("Buckets", [])}
    if settings.bucket not in existing:
        if settings.region == "us-east-1":
            s3.create_bucket(Bucket=settings.bucket)
        else:
            s3.create_bucket(Bucket=settings.bucket, CreateBucketConfiguration={"LocationConstraint": settings.region})
        done.append(f"created bucket {settings.bucket}")
    return done
