"""DynamoDB's typed JSON ("AttributeValue" maps): exact decoding, validation and wire encoding.

Decoding is exact: N becomes Decimal (never float), B stays bytes, SS/NS/BS become sets.
"""

import base64
import binascii
import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

TYPE_TAGS = ("S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS")


class DynamoDBTypeError(ValueError):
    """An attribute value is not valid DynamoDB JSON."""


def _number(text: Any, path: str) -> Decimal:
    if not isinstance(text, str):
        raise DynamoDBTypeError(f"{path}: N must be a string, got {type(text).__name__}")
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise DynamoDBTypeError(f"{path}: N is not a number") from None
    if not number.is_finite():
        raise DynamoDBTypeError(f"{path}: N is not a finite number")
    return number


def _binary(value: Any, path: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise DynamoDBTypeError(f"{path}: B must be base64 text, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise DynamoDBTypeError(f"{path}: B is not valid base64") from None


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise DynamoDBTypeError(f"{path}: S must be a string, got {type(value).__name__}")
    return value


def _set(values: Any, path: str, decode_member) -> set:
    if not isinstance(values, list) or not values:
        raise DynamoDBTypeError(f"{path}: a set must be a non-empty list")
    return {decode_member(member, f"{path}[{index}]") for index, member in enumerate(values)}


def decode_attribute(attribute: Any, path: str = "$") -> Any:
    """Decodes one AttributeValue (`{"N": "1.5"}`) to its exact Python value."""
    if not isinstance(attribute, Mapping) or len(attribute) != 1:
        raise DynamoDBTypeError(f"{path}: an attribute value is an object with exactly one type tag")
    ((tag, value),) = attribute.items()
    if tag == "S":
        return _string(value, path)
    if tag == "N":
        return _number(value, path)
    if tag == "B":
        return _binary(value, path)
    if tag == "BOOL":
        if not isinstance(value, bool):
            raise DynamoDBTypeError(f"{path}: BOOL must be true or false")
        return value
    if tag == "NULL":
        if value is not True:
            raise DynamoDBTypeError(f"{path}: NULL must be true")
        return None
    if tag == "M":
        return decode_item(value, path)
    if tag == "L":
        if not isinstance(value, list):
            raise DynamoDBTypeError(f"{path}: L must be a list")
        return [decode_attribute(member, f"{path}[{index}]") for index, member in enumerate(value)]
    if tag == "SS":
        return _set(value, path, _string)
    if tag == "NS":
        return _set(value, path, _number)
    if tag == "BS":
        return _set(value, path, _binary)
    raise DynamoDBTypeError(f"{path}: unknown type tag {tag!r} (expected one of {', '.join(TYPE_TAGS)})")


def decode_item(item: Any, path: str = "$") -> dict[str, Any]:
    """Decodes a whole item (attribute name -> AttributeValue)."""
    if not isinstance(item, Mapping):
        raise DynamoDBTypeError(f"{path}: an item must be an object")
    return {name: decode_attribute(value, f"{path}.{name}") for name, value in item.items()}


def item_problem(item_json: str | None) -> str | None:
    """Why `item_json` is not a valid DynamoDB item, or None when it is (used as a Spark UDF)."""
    if item_json is None:
        return None
    try:
        decode_item(json.loads(item_json))
    except json.JSONDecodeError as error:
        return f"item is not valid JSON: {error.msg}"
    except DynamoDBTypeError as error:
        return str(error)
    return None


def to_wire(attribute: Mapping[str, Any]) -> dict[str, Any]:
    """boto3's low-level AttributeValue (bytes for B and BS) to JSON-safe DynamoDB JSON."""
    ((tag, value),) = attribute.items()
    if tag == "B":
        return {"B": base64.b64encode(value).decode("ascii") if isinstance(value, (bytes, bytearray)) else value}
    if tag == "BS":
        return {"BS": [base64.b64encode(v).decode("ascii") if isinstance(v, (bytes, bytearray)) else v for v in value]}
    if tag == "M":
        return {"M": item_to_wire(value)}
    if tag == "L":
        return {"L": [to_wire(member) for member in value]}
    return {tag: value}


def item_to_wire(item: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {name: to_wire(value) for name, value in item.items()}
