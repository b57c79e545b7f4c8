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
    """An attribute value is not valid DynamoDB JSON. The message holds no item data (see _where)."""


def _where(depth: int) -> str:
    """Where in the item a problem is, by depth alone. Attribute names and type tags are item data (a map's keys can
    be anything, a secret too), and a reason ends up in logs and asset metadata: it never quotes them. The
    quarantined record keeps the raw line for whoever fixes it."""
    if depth == 0:
        return "the item"
    if depth == 1:
        return "a top-level attribute"
    return f"a nested value (depth {depth})"


def _number(text: Any, depth: int, label: str = "N") -> Decimal:
    if not isinstance(text, str):
        raise DynamoDBTypeError(f"{_where(depth)}: {label} must be a string, got {type(text).__name__}")
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise DynamoDBTypeError(f"{_where(depth)}: {label} is not a number") from None
    if not number.is_finite():
        raise DynamoDBTypeError(f"{_where(depth)}: {label} is not a finite number")
    return number


def _binary(value: Any, depth: int, label: str = "B") -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise DynamoDBTypeError(f"{_where(depth)}: {label} must be base64 text, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise DynamoDBTypeError(f"{_where(depth)}: {label} is not valid base64") from None


def _string(value: Any, depth: int, label: str = "S") -> str:
    if not isinstance(value, str):
        raise DynamoDBTypeError(f"{_where(depth)}: {label} must be a string, got {type(value).__name__}")
    return value


def _set(values: Any, depth: int, tag: str, decode_member) -> set:
    if not isinstance(values, list) or not values:
        raise DynamoDBTypeError(f"{_where(depth)}: {tag} must be a non-empty list")
    return {decode_member(member, depth, f"a member of {tag}") for member in values}


def decode_attribute(attribute: Any, depth: int = 1) -> Any:
    """Decodes one AttributeValue (`{"N": "1.5"}`) to its exact Python value; `depth` 1 is a top-level attribute's."""
    if not isinstance(attribute, Mapping) or len(attribute) != 1:
        raise DynamoDBTypeError(f"{_where(depth)}: an attribute value is an object with exactly one type tag")
    ((tag, value),) = attribute.items()
    if tag == "S":
        return _string(value, depth)
    if tag == "N":
        return _number(value, depth)
    if tag == "B":
        return _binary(value, depth)
    if tag == "BOOL":
        if not isinstance(value, bool):
            raise DynamoDBTypeError(f"{_where(depth)}: BOOL must be true or false")
        return value
    if tag == "NULL":
        if value is not True:
            raise DynamoDBTypeError(f"{_where(depth)}: NULL must be true")
        return None
    if tag == "M":
        return decode_item(value, depth)
    if tag == "L":
        if not isinstance(value, list):
            raise DynamoDBTypeError(f"{_where(depth)}: L must be a list")
        return [decode_attribute(member, depth + 1) for member in value]
    if tag == "SS":
        return _set(value, depth, tag, _string)
    if tag == "NS":
        return _set(value, depth, tag, _number)
    if tag == "BS":
        return _set(value, depth, tag, _binary)
    raise DynamoDBTypeError(f"{_where(depth)}: unknown DynamoDB type tag (expected one of {', '.join(TYPE_TAGS)})")


def decode_item(item: Any, depth: int = 0) -> dict[str, Any]:
    """Decodes a whole item (attribute name -> AttributeValue), or at `depth` the map of an M attribute."""
    if not isinstance(item, Mapping):
        raise DynamoDBTypeError("the item must be an object" if depth == 0 else f"{_where(depth)}: M must be an object")
    return {name: decode_attribute(value, depth + 1) for name, value in item.items()}


def item_problem(item_json: str | None) -> str | None:
    """Why `item_json` is not a valid DynamoDB item, or None when it is (used as a Spark UDF). The reason holds no
    item data: it is logged and recorded as metadata."""
    if item_json is None:
        return None
    try:
        decode_item(json.loads(item_json))
    except json.JSONDecodeError:
        # Without the parser's message: some of its messages quote a character of the text.
        return "item is not valid JSON"
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
