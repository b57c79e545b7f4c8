"""Runs Spark SQL against the Iceberg catalog and renders the rows as a table or JSON."""

import base64
import json
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from pyspark.sql import SparkSession


def run_query(spark: SparkSession, sql: str) -> tuple[list[str], list[tuple]]:
    frame = spark.sql(sql)
    return frame.columns, [tuple(row) for row in frame.collect()]


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        # Integers stay exact; a fraction becomes a float only when that loses nothing.
        if value == value.to_integral_value():
            return int(value)
        return float(value) if Decimal(repr(float(value))) == value else str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return _json_value(value.asDict())
    return value


def rows_as_json(columns: list[str], rows: list[tuple]) -> str:
    return json.dumps([{column: _json_value(value) for column, value in zip(columns, row, strict=True)} for row in rows])


def rows_as_table(columns: list[str], rows: list[tuple], max_width: int = 60) -> str:
    def cell(value: Any) -> str:
        text = "NULL" if value is None else str(_json_value(value))
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    cells = [[cell(value) for value in row] for row in rows]
    widths = [max([len(column)] + [len(row[i]) for row in cells]) for i, column in enumerate(columns)]
    line = "+".join("-" * (width + 2) for width in widths)
    render = lambda values: " | ".join(value.ljust(width) for value, width in zip(values, widths, strict=True))  # noqa: E731
    return "\n".join([render(columns), line, *(render(row) for row in cells), f"({len(rows)} row{'s' if len(rows) != 1 else ''})"])
