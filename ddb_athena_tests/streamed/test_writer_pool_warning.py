"""A books sync run checks at its start that the books writers queue one run at a time, on a real Dagster instance."""

import logging
from pathlib import Path

from dagster import DagsterInstance

from ddb_athena.dev.local_runs import limit_writer_pools
from ddb_athena.lib.writer_lease import WRITER_POOLS
from ddb_athena_tests.dagster_helpers import sync_books

REPO = Path(__file__).resolve().parents[2]


def pool_warnings(instance: DagsterInstance, run_id: str) -> list[str]:
    return [
        entry.user_message
        for entry in instance.all_logs(run_id)
        if entry.level == logging.WARNING and entry.user_message.startswith("Writers of pool books_writer do not wait")
    ]


def test_a_sync_run_warns_naming_the_fix_when_the_pools_have_no_limit_and_goes_on(spark, settings, tmp_path):
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        result = sync_books(instance)
        (warning,) = pool_warnings(instance, result.run_id)
    assert result.success  # a warning: the lease keeps one writer whatever the pools
    assert "pool books_writer has no limit" in warning and "granularity not set, not run" in warning
    assert "`ddb-athena writer-pools`" in warning and "`concurrency: pools: {granularity: run, default_limit: 1}`" in warning


def test_a_sync_run_says_nothing_of_pools_set_as_make_dev_sets_them(spark, settings, tmp_path):
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        limit_writer_pools(instance, WRITER_POOLS)
        result = sync_books(instance)
        assert result.success and pool_warnings(instance, result.run_id) == []
