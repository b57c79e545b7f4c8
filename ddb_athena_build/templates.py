"""The deployment's CloudFormation templates, rendered from deploy/*.yaml.j2 and the table declarations
(ddb_athena/tables.toml): every declared table gets its parameters, grants, lifecycle rules and stream mapping, so a
table is added to a deployment by declaring it, never by editing a policy. `make templates` writes them to
build/deploy/; deploy from there.
"""

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

import jinja2
import yaml

from ddb_athena.lake.table_spec import tombstone_table
from ddb_athena.lib.declarations import TableDeclaration, declared_tables

SOURCE_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = SOURCE_ROOT / "deploy"
RENDERED = SOURCE_ROOT / "build" / "deploy"
TEMPLATE_NAMES = ("ddb_athena.yaml", "dagster_ecs.yaml")
# The instance of a deployment on ECS (the image's dagster.yaml).
INSTANCE = TEMPLATES / "dagster.yaml"
# How long the deployment keeps the logs of its tasks: the containers' in CloudWatch, the runs' compute logs in the bucket.
LOG_RETENTION_DAYS = 30


def deployed_instance() -> dict:
    """deploy/dagster.yaml, as the webserver, the daemon and every run read it."""
    return yaml.safe_load(INSTANCE.read_text())


def camel(name: str) -> str:
    """A declared name as CloudFormation's logical ids and parameters spell it: order_items -> OrderItems."""
    return "".join(part.capitalize() for part in name.split("_"))


def iceberg_tables_of(table: TableDeclaration) -> list[str]:
    return [table.iceberg_table] + ([tombstone_table(table.iceberg_table)] if table.kind == "streamed" else [])


def render(name: str, tables: Iterable[TableDeclaration] | None = None) -> str:
    """deploy/<name>.j2 for these tables (default: the declared ones). Undefined names fail: a typo in a template
    never renders as an empty string."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True
    )
    environment.filters["camel"] = camel
    # In an ARN: the deployment's parameter where a variable names the table, else the declared name.
    environment.globals["dynamodb_name"] = lambda table: f"${{{camel(table.name)}TableName}}" if table.dynamodb_table_variable else table.dynamodb_table
    tables = list(declared_tables().values() if tables is None else tables)
    return environment.get_template(f"{name}.j2").render(
        tables=tables,
        streamed=[table for table in tables if table.kind == "streamed"],
        exported=[table for table in tables if table.kind == "exported"],
        # Each table's Iceberg tables, a streamed one's tombstones beside it: the runs' grants under warehouse/ name them.
        iceberg_tables=[name for table in tables for name in iceberg_tables_of(table)],
        exported_iceberg_tables=[name for table in tables if table.kind == "exported" for name in iceberg_tables_of(table)],
        # Declared per table (ddb_athena/tables.toml), whatever the stack's BooksCapture and OrdersLoad say.
        captured_by_lambda=[table for table in tables if table.capture == "lambda"],
        loaded_on_emr=[table for table in tables if table.load == "emr_serverless"],
        # Tables whose DynamoDB name the deployment chooses (a parameter, passed to every task as the variable).
        named_by_variable=[table for table in tables if table.dynamodb_table_variable],
        compute_log_prefix=deployed_instance()["compute_logs"]["config"]["prefix"],
        log_retention_days=LOG_RETENTION_DAYS,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RENDERED, help=f"directory to write them to (default {RENDERED.relative_to(SOURCE_ROOT)})")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in TEMPLATE_NAMES:
        (args.out / name).write_text(render(name))
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
