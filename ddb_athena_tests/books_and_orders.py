"""The definitions of the two tables most tests exercise, books (streamed) and orders (exported), by short names. The
package makes them from ddb_athena/tables.toml, where both are declared entries like any other."""

from ddb_athena.cleanup.jobs import EXPORT_CLEANUPS, SOURCE_CLEANUPS
from ddb_athena.exported.assets import EXPORTED
from ddb_athena.exported.checks import EXPORTED_CHECKS
from ddb_athena.exported.jobs import DAILY_JOBS
from ddb_athena.exported.schedules import DAILY_SCHEDULES
from ddb_athena.lib.declarations import declared
from ddb_athena.streamed.assets import STREAMED, SYNC_ASSETS
from ddb_athena.streamed.checks import CHECKS
from ddb_athena.streamed.jobs import JOBS, sync_job, upkeep_job
from ddb_athena.streamed.schedules import KEY_PARITY_SCHEDULES, sync_every_minute

BOOKS = STREAMED["books"]
books_source, books_iceberg, sync_books = BOOKS.source, BOOKS.iceberg, SYNC_ASSETS["books"]
BOOKS_CHECKS = CHECKS["books"]
books_freshness_checks, BOOKS_FRESHNESS = BOOKS_CHECKS.freshness, BOOKS.table.freshness
books_backlog, books_quarantine_empty, books_capture_failures = BOOKS_CHECKS.backlog, BOOKS_CHECKS.quarantine_empty, BOOKS_CHECKS.capture_failures
books_unique_id, books_row_count_parity, books_files_compact = BOOKS_CHECKS.unique_key, BOOKS_CHECKS.parity, BOOKS_CHECKS.files_compact
books_bootstrap, books_key_parity, books_maintenance = JOBS["books"].bootstrap, JOBS["books"].key_parity, JOBS["books"].maintenance
streamed_upkeep = upkeep_job
books_sync_job, books_every_minute, books_key_parity_daily = sync_job, sync_every_minute, KEY_PARITY_SCHEDULES["books"]
books_source_cleanup = SOURCE_CLEANUPS["books"]
BOOKS_WRITER_POOL = declared("books").writer_pool

ORDERS = EXPORTED["orders"]
orders_export, orders_athena, orders_partitions = ORDERS.export, ORDERS.athena, ORDERS.partitions
orders_freshness_checks, orders_unique_order_id = EXPORTED_CHECKS["orders"].freshness, EXPORTED_CHECKS["orders"].unique_key
ORDERS_FRESHNESS = ORDERS.table.freshness
orders_daily, orders_daily_schedule, orders_export_cleanup = DAILY_JOBS["orders"], DAILY_SCHEDULES["orders"], EXPORT_CLEANUPS["orders"]
ORDERS_WRITER_POOL = declared("orders").writer_pool
