"""`ddb-athena launch`: a run submitted through the running webserver lands in that webserver's instance."""

import getpass
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from ddb_athena.dev.cli import DEFAULT_READY_TIMEOUT_SECONDS, build_parser
from ddb_athena.dev.launch import URL_VARIABLE, Webserver, launch_partition_run, yesterday_utc

REPO = Path(__file__).resolve().parents[2]


def test_yesterday_is_computed_in_utc():
    assert yesterday_utc(datetime(2026, 3, 1, 0, 30, tzinfo=UTC)) == "2026-02-28"


def test_a_partition_that_is_not_a_date_fails_before_anything_is_contacted():
    with pytest.raises(ValueError):
        launch_partition_run(Webserver.at("http://127.0.0.1:9"), "orders_daily", "yesterday", 0, print)


def test_a_webserver_that_never_answers_is_a_timeout_after_waiting():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there
    logs = []
    with pytest.raises(TimeoutError, match="did not serve job orders_daily"):
        launch_partition_run(Webserver.at(f"http://127.0.0.1:{port}"), "orders_daily", "2026-11-22", 0, logs.append, sleep=lambda _: None)
    assert logs and logs[0].startswith(f"waiting for Dagster at http://127.0.0.1:{port}")


def test_the_webserver_is_the_url_given_else_the_variables_else_make_devs_port():
    from ddb_athena.lib.resources import setting_variable

    assert setting_variable("dagster_url") == URL_VARIABLE  # the CLI and the alerts' links read one variable
    assert Webserver.at(None, {}).url == "http://127.0.0.1:3000"
    assert Webserver.at(None, {"DAGSTER_PORT": "3111"}).url == "http://127.0.0.1:3111"
    assert Webserver.at(None, {"DAGSTER_PORT": "3111", URL_VARIABLE: "https://dagster.example.com/"}).url == "https://dagster.example.com"
    assert Webserver.at("http://10.0.1.5:3000", {URL_VARIABLE: "https://dagster.example.com"}).url == "http://10.0.1.5:3000"
    # A port and a path prefix (dagster-webserver --path-prefix) reach GraphQL where the webserver serves it.
    assert Webserver.at("https://example.com:8443/dagster").client()._url == "https://example.com:8443/dagster/graphql"
    assert Webserver.at("http://127.0.0.1:3000").run_url("abc") == "http://127.0.0.1:3000/runs/abc"
    for wrong in ("127.0.0.1:3000", "ftp://host", "http://host:port", "http://", "http://host/?a=1"):
        with pytest.raises(ValueError, match="is not a Dagster webserver's URL"):
            Webserver.at(wrong, {})


@pytest.mark.subprocess
def test_where_nothing_answers_the_command_ends_in_one_line_within_its_ready_timeout():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there
    assert build_parser().parse_args(["bootstrap", "books"]).ready_timeout == DEFAULT_READY_TIMEOUT_SECONDS <= 30
    command = [sys.executable, "-m", "ddb_athena.dev.cli", "bootstrap", "books", "--ready-timeout", "1"]
    completed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, URL_VARIABLE: f"http://127.0.0.1:{port}"}, timeout=120)
    assert completed.returncode == 1
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith(f"ddb-athena bootstrap: Dagster at http://127.0.0.1:{port} did not serve job books_bootstrap within 1 s")
    bad = subprocess.run([*command, "--url", "localhost:3000"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "is not a Dagster webserver's URL" in bad.stderr


def test_a_run_launched_from_the_command_line_names_the_callers_aws_identity(aws_env):
    from ddb_athena.dev.launch import launched_by

    assert launched_by() == "arn:aws:sts::123456789012:user/moto"  # the emulator's caller identity


@pytest.mark.subprocess
def test_the_commands_wait_for_the_webserver_and_queue_their_runs_in_its_instance(tmp_path):
    """One webserver for both commands (one each took about 10 s): `launch`, started before it in a fresh DAGSTER_HOME
    as on a first `make dev`, waits for it; `bootstrap books` then finds it at DAGSTER_PORT, as `make dev` sets it."""
    # Only the webserver creates the home's storage.
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    partition = os.environ["DDB_ATHENA_ORDERS_START_DATE"]
    command = ["launch", "orders_daily", "--partition", partition, "--url", f"http://127.0.0.1:{port}", "--ready-timeout", "240"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ddb_athena.dev.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    webserver = None
    try:
        # Started first, it waits for the webserver (which is not there yet) instead of touching the storage.
        assert launcher.stdout.readline().startswith(f"waiting for Dagster at http://127.0.0.1:{port}")
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
        bootstrap_env = {**env, "DAGSTER_PORT": str(port)}
        bootstrap_env.pop(URL_VARIABLE, None)
        bootstrap = [sys.executable, "-m", "ddb_athena.dev.cli", "bootstrap", "books", "--ready-timeout", "240"]
        completed = subprocess.run(bootstrap, capture_output=True, text=True, env=bootstrap_env, cwd=REPO, timeout=300)
    finally:
        launcher.kill()
        if webserver:
            webserver.terminate()
            webserver.wait(timeout=60)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "launched books_bootstrap for books" in completed.stdout
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        (run,) = instance.get_runs(RunsFilter(job_name="orders_daily"))
        (bootstrap_run,) = instance.get_runs(RunsFilter(job_name="books_bootstrap"))
    assert run.tags["dagster/partition"] == partition
    # Who launched it (issue 69), on every run the CLI launches: here no AWS endpoint answers, so the local user.
    assert run.tags["ddb_athena/launched_by"] == bootstrap_run.tags["ddb_athena/launched_by"] == f"{getpass.getuser()}@{socket.gethostname()}"
    assert run.status == DagsterRunStatus.QUEUED  # the daemon of `dagster dev` would start it; none runs here
    assert bootstrap_run.status == DagsterRunStatus.QUEUED and int(bootstrap_run.tags["dagster/priority"]) > 0  # ahead of a sync's successor
    assert "books_writer" in bootstrap_run.run_op_concurrency.all_pools  # so the running sync gives way to it
