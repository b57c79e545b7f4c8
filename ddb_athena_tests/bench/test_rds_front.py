"""The RDS-like front the deployment's instance tests log in through checks IAM tokens as RDS does: botocore's token
for the user and endpoint passes within its 15 minutes, anything else is refused with its reason."""

import datetime

import boto3
import pytest

from ddb_athena_bench.rds_front import token_problem

CREDENTIALS = {"testing": "testing"}


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return boto3.client("rds", region_name="us-east-1").generate_db_auth_token("127.0.0.1", 5432, "dagster_app")


def test_a_token_passes_for_its_user_and_endpoint_within_its_fifteen_minutes(token):
    now = datetime.datetime.now(datetime.UTC)
    assert token_problem(token, "dagster_app", "127.0.0.1:5432", CREDENTIALS, now) is None
    assert token_problem(token, "dagster_app", "127.0.0.1:5432", CREDENTIALS, now + datetime.timedelta(minutes=14)) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"user": "dagster"}, "not a token for this user"),
        ({"endpoint": "127.0.0.1:5433"}, "not a token for this endpoint"),
        ({"credentials": {"testing": "another secret"}}, "signature does not match"),
        ({"credentials": {"another-key": "testing"}}, "not signed by a known identity for rds-db"),
        ({"minutes_later": 16}, "expired"),
        ({"tampered": True}, "signature does not match"),
    ],
)
def test_anything_else_is_refused_with_its_reason(token, change, reason):
    now = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=change.get("minutes_later", 0))
    presented = token.replace("DBUser=dagster_app", "DBUser=dagster_ap%70") if change.get("tampered") else token
    arguments = (change.get("user", "dagster_app"), change.get("endpoint", "127.0.0.1:5432"), change.get("credentials", CREDENTIALS), now)
    assert token_problem(presented, *arguments) == reason
