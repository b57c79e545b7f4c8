"""Shared fixtures: one moto server and one SparkSession for the whole run, fresh AWS state per test."""

import logging
import os
import socket
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from ddb_athena.local_stack import create_demo_resources, start_moto_server
from ddb_athena.settings import Settings
from ddb_athena_tests import aws_calls

# Before any client exists: every AWS call of the suite is recorded for the IAM coverage test.
aws_calls.install()
IAM_COVERAGE_TEST = "test_iam_coverage.py"


def pytest_configure(config):
    # A deployment started four days ago: a backfill "from the start date" stays a few runs long whatever the
    # date. Set before any test module imports the assets, whose partitions are read at import.
    start = (datetime.now(timezone.utc) - timedelta(days=4)).date().isoformat()
    os.environ.setdefault("DDB_ATHENA_ORDERS_START_DATE", start)


def pytest_collection_modifyitems(items):
    # The IAM coverage test checks the calls of every test before it: it runs last.
    items.sort(key=lambda item: item.path.name == IAM_COVERAGE_TEST)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = start_moto_server(port)
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def warehouse(tmp_path_factory) -> str:
    return (tmp_path_factory.mktemp("warehouse")).as_uri()


@pytest.fixture
def aws_env(moto_endpoint, warehouse, monkeypatch):
    """A clean emulator and an environment that points everything at it (unique Iceberg namespace)."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).read()
    for name, value in {
        "DDB_ATHENA_PROFILE": "local",
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "DDB_ATHENA_BUCKET": "test-bucket",
        "DDB_ATHENA_WAREHOUSE": warehouse,
        "DDB_ATHENA_NAMESPACE": f"t_{uuid.uuid4().hex[:10]}",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "DDB_ATHENA_SPARK_PACKAGES", "DDB_ATHENA_BOOKS_TABLE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def settings(aws_env) -> Settings:
    """Settings with the demo tables and bucket created."""
    settings = Settings.from_env()
    create_demo_resources(settings)
    return settings


@pytest.fixture(scope="session")
def spark(moto_endpoint, warehouse):
    """The SparkSession, built by the same resource the Dagster runs use."""
    from ddb_athena.resources import IcebergSparkResource

    resource = IcebergSparkResource(
        profile="local",
        warehouse=warehouse,
        s3_endpoint_url=moto_endpoint,
        access_key_id="testing",
        secret_access_key="testing",
        extra_config={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    session = resource.spark_session
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
