"""ddb_athena/lib/database_role.py on a real PostgreSQL behind its RDS-like front: the setup task makes the instance's
own role, which then logs in with IAM tokens only, owns what the master user created before, and the task can run
again; what reaches SQL is checked first."""

import boto3
import psycopg2
import pytest

from ddb_athena.dev.cli import main
from ddb_athena.lib.database_role import ensure_database_role
from ddb_athena_bench.postgres_server import postgres_server

# Each test starts a process of its own (out of `make test-fast`).
pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def postgres():
    with postgres_server() as server:
        yield server


def _token(postgres) -> str:
    return boto3.client("rds", region_name="us-east-1").generate_db_auth_token(postgres.host, postgres.port, postgres.user)


def test_the_setup_task_hands_the_role_an_instance_the_master_user_made_and_runs_again_changing_nothing(postgres, aws_env, monkeypatch, capsys):
    with postgres.connect_as_master() as connection, connection.cursor() as cursor:
        cursor.execute("CREATE TABLE runs (id serial PRIMARY KEY, body text)")  # an instance created as the master user
    connection.close()
    for name, value in postgres.master_environment().items():
        monkeypatch.setenv(name, value)
    assert main(["database-role"]) == 0
    first = capsys.readouterr().out
    assert "handed over 1 tables, views and sequences" in first  # the table, its sequence with it
    with postgres.connect(postgres.user, _token(postgres)) as connection, connection.cursor() as cursor:
        cursor.execute("ALTER TABLE runs ADD COLUMN migrated boolean")  # a migration needs the owner
        cursor.execute("INSERT INTO runs (body) VALUES ('x') RETURNING id")
        cursor.execute("CREATE TABLE created_by_the_role (id int)")
    connection.close()
    assert main(["database-role"]) == 0
    again = capsys.readouterr().out
    assert again.rstrip().endswith("nothing to change")
    assert postgres.password not in first + again


def test_the_role_logs_in_with_a_token_for_it_never_with_a_password_or_in_plain_text(postgres, aws_env):
    refused_before = len(postgres.front.refused)
    with pytest.raises(psycopg2.OperationalError, match="PAM authentication failed"):
        postgres.connect(postgres.user, postgres.password)
    other = boto3.client("rds", region_name="us-east-1").generate_db_auth_token(postgres.host, postgres.port, postgres.master_user)
    with pytest.raises(psycopg2.OperationalError, match="PAM authentication failed"):
        postgres.connect(postgres.user, other)
    with pytest.raises(psycopg2.OperationalError, match="SSL off"):
        psycopg2.connect(host=postgres.host, port=postgres.port, dbname=postgres.database, user=postgres.user, password=_token(postgres), sslmode="disable")
    assert postgres.front.refused[refused_before:] == [f"{postgres.user}: not a token for this endpoint", f"{postgres.user}: not a token for this user"]


def test_the_client_refuses_a_server_whose_certificate_its_ca_did_not_sign(postgres, aws_env, tmp_path):
    from ddb_athena_bench.rds_front import make_authority

    stranger = make_authority(tmp_path, common_name="someone else's CA")
    with pytest.raises(psycopg2.OperationalError, match="certificate verify failed"):
        postgres.connect(postgres.user, _token(postgres), ca_file=stranger.ca_file)


def test_names_that_are_not_plain_identifiers_never_reach_sql_and_a_database_without_iam_is_named(postgres):
    with postgres.connect_as_master() as connection:
        with pytest.raises(ValueError, match="is not allowed"):
            ensure_database_role(connection, 'app"; DROP TABLE runs; --')
        with pytest.raises(RuntimeError, match="EnableIAMDatabaseAuthentication"):
            ensure_database_role(connection, "dagster_app", iam_group="rds_iam_absent")
    connection.close()
