import os
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterInstance, DefaultScheduleStatus, DefaultSensorStatus, Definitions
from dagster._core.instance.config import PoolGranularity

from ddb_athena.definitions import defs
from ddb_athena.lib.declarations import declared_tables

REPO = Path(__file__).resolve().parent.parent


def test_definitions_load_and_validate():
    Definitions.validate_loadable(defs)


def test_lineage_jobs_schedules_and_sensors_are_wired():
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get(AssetKey("books_iceberg")).parent_keys} == {"books_source"}
    sync = defs.resolve_job_def("books_sync")
    for job in (sync, defs.resolve_implicit_global_asset_job_def()):  # the latter serves `dagster asset materialize`
        assert job.executor_def.name == "in_process"  # one process, so one SparkSession per run
    checks = {key.name for key in graph.asset_check_keys}
    assert {"books_backlog", "books_quarantine_empty", "books_unique_id", "books_row_count_parity"} <= checks
    assert any("freshness" in name for name in checks)
    for schedule in defs.schedules:
        assert schedule.default_status == DefaultScheduleStatus.RUNNING
    for sensor in defs.sensors:
        assert sensor.default_status == DefaultSensorStatus.RUNNING


def pools_of(job) -> dict[str, str | None]:
    return {node.name: node.definition.pool for node in job.graph.nodes}


def test_every_step_that_writes_a_table_is_in_its_writers_pool_whatever_job_runs_it():
    # The implicit asset job is what the UI's Materialize, a backfill and `dagster asset materialize` run.
    implicit = pools_of(defs.resolve_implicit_global_asset_job_def())
    assert implicit["sync_books"] == "books_writer"
    assert implicit["orders_export"] == implicit["orders_athena"] == "orders_writer"
    # The sync is the one books writer outside the pool: its runs hand the table over to each other by the lease
    # (streamed/handover.py) and give way to any run of the pool.
    assert pools_of(defs.resolve_job_def("books_sync")) == {"keep_books_in_sync": None}
    assert pools_of(defs.resolve_job_def("books_maintenance")) == {"maintain_books_table": "books_writer"}
    # Expiry and orphans need no writer: a pool of their own per table, which the sync does not give way to; one run
    # for every streamed table.
    assert pools_of(defs.resolve_job_def("streamed_upkeep")) == {"trim_books_history": "books_upkeep", "trim_reviews_history": "reviews_upkeep"}
    bootstrap = defs.resolve_job_def("books_bootstrap")
    assert pools_of(bootstrap) == {"sync_books": "books_writer"}
    # Its default run config (the launchpad shows it; a run submitted without one gets it): one bootstrap cycle.
    assert bootstrap.run_config == {"ops": {"sync_books": {"config": {"bootstrap": True, "run_minutes": 0}}}}
    orders = pools_of(defs.resolve_job_def("orders_daily"))
    assert orders["orders_export"] == orders["orders_athena"] == "orders_writer"
    # A re-run of a partition re-uses its export files: their cleanup waits for the orders writer; books cleanup never
    # waits for the sync (it never reads a committed file again).
    assert pools_of(defs.resolve_job_def("orders_export_cleanup")) == {"delete_loaded_orders_export_files": "orders_writer"}
    assert pools_of(defs.resolve_job_def("books_source_cleanup")) == {"delete_committed_change_files": None}


def test_orders_lineage_partitions_job_and_checks_are_wired():
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get(AssetKey("orders_athena")).parent_keys} == {"orders_export"}
    for name in ("orders_export", "orders_athena"):
        # The first partition is the configured start date (the suite sets it: see conftest.py).
        assert graph.get(AssetKey(name)).partitions_def.get_first_partition_key() == os.environ["DDB_ATHENA_ORDERS_START_DATE"]
    orders = defs.resolve_job_def("orders_daily")
    assert orders.partitions_def is not None
    assert orders.executor_def.name == "in_process"
    checks = {key.name for key in graph.asset_check_keys if key.asset_key == AssetKey("orders_athena")}
    assert checks == {"freshness_check", "orders_export_reconciles", "orders_no_mutated_documents", "orders_quarantine_empty", "orders_unique_order_id"}


def test_the_instance_config_runs_one_writer_run_per_pool_and_frees_a_dead_runs_slot(tmp_path):
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        pools = instance.get_concurrency_config().pool_config
        assert pools.pool_granularity == PoolGranularity.RUN and pools.default_pool_limit == 1
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] > 0


def test_workspace_points_at_the_definitions_module():
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    assert workspace["load_from"][0]["python_module"]["module_name"] == "ddb_athena.definitions"


def test_writer_pools_are_limited_in_the_instance_before_its_daemon_meets_them(tmp_path):
    from ddb_athena.dev.local_runs import limit_writer_pools
    from ddb_athena.lib.writer_lease import WRITER_POOLS

    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.event_log_storage.get_pool_limits() == []  # what the daemon's first pass would find
        limit_writer_pools(instance, WRITER_POOLS)
        limits = {(pool.name, pool.limit) for pool in instance.event_log_storage.get_pool_limits()}
        assert limits == {(f"{name}_writer", 1) for name in declared_tables()} and {("books_writer", 1), ("orders_writer", 1)} <= limits


def pinned(names) -> list[str]:
    """The names of books and orders (and the shared ones): every name but another declared table's."""
    others = tuple(f"{name}_" for name in declared_tables() if name not in ("books", "orders"))
    return sorted(name for name in names if not name.startswith(others))


def test_the_names_an_existing_instance_keeps_its_history_and_cursors_under_stay_as_they_are():
    """Pinned: books and orders are declarations now, and a renamed asset, check, job, schedule, sensor or pool would
    start an existing instance's history, cursors and concurrency slots anew."""
    graph = defs.resolve_asset_graph()
    assert pinned(key.to_user_string() for key in graph.get_all_asset_keys()) == ["books_iceberg", "books_source", "orders_athena", "orders_export"]
    assert pinned(f"{key.asset_key.to_user_string()}:{key.name}" for key in graph.asset_check_keys) == [
        "books_iceberg:books_backlog",
        "books_iceberg:books_capture_failures",
        "books_iceberg:books_files_compact",
        "books_iceberg:books_quarantine_empty",
        "books_iceberg:books_row_count_parity",
        "books_iceberg:books_unique_id",
        "books_iceberg:freshness_check",
        "orders_athena:freshness_check",
        "orders_athena:orders_export_reconciles",
        "orders_athena:orders_no_mutated_documents",
        "orders_athena:orders_quarantine_empty",
        "orders_athena:orders_unique_order_id",
    ]
    assert pinned(job.name for job in defs.jobs) == [
        "books_bootstrap",
        "books_key_parity",
        "books_maintenance",
        "books_source_cleanup",
        "books_sync",
        "orders_daily",
        "orders_export_cleanup",
        "streamed_upkeep",
    ]
    assert pinned(schedule.name for schedule in defs.schedules) == ["books_every_minute", "books_key_parity_daily", "orders_daily_schedule"]
    assert sorted(sensor.name for sensor in defs.sensors) == [
        "alert_on_failed_run",
        "alert_on_red_checks",
        "cleanup_after_materialization",
        "freshness_checks_sensor",
        "runs_past_retention",
        "sync_successor_on_interruption",
        "upkeep_when_due",
    ]
    pools = {pool for job in defs.jobs for pool in pools_of(defs.resolve_job_def(job.name)).values()} | set(
        pools_of(defs.resolve_implicit_global_asset_job_def()).values()
    )
    assert set(pinned(pool for pool in pools if pool)) == {"books_upkeep", "books_writer", "orders_writer"}


def test_a_third_declared_table_gets_every_name_books_has_but_the_shared_sync():
    """reviews (ddb_athena/tables.toml) is a declaration and seed data only: the factories give it books' assets,
    checks, jobs, schedule and pool under its own names; the one sync job and schedule keep it beside books."""
    graph = defs.resolve_asset_graph()

    def of(table: str, names) -> set[str]:
        return {name.replace(f"{table}_", "<t>_") for name in names if name.startswith(f"{table}_")}

    checks = [f"{key.asset_key.to_user_string()}:{key.name}" for key in graph.asset_check_keys]
    jobs, schedules = [job.name for job in defs.jobs], [schedule.name for schedule in defs.schedules]
    assert of("reviews", checks) == of("books", checks) - {"<t>_iceberg:<t>_unique_id"} | {"<t>_iceberg:<t>_unique_book_id_review_id"}
    assert of("reviews", jobs) == of("books", jobs) - {"<t>_sync"} and of("reviews", schedules) == of("books", schedules) - {"<t>_every_minute"}
    assert of("reviews", [key.to_user_string() for key in graph.get_all_asset_keys()]) == {"<t>_source", "<t>_iceberg"}


# What a code location made of other tables than books and orders defines: its jobs, schedules and asset keys.
DEFINED = """
import json
from ddb_athena.definitions import defs
import ddb_athena
print(json.dumps({
    "package": ddb_athena.__file__,
    "jobs": sorted(job.name for job in defs.jobs),
    "schedules": sorted(schedule.name for schedule in defs.schedules),
    "assets": sorted(key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()),
    "checks": sorted(key.name for key in defs.resolve_asset_graph().asset_check_keys if key.name != "freshness_check"),
}))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("kinds", ["streamed and exported", "exported only"])
def test_a_code_location_of_other_tables_than_books_and_orders_loads_and_names_everything_after_them(tmp_path, kinds):
    """Neither books nor orders is needed: a copy of the package whose tables.toml declares a composite-key streamed
    table and an exported one (or the exported one alone) loads, and every table's assets, checks, jobs and schedules
    are named after it. The one sync job and its schedule are named after what they sync, and exist only with a
    streamed table."""
    import json
    import shutil
    import subprocess
    import sys

    from ddb_athena_tests.deploy.test_template import THIRD_TABLE

    shutil.copytree(REPO / "ddb_athena", tmp_path / "ddb_athena", ignore=shutil.ignore_patterns("__pycache__"))
    declarations = THIRD_TABLE if kinds == "streamed and exported" else THIRD_TABLE[THIRD_TABLE.index("[audits]") :]
    (tmp_path / "ddb_athena" / "tables.toml").write_text(declarations)
    environ = {**os.environ, "PYTHONPATH": str(tmp_path)}
    loaded = subprocess.run([sys.executable, "-c", DEFINED], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    defined = json.loads(loaded.stdout.splitlines()[-1])
    assert defined["package"].startswith(str(tmp_path))
    exported = {
        "jobs": ["audits_daily", "audits_export_cleanup"],
        "schedules": ["audits_daily_schedule"],
        "assets": ["audits_athena", "audits_export"],
        "checks": ["audits_export_reconciles", "audits_no_mutated_documents", "audits_quarantine_empty", "audits_unique_audit_id"],
    }
    if kinds == "exported only":
        assert defined | {"package": None} == exported | {"package": None}
        return
    streamed = {
        "jobs": [
            "ledger_entries_bootstrap",
            "ledger_entries_key_parity",
            "ledger_entries_maintenance",
            "ledger_entries_source_cleanup",
            "streamed_sync",
            "streamed_upkeep",
        ],
        "schedules": ["ledger_entries_key_parity_daily", "streamed_every_minute"],
        "assets": ["ledger_entries_iceberg", "ledger_entries_source"],
        "checks": [
            *(f"ledger_entries_{name}" for name in ("backlog", "capture_failures", "files_compact", "quarantine_empty", "row_count_parity")),
            "ledger_entries_unique_account_entry",
        ],
    }
    for field in streamed:
        assert defined[field] == sorted(exported[field] + streamed[field]), field


@pytest.mark.subprocess
def test_fifty_declared_tables_load_as_a_code_location_with_a_group_each(tmp_path):
    """25 streamed and 25 exported tables (issue 68): the code location loads in a fresh process as `dagster dev` loads
    it, every table its two assets in its own group (the UI's lineage a group a table). Its load time is
    `python -m ddb_athena_bench.many_declarations`'s figure, not this test's."""
    from ddb_athena_bench.many_declarations import declarations_text, load_code_location

    declarations = tmp_path / "tables.toml"
    declarations.write_text(declarations_text(25, 25), encoding="utf-8")
    loaded = load_code_location(declarations)
    assert (loaded["tables"], loaded["assets"], loaded["groups"]) == (50, 100, 50)
    assert loaded["schedules"] >= 25 + 25  # each exported table's daily load, each streamed table's parity
