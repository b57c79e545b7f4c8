"""Shared fixtures: one moto server and one SparkSession for the whole run, fresh AWS state per test; the tiers."""

import logging
import os
import socket
import subprocess
import time as clock
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ddb_athena.dev.local_stack import create_demo_resources, start_moto_server
from ddb_athena.lib.settings import Settings
from ddb_athena_tests import aws_calls

# Before any client exists: every AWS call of the suite is recorded for the IAM coverage test.
aws_calls.install()


def pytest_addoption(parser):
    parser.addoption(
        "--aws-calls-dir",
        help="each test process writes the AWS calls it recorded into this directory when it ends, and the IAM coverage "
        "tests read them from there: a run on several workers (-n) leaves those tests out, and `make test` runs them after it",
    )


def pytest_configure(config):
    # A deployment started four days ago: a backfill "from the start date" stays a few runs long whatever the
    # date. Set before any test module imports the assets, whose partitions are read at import.
    start = (datetime.now(UTC) - timedelta(days=4)).date().isoformat()
    os.environ.setdefault("DDB_ATHENA_ORDERS_START_DATE", start)


# The tiers (markers registered in setup.cfg): `make test-fast` leaves out every test with one of these, `make test`
# the soak and image tests only. A test that starts a process or uses the JVM without its marker fails (guarded below).
NEEDS_A_PROCESS = ("jvm", "subprocess", "stack", "soak", "image")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "spark" in item.fixturenames:
            item.add_marker(pytest.mark.jvm)

    # The stack tests first (on one worker, `xdist_group`), the rest around them; the IAM coverage tests check the
    # calls of every test before them: they run last, or, on several workers, each of which sees only its own
    # tests' calls, after the run (`--aws-calls-dir`).
    def checks_suite_calls(item) -> bool:
        return item.get_closest_marker(aws_calls.SUITE_CALLS_MARKER) is not None

    items.sort(key=lambda item: (checks_suite_calls(item), item.get_closest_marker("stack") is None))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        config.hook.pytest_deselected(items=[item for item in items if checks_suite_calls(item)])
        items[:] = [item for item in items if not checks_suite_calls(item)]


def pytest_collection_finish(session):
    """A worker under `--dist loadgroup` sends its tests to the scheduler by node ID, which pytest-xdist suffixes with the
    group (`...@stack`) as the items are modified; when a pytest release stops that taking effect, the grouped tests
    would be spread over the workers, each starting its own stack, without a word."""
    if not session.config.getoption("loadgroup", default=False):  # only a worker of `-n N --dist loadgroup` has it
        return
    ungrouped = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if ungrouped:
        raise pytest.UsageError(f"--dist loadgroup did not group {ungrouped[0]} (and {len(ungrouped) - 1} more): see pytest-dev/pytest-xdist#1386")


class UnmarkedProcess(AssertionError):
    """A test started a process or used the JVM without the marker that keeps it out of `make test-fast`."""


_running: list[pytest.Item] = []  # the test this process runs (its fixtures' setup included)
_unmarked: list[str] = []


def _allowed(needs: tuple[str, ...], what: str) -> None:
    item = _running[-1] if _running else None
    if item is not None and not any(item.get_closest_marker(marker) for marker in needs):
        _unmarked.append(f"{item.nodeid} {what}: mark it `{needs[0]}`, so that `make test-fast` leaves it out")
        raise UnmarkedProcess(_unmarked[-1])


_popen_init, _get_or_create = subprocess.Popen.__init__, SparkSession.Builder.getOrCreate


def _guarded_popen_init(self, args, *rest, **kwargs):
    _allowed(("subprocess", *NEEDS_A_PROCESS), f"starts a process ({args if isinstance(args, str) else ' '.join(map(str, args))[:120]})")
    _popen_init(self, args, *rest, **kwargs)


def _guarded_get_or_create(self):
    _allowed(("jvm",), "uses a SparkSession")
    return _get_or_create(self)


subprocess.Popen.__init__, SparkSession.Builder.getOrCreate = _guarded_popen_init, _guarded_get_or_create


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append(item)
    _unmarked.clear()
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    # Also when the code under test caught the guard's error.
    unmarked, _unmarked[:] = list(_unmarked), []
    if unmarked:
        raise UnmarkedProcess("; ".join(unmarked))
    return result


def pytest_sessionfinish(session):
    directory = session.config.getoption("--aws-calls-dir")
    if directory and aws_calls.recorded:
        aws_calls.save(Path(directory), os.environ.get("PYTEST_XDIST_WORKER", "main"))


# Longer than an orders test takes: one that began before midnight UTC and exported after it would deploy on one
# day and find its full export on the next.
DAY_TURN_MARGIN = timedelta(minutes=3)


@dataclass(frozen=True)
class Days:
    """The day a test deploys on (the emulator keeps real time, so it is today's date) and the nights after it."""

    today: date

    @property
    def midnight(self) -> datetime:
        return datetime.combine(self.today, time(), tzinfo=UTC)

    @property
    def yesterday(self) -> str:
        return (self.today - timedelta(days=1)).isoformat()

    @property
    def tomorrow(self) -> str:
        return (self.today + timedelta(days=1)).isoformat()

    def night(self, number: int) -> datetime:
        """When the daily schedule runs the day that has just ended, `number` nights after the deployment."""
        return self.midnight + timedelta(days=number, hours=2)


def away_from_midnight(margin: timedelta = DAY_TURN_MARGIN) -> Days:
    """Today, taken away from midnight UTC: closer to it than `margin`, it waits for the new day."""
    now = datetime.now(UTC)
    next_midnight = datetime.combine(now.date() + timedelta(days=1), time(), tzinfo=UTC)
    if next_midnight - now < margin:
        clock.sleep((next_midnight - now).total_seconds() + 1)
    return Days(datetime.now(UTC).date())


@pytest.fixture
def days() -> Days:
    """Taken when the test starts (not when its module is collected, minutes earlier), and away from midnight: a
    test close to it waits for the new day. Modules that use it list it in `pytestmark` so that it comes before the
    emulator's state (point-in-time recovery is turned on "today")."""
    return away_from_midnight()


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


def point_at_emulator(patch: pytest.MonkeyPatch, moto_endpoint: str, warehouse: str) -> None:
    """Everything pointed at a clean emulator (a unique Iceberg namespace)."""
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
        patch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "DDB_ATHENA_SPARK_PACKAGES", "DDB_ATHENA_BOOKS_TABLE"):
        patch.delenv(name, raising=False)


@pytest.fixture
def aws_env(moto_endpoint, warehouse, monkeypatch):
    """A clean emulator and an environment that points everything at it, for one test."""
    point_at_emulator(monkeypatch, moto_endpoint, warehouse)


@pytest.fixture
def settings(aws_env) -> Settings:
    """Settings with the demo tables and bucket created."""
    settings = Settings.from_env()
    create_demo_resources(settings)
    return settings


@pytest.fixture(scope="session")
def spark(moto_endpoint, warehouse):
    """The SparkSession, built by the same resource the Dagster runs use."""
    from ddb_athena.lib.resources import IcebergSparkResource

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
