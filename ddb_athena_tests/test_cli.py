import json
import os
import subprocess
import sys

from ddb_athena.cli import main
from ddb_athena_tests.spark.helpers import ChangeFiles, change


def test_init_refuses_the_aws_profile_without_yes(monkeypatch, capsys):
    monkeypatch.setenv("DDB_ATHENA_PROFILE", "aws")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: any AWS call would fail loudly
    assert main(["init"]) == 2
    assert "without --yes" in capsys.readouterr().err


def test_init_creates_the_demo_resources_once(aws_env, capsys):
    from ddb_athena.settings import Settings

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


def test_seed_and_simulate_write_books_and_orders(settings, capsys):
    assert main(["seed", "--books", "5", "--orders", "3", "--seed", "1"]) == 0
    assert main(["simulate", "--rate", "200", "--duration", "0.5", "--seed", "2"]) == 0
    counts = dict(pair.split("=") for pair in capsys.readouterr().out.split()[-5:])
    assert sum(int(n) for n in counts.values()) > 20
    dynamodb = settings.client("dynamodb")
    assert dynamodb.scan(TableName="orders", Select="COUNT")["Count"] >= 3


def test_query_json_prints_one_json_array_and_nothing_else_on_stdout(spark, settings):
    files = ChangeFiles(spark, settings)
    files.write(change(1, "b", "INSERT", name="Bee"), change(2, "a", "INSERT", name="Ay"))
    files.merge()
    completed = subprocess.run(
        [sys.executable, "-m", "ddb_athena.cli", "query", f"select id, name from {files.table} order by id", "--format", "json"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=300,
        check=True,
    )
    assert json.loads(completed.stdout) == [{"id": "a", "name": "Ay"}, {"id": "b", "name": "Bee"}]


def test_local_stack_serves_on_loopback_until_stopped(tmp_path):
    import signal
    import socket

    from ddb_athena.local_stack import wait_for_endpoint

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "ddb_athena.cli", "local-stack", "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        wait_for_endpoint(f"http://127.0.0.1:{port}")
        assert f"http://127.0.0.1:{port}" in process.stdout.readline()
    finally:
        process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
