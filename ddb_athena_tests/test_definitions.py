import os
from pathlib import Path

import yaml
from dagster import AssetKey, DagsterInstance, DefaultScheduleStatus, DefaultSensorStatus, Definitions

from ddb_athena.definitions import defs
from ddb_athena.jobs import BOOKS_CONCURRENCY_TAG, ORDERS_CONCURRENCY_TAG

REPO = Path(__file__).resolve().parent.parent


def test_definitions_load_and_validate():
    Definitions.validate_loadable(defs)


def test_lineage_jobs_schedules_and_sensors_are_wired():
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get(AssetKey("books_iceberg")).parent_keys} == {"books_source"}
    sync = defs.resolve_job_def("books_sync")
    for job in (sync, defs.resolve_implicit_global_asset_job_def()):  # the latter serves `dagster asset materialize`
        assert job.executor_def.name == "in_process"  # one process, so one SparkSession per run
    assert sync.tags == BOOKS_CONCURRENCY_TAG
    checks = {key.name for key in graph.asset_check_keys}
    assert {"books_backlog", "books_quarantine_empty", "books_unique_id", "books_row_count_parity"} <= checks
    assert any("freshness" in name for name in checks)
    for schedule in defs.schedules:
        assert schedule.default_status == DefaultScheduleStatus.RUNNING
    for sensor in defs.sensors:
        assert sensor.default_status == DefaultSensorStatus.RUNNING
    for job_name in ("books_sync", "books_maintenance"):
        assert defs.resolve_job_def(job_name).tags == BOOKS_CONCURRENCY_TAG
    assert "ddb_athena/writer" not in defs.resolve_job_def("source_cleanup").tags  # cleanup never waits for the sync


def test_orders_lineage_partitions_job_and_checks_are_wired():
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get(AssetKey("orders_athena")).parent_keys} == {"orders_export"}
    for name in ("orders_export", "orders_athena"):
        # The first partition is the configured start date (the suite sets it: see conftest.py).
        assert graph.get(AssetKey(name)).partitions_def.get_first_partition_key() == os.environ["DDB_ATHENA_ORDERS_START_DATE"]
    orders = defs.resolve_job_def("orders_daily")
    assert orders.tags == ORDERS_CONCURRENCY_TAG and orders.partitions_def is not None
    assert orders.executor_def.name == "in_process"
    checks = {key.name for key in graph.asset_check_keys if key.asset_key == AssetKey("orders_athena")}
    assert checks == {"freshness_check", "orders_export_reconciles", "orders_no_mutated_documents", "orders_quarantine_empty", "orders_unique_order_id"}


def test_the_instance_config_queues_books_runs_one_at_a_time(tmp_path):
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    (tag,) = [limit for limit in limits if limit["key"] in BOOKS_CONCURRENCY_TAG]
    assert tag["limit"] == 1


def test_workspace_points_at_the_definitions_module():
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    assert workspace["load_from"][0]["python_module"]["module_name"] == "ddb_athena.definitions"
