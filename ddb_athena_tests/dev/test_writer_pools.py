"""A writer run checks that its pool queues one run at a time, and `ddb-athena writer-pools` says what is still missing."""

from pathlib import Path

import pytest
from dagster import DagsterInstance

from ddb_athena.dev.cli import main
from ddb_athena.dev.local_runs import limit_writer_pools
from ddb_athena.lib.writer_lease import WRITER_POOLS
from ddb_athena.lib.writer_pools import pool_limit, writer_pool_problems, writer_pool_warning
from ddb_athena_tests.books_and_orders import BOOKS_WRITER_POOL, ORDERS_WRITER_POOL

REPO = Path(__file__).resolve().parents[2]
# This repository's settings without the pools: what an instance set up before them, or by hand, has.
WITHOUT_POOLS = "telemetry:\n  enabled: false\n"


@pytest.fixture
def home(tmp_path) -> Path:
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    return tmp_path


def test_with_this_repositorys_settings_and_the_limits_set_the_writers_queue_and_nothing_is_said(home):
    with DagsterInstance.from_config(str(home)) as instance:
        limit_writer_pools(instance, WRITER_POOLS)
        assert [writer_pool_warning(instance, pool) for pool in WRITER_POOLS] == [None] * len(WRITER_POOLS)
        assert pool_limit(instance, BOOKS_WRITER_POOL) == 1


def test_before_writer_pools_runs_the_default_limit_of_dagster_yaml_counts(home):
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance.event_log_storage.get_pool_limits() == []
        assert pool_limit(instance, BOOKS_WRITER_POOL) == 1 and writer_pool_warning(instance, BOOKS_WRITER_POOL) is None


def test_without_the_pool_settings_a_writer_is_told_what_to_set_and_what_to_run(tmp_path):
    (tmp_path / "dagster.yaml").write_text(WITHOUT_POOLS)
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert pool_limit(instance, BOOKS_WRITER_POOL) is None
        warning = writer_pool_warning(instance, BOOKS_WRITER_POOL)
    assert warning.startswith("Writers of pool books_writer do not wait for each other in this Dagster instance: ")
    assert "pools limit ops, not runs (granularity not set, not run)" in warning and "pool books_writer has no limit" in warning
    assert "`concurrency: pools: {granularity: run, default_limit: 1}`" in warning and "dagster.yaml" in warning
    assert "`ddb-athena writer-pools` (`.venv/bin/ddb-athena writer-pools` in this repository)" in warning


def test_a_limit_other_than_one_is_named_and_writer_pools_fixes_it(home):
    with DagsterInstance.from_config(str(home)) as instance:
        instance.event_log_storage.set_concurrency_slots(BOOKS_WRITER_POOL, 3)
        assert writer_pool_problems(instance, BOOKS_WRITER_POOL) == ([], ["pool books_writer admits 3 runs at once, not 1"])
        warning = writer_pool_warning(instance, BOOKS_WRITER_POOL)
        assert "ddb-athena writer-pools" in warning and "dagster.yaml" not in warning  # the command alone fixes it
        assert writer_pool_warning(instance, ORDERS_WRITER_POOL) is None
        limit_writer_pools(instance, WRITER_POOLS)
        assert writer_pool_warning(instance, BOOKS_WRITER_POOL) is None


def test_an_instance_that_does_not_queue_runs_is_named():
    """`dagster asset materialize`, tests: runs start at once, whatever the pools say."""
    with DagsterInstance.ephemeral() as instance:
        in_settings, _ = writer_pool_problems(instance, BOOKS_WRITER_POOL)
    assert "the instance starts every run at once (its run coordinator is SyncInMemoryRunCoordinator, not QueuedRunCoordinator)" in in_settings


def test_the_writer_pools_command_sets_the_limits_then_exits_1_naming_what_dagster_yaml_lacks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text(WITHOUT_POOLS)
    assert main(["writer-pools"]) == 1
    err = capsys.readouterr().err
    assert "pools limit ops, not runs" in err and "granularity: run" in err
    with DagsterInstance.get() as instance:
        assert {(limit.name, limit.limit) for limit in instance.event_log_storage.get_pool_limits()} == {(pool, 1) for pool in WRITER_POOLS}

    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    assert main(["writer-pools"]) == 0
    assert capsys.readouterr().err == ""
