import json
from datetime import datetime
from decimal import Decimal

from ddb_athena.lake.query import rows_as_json, rows_as_table


def test_json_keeps_numbers_exact_and_types_readable():
    rows = [(Decimal("12345678901234567890123"), Decimal("1.5"), Decimal("0.1000000000000000000001"), datetime(2026, 11, 22, 3), b"\x00\x01", None)]
    columns = ["big", "half", "precise", "at", "bin", "nothing"]
    assert json.loads(rows_as_json(columns, rows)) == [
        {"big": 12345678901234567890123, "half": 1.5, "precise": "0.1000000000000000000001", "at": "2026-11-22T03:00:00", "bin": "AAE=", "nothing": None}
    ]


def test_table_output_aligns_and_counts_rows():
    text = rows_as_table(["id", "name"], [("a", "Ay"), ("bb", None)])
    lines = text.splitlines()
    assert lines[0] == "id | name" and lines[2] == "a  | Ay  " and lines[3] == "bb | NULL" and lines[-1] == "(2 rows)"
