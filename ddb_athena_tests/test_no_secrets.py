"""With credentials set, no secret reaches a log line, an event or materialization metadata, or a resource's
configuration (what the UI shows)."""

import logging

import pytest
from dagster import DagsterInstance

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena_tests.dagster_helpers import local_resources, sync_books
from ddb_athena_tests.exported.test_assets import put_orders, sync_orders

SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIADDBATHENATEST7Q",
    "AWS_SECRET_ACCESS_KEY": "never-log-me/8c1f4e2a9b7d6c5e3f1a0b9c8d7e6f5a",
    "AWS_SESSION_TOKEN": "never-log-me-token-5d4c3b2a19087f6e",
}


# The day first, before the emulator's state: see the fixture.
pytestmark = pytest.mark.usefixtures("days")


@pytest.fixture
def credentials_set(settings, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return settings


def leaked(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def test_no_secret_in_logs_events_metadata_or_resource_configuration(days, spark, credentials_set, caplog, capfd):
    # INFO, as deployed: botocore at DEBUG logs signed request headers (the key id, the session token) itself.
    caplog.set_level(logging.INFO)
    settings = credentials_set
    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert()
    put_orders(settings, 2, seed=11)
    with DagsterInstance.ephemeral() as instance:
        runs = [sync_books(instance), sync_orders(instance, days.yesterday)]
        assert all(run.success for run in runs)
        events = "\n".join(f"{entry.user_message} {entry.dagster_event!r}" for run in runs for entry in instance.all_logs(run.run_id))
    assert "rows_inserted" in events  # the events were read (metadata included)
    captured = capfd.readouterr()
    assert leaked(events) == [] and leaked(caplog.text) == [] and leaked(captured.out + captured.err) == []
    assert leaked(repr(local_resources())) == []
