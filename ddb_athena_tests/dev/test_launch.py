"""`ddb-athena launch`: a run submitted through the running webserver lands in that webserver's instance."""

import os
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from ddb_athena.dev.launch import launch_partition_run, yesterday_utc

REPO = Path(__file__).resolve().parents[2]


def test_yesterday_is_computed_in_utc():
    assert yesterday_utc(datetime(2026, 3, 1, 0, 30, tzinfo=UTC)) == "2026-02-28"


def test_a_partition_that_is_not_a_date_fails_before_anything_is_contacted():
    with pytest.raises(ValueError):
        launch_partition_run("127.0.0.1", 9, "orders_daily", "yesterday", 0, print)


def test_a_webserver_that_never_answers_is_a_timeout_after_waiting():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there
    logs = []
    with pytest.raises(TimeoutError, match="did not serve job orders_daily"):
        launch_partition_run("127.0.0.1", port, "orders_daily", "2026-11-22", 0, logs.append, sleep=lambda _: None)
    assert logs and logs[0].startswith(f"waiting for Dagster at 127.0.0.1:{port}")


def test_the_launcher_waits_for_the_webserver_and_its_run_is_queued_in_that_instance(tmp_path):
    # A fresh DAGSTER_HOME, as on a first `make dev`: only the webserver creates its storage.
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    partition = os.environ["DDB_ATHENA_ORDERS_START_DATE"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ddb_athena.dev.cli", "launch", "orders_daily", "--partition", partition, "--port", str(port), "--ready-timeout", "240"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    webserver = None
    try:
        # Started first, it waits for the webserver (which is not there yet) instead of touching the storage.
        assert launcher.stdout.readline().startswith(f"waiting for Dagster at 127.0.0.1:{port}")
        assert not list(tmp_path.glob("storage*")) and not (tmp_path / "history").exists()
        webserver = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=REPO,
        )
        output, _ = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, output
        assert f"launched orders_daily for partition {partition}" in output
    finally:
        launcher.kill()
        if webserver:
            webserver.terminate()
            webserver.wait(timeout=60)
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        (run,) = instance.get_runs(RunsFilter(job_name="orders_daily"))
    assert run.tags["dagster/partition"] == partition
    assert run.status == DagsterRunStatus.QUEUED  # the daemon of `dagster dev` would start it; none runs here


def test_the_bootstrap_command_queues_a_books_bootstrap_run_ahead_of_a_waiting_sync(tmp_path):
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    DagsterInstance.from_config(str(tmp_path)).dispose()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    webserver = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
    )
    try:
        command = [sys.executable, "-m", "ddb_athena.dev.cli", "bootstrap", "books", "--port", str(port), "--ready-timeout", "240"]
        completed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    finally:
        webserver.terminate()
        webserver.wait(timeout=60)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "launched books_bootstrap for books" in completed.stdout
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        (run,) = instance.get_runs(RunsFilter(job_name="books_bootstrap"))
    assert run.status == DagsterRunStatus.QUEUED and int(run.tags["dagster/priority"]) > 0  # ahead of a sync's successor
    assert "books_writer" in run.run_op_concurrency.all_pools  # so the running sync gives way to it
