"""The canonical form of an item's key, in Python: the same values the key columns hold in SQL (table_spec.py).

A key is a tuple with one value a key attribute, partition key first: S as `str`, N as an exact `Decimal` (the value,
not its text: `1.50` and `1.5` are one key, as in DynamoDB), B as `bytes`. Never parts joined by a delimiter: (`a#b`,
`c`) and (`a`, `b#c`) are two keys. SQL compares the typed key columns (`key_match_sql`); a number a column would
round is refused in both (`exact_number` here, `exact_decimal_value_sql` there; a test holds the two to the same
verdicts).
"""

import base64
import binascii
import json
import re
from collections.abc import Mapping
from decimal import Decimal, localcontext
from typing import Any

from ddb_athena.lake.table_spec import NUMBER_PATTERN, ColumnSpec, TableSpec

Key = tuple[str | Decimal | bytes, ...]


class InvalidKeyError(ValueError):
    """A key attribute is missing or its value is not one its column can hold exactly."""


def exact_number(text: str, precision: int, scale: int) -> Decimal:
    """`text` (a DynamoDB number) as a Decimal, if a decimal(precision, scale) holds it without rounding."""
    number = re.fullmatch(NUMBER_PATTERN, text) if isinstance(text, str) else None
    if number is None or not (number[1] or number[2]):
        raise InvalidKeyError(f"is not a valid decimal({precision},{scale})")
    value = Decimal(text)
    if value and value.adjusted() >= precision - scale:
        raise InvalidKeyError(f"is not a valid decimal({precision},{scale})")
    # DynamoDB numbers have up to 38 digits and exponents to 125: room for every one of them.
    with localcontext(prec=200):
        if value != value.quantize(Decimal(1).scaleb(-scale), rounding="ROUND_DOWN"):
            raise InvalidKeyError(f"has more digits than decimal({precision},{scale}) keeps")
    return value


def key_value(column: ColumnSpec, attribute: Mapping[str, Any] | None) -> str | Decimal | bytes:
    """One key attribute's value in wire DynamoDB JSON (`{"N": "12"}`; B as base64, or bytes as boto3 gives them)."""
    if not attribute or column.type_tag not in attribute:
        raise InvalidKeyError(f"missing key attribute {column.attribute} ({column.type_tag})")
    raw = attribute[column.type_tag]
    if column.type_tag == "S":
        return raw
    if column.type_tag == "N":
        try:
            return exact_number(raw, column.precision, column.scale)
        except InvalidKeyError as error:
            raise InvalidKeyError(f"attribute {column.attribute} {error}") from None
    if isinstance(raw, bytes | bytearray):
        return bytes(raw)
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidKeyError(f"attribute {column.attribute} is not a valid binary") from None


def item_key(spec: TableSpec, item: Mapping[str, Mapping[str, Any]]) -> Key:
    """The key of a DynamoDB item, or of a stream record's Keys (wire JSON or what boto3 reads)."""
    return tuple(key_value(column, item.get(column.attribute)) for column in spec.key_columns)


def row_key(spec: TableSpec, row: Mapping[str, Any]) -> Key:
    """The key of a Spark row holding the key columns (Spark gives binary as bytearray)."""
    return tuple(bytes(value) if isinstance(value, bytearray) else value for value in (row[name] for name in spec.key_names))


def key_rows_schema(spec: TableSpec) -> str:
    """Spark DDL of rows holding only the key columns: what keys are sent to Spark as (createDataFrame)."""
    return ", ".join(f"{column.name} {column.sql_type}" for column in spec.key_columns)


def key_text(key: Key) -> str:
    """A key for people (logs, check metadata): a single string key as it is, any other as a JSON array (numbers as
    their text, bytes as base64), never parts joined by a delimiter."""
    if len(key) == 1 and isinstance(key[0], str):
        return key[0]
    return json.dumps([_json_part(part) for part in key], ensure_ascii=False)


def _json_part(part: str | Decimal | bytes) -> str:
    if isinstance(part, bytes):
        return base64.b64encode(part).decode("ascii")
    return str(part)
