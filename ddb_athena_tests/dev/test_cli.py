import json
import os
import subprocess
import sys

import pytest

from ddb_athena.dev.cli import main
from ddb_athena_tests.lake.helpers import ChangeFiles, change


def test_init_refuses_the_aws_profile_without_yes(monkeypatch, capsys):
    monkeypatch.setenv("DDB_ATHENA_PROFILE", "aws")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: any AWS call would fail loudly
    assert main(["init"]) == 2
    assert "without --yes" in capsys.readouterr().err


def test_init_creates_the_demo_resources_once(aws_env, capsys):
    from ddb_athena.lib.settings import Settings

    assert main(["init"]) == 0
    settings = Settings.from_env()
    dynamodb = settings.client("dynamodb")
    books = dynamodb.describe_table(TableName="books")["Table"]
    assert books["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    assert books["StreamSpecification"] == {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}
    backups = dynamodb.describe_continuous_backups(TableName="orders")["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"
    assert "test-bucket" in {b["Name"] for b in settings.client("s3").list_buckets()["Buckets"]}
    assert main(["init"]) == 0
    assert capsys.readouterr().out.strip().endswith("everything already exists")


@pytest.mark.parametrize("argument", [["--rate", "0"], ["--operations", "0"]])
def test_simulate_refuses_a_rate_or_a_count_that_is_not_positive(argument, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["simulate", *argument])
    assert exited.value.code == 2
    assert f"{argument[0]} must be positive" in capsys.readouterr().err


def test_seed_and_simulate_write_books_orders_and_every_seeded_table(settings, capsys):
    assert main(["seed", "--books", "5", "--orders", "3", "--seed", "1"]) == 0
    assert capsys.readouterr().out.strip() == "seeded 5 books and 3 orders, 16 reviews"  # ddb_athena/dev/seeds/reviews.json
    # A count, not a duration: how many writes a second an emulator takes depends on the host.
    assert main(["simulate", "--rate", "1000", "--operations", "60", "--seed", "2"]) == 0
    counts = {name: int(count) for name, count in (pair.split("=") for pair in capsys.readouterr().out.split())}
    assert sum(counts.values()) == 60
    # Books and orders, and the reviews beside them (a composite key: inserts, updates and deletes too).
    assert counts["insert"] and counts["order"] and counts.get("reviews.insert", 0) + counts.get("reviews.update", 0) > 0
    dynamodb = settings.client("dynamodb")
    assert dynamodb.scan(TableName="orders", Select="COUNT")["Count"] >= 3
    assert dynamodb.scan(TableName="reviews", Select="COUNT")["Count"] >= 16 - counts.get("reviews.delete", 0)


def test_query_json_prints_one_json_array_and_nothing_else_on_stdout(spark, settings):
    files = ChangeFiles(spark, settings)
    files.write(change(1, "b", "INSERT", name="Bee"), change(2, "a", "INSERT", name="Ay"))
    files.merge()
    completed = subprocess.run(
        [sys.executable, "-m", "ddb_athena.dev.cli", "query", f"select id, name from {files.table} order by id", "--format", "json"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=300,
        check=True,
    )
    assert json.loads(completed.stdout) == [{"id": "a", "name": "Ay"}, {"id": "b", "name": "Bee"}]


def signal_a_thread_other_than_the_main_one(pid: int, number: int) -> None:
    """As the kernel may do with a signal sent to the process: deliver it to one of its other threads (the server's)."""
    import ctypes

    thread = next(int(task) for task in os.listdir(f"/proc/{pid}/task") if int(task) != pid)
    assert ctypes.CDLL(None, use_errno=True).tgkill(pid, thread, number) == 0


@pytest.mark.subprocess
@pytest.mark.parametrize("received_by", ["process", "server thread"])
def test_local_stack_serves_on_loopback_until_stopped(received_by):
    import signal
    import socket

    from ddb_athena.dev.local_stack import wait_for_endpoint

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "ddb_athena.dev.cli", "local-stack", "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        wait_for_endpoint(f"http://127.0.0.1:{port}")
        assert f"http://127.0.0.1:{port}" in process.stdout.readline()
        if received_by == "server thread":
            signal_a_thread_other_than_the_main_one(process.pid, signal.SIGTERM)
        else:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()


@pytest.mark.subprocess
def test_a_date_range_backfill_from_the_cli_queues_one_orders_run_per_day(tmp_path):
    from datetime import date, timedelta
    from pathlib import Path

    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "dagster.yaml").write_text((repo / "dagster.yaml").read_text())
    start = date.fromisoformat(os.environ["DDB_ATHENA_ORDERS_START_DATE"])
    days = [(start + timedelta(days=offset)).isoformat() for offset in (1, 2, 3)]
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "dagster",
            "job",
            "backfill",
            "-m",
            "ddb_athena.definitions",
            "-j",
            "orders_daily",
            "--from",
            days[0],
            "--to",
            days[-1],
            "--noprompt",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        runs = instance.get_runs(RunsFilter(job_name="orders_daily"))
        # Queued: the daemon of `dagster dev` runs them one at a time (the orders writers' pool).
        assert sorted(run.tags["dagster/partition"] for run in runs) == days
        assert {run.status for run in runs} == {DagsterRunStatus.QUEUED}


def test_the_platforms_test_alert_reaches_the_topics_subscribers_and_says_so_when_there_is_no_topic(aws_env, settings, monkeypatch, capsys):
    """Issue 69: each platform start (deploy/platform.sh) sends one, so a deploy shows that alerts reach someone."""
    from ddb_athena.dev.cli import main

    monkeypatch.delenv("DDB_ATHENA_ALERT_TOPIC_ARN", raising=False)
    assert main(["test-alert"]) == 1 and "alerts reach nobody" in capsys.readouterr().err
    sns, sqs = settings.client("sns"), settings.client("sqs")
    topic = sns.create_topic(Name="ddb-athena-alerts")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="on-call")["QueueUrl"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])
    monkeypatch.setenv("DDB_ATHENA_ALERT_TOPIC_ARN", topic)
    monkeypatch.setenv("DAGSTER_CURRENT_IMAGE", "123456789012.dkr.ecr.us-east-1.amazonaws.com/ddb-athena@sha256:abc")
    assert main(["test-alert"]) == 0
    (message,) = [json.loads(message["Body"]) for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]]
    assert message["Subject"] == "ddb_athena: the platform started - a test alert" and "sha256:abc" in message["Message"]
