import base64
import json
from decimal import Decimal

import pytest
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer
from hypothesis import given
from hypothesis import strategies as st

from ddb_athena.lake.dynamodb_json import DynamoDBTypeError, decode_attribute, decode_item, item_problem, item_to_wire


def test_every_type_decodes_exactly():
    item = {
        "s": {"S": "text"},
        "n": {"N": "12345678901234567890123456789012345678"},
        "frac": {"N": "0.1000000000000000000000000000000000001"},
        "b": {"B": base64.b64encode(b"\x00\xffbin").decode()},
        "yes": {"BOOL": True},
        "nothing": {"NULL": True},
        "m": {"M": {"inner": {"N": "-1.5e3"}}},
        "l": {"L": [{"S": "a"}, {"N": "2"}, {"L": []}]},
        "ss": {"SS": ["x", "y"]},
        "ns": {"NS": ["1", "1.50"]},
        "bs": {"BS": [base64.b64encode(b"a").decode(), base64.b64encode(b"b").decode()]},
    }
    decoded = decode_item(item)
    assert decoded["s"] == "text"
    assert decoded["n"] == Decimal("12345678901234567890123456789012345678")  # beyond float and int64
    assert str(decoded["frac"]) == "0.1000000000000000000000000000000000001"
    assert decoded["b"] == b"\x00\xffbin" and isinstance(decoded["b"], bytes)
    assert decoded["yes"] is True and decoded["nothing"] is None
    assert decoded["m"] == {"inner": Decimal("-1500")}
    assert decoded["l"] == ["a", Decimal(2), []]
    assert decoded["ss"] == {"x", "y"} and isinstance(decoded["ss"], set)
    assert decoded["ns"] == {Decimal("1"), Decimal("1.5")}
    assert decoded["bs"] == {b"a", b"b"}


@pytest.mark.parametrize(
    "attribute, message",
    [
        ({"X": "1"}, "unknown DynamoDB type tag"),
        ({"S": "a", "N": "1"}, "exactly one type tag"),
        ({"N": "one"}, "is not a number"),
        ({"N": "NaN"}, "finite"),
        ({"N": 5}, "N must be a string"),
        ({"B": "@@@"}, "not valid base64"),
        ({"BOOL": "true"}, "BOOL must be true or false"),
        ({"NULL": False}, "NULL must be true"),
        ({"SS": []}, "non-empty"),
        ({"L": {"S": "a"}}, "L must be a list"),
        ({"M": {"k": {"Q": 1}}}, "a nested value (depth 2): unknown DynamoDB type tag"),
        ({"L": [{"N": "1"}, {"L": [{"N": "x"}]}]}, "a nested value (depth 3): N is not a number"),
        ({"NS": ["1", "one"]}, "a member of NS is not a number"),
    ],
)
def test_invalid_values_say_what_and_where(attribute, message):
    with pytest.raises(DynamoDBTypeError, match=None) as error:
        decode_attribute(attribute)
    assert message in str(error.value)


def test_item_problem_is_none_for_valid_items_and_a_reason_otherwise():
    assert item_problem(None) is None
    assert item_problem(json.dumps({"id": {"S": "1"}, "tags": {"SS": ["a"]}})) is None
    assert item_problem(json.dumps({"id": {"S": "1"}, "bad": {"Z": "?"}})).startswith("a top-level attribute: unknown DynamoDB type tag")
    assert "not valid JSON" in item_problem("{nope")


# A map's keys and a type tag are the item's data: a secret can sit in either.
SECRET_KEY = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
SECRET_TAG = "ZZ"


@pytest.mark.parametrize(
    "item",
    [
        {"id": {"S": "1"}, "profile": {"M": {SECRET_KEY: {SECRET_TAG: "v"}}}},
        {"id": {"S": "1"}, "profile": {"M": {"outer": {"M": {SECRET_KEY: {"N": "not a number"}}}}}},
        {"id": {"S": "1"}, "profile": {"L": [{"M": {SECRET_KEY: {"SS": []}}}]}},
        {"id": {"S": "1"}, SECRET_KEY: {SECRET_TAG: "v"}},
        {"id": {"S": "1"}, SECRET_KEY: {"N": SECRET_KEY}},
        {"id": {"S": "1"}, "profile": {"M": {SECRET_KEY: {"S": "a", SECRET_TAG: "b"}}}},
    ],
)
def test_a_reason_quotes_no_attribute_name_type_tag_or_value_of_the_item(item):
    """Reasons end up in logs and asset metadata: they say what is wrong and how deep, the raw line says the rest."""
    reason = item_problem(json.dumps(item))
    assert reason is not None
    assert SECRET_KEY not in reason and SECRET_TAG not in reason and "profile" not in reason and "outer" not in reason
    with pytest.raises(DynamoDBTypeError) as error:
        decode_item(item)
    assert SECRET_KEY not in str(error.value) and SECRET_TAG not in str(error.value)


def test_an_unknown_type_tag_is_named_as_such_with_its_depth():
    reason = item_problem(json.dumps({"id": {"S": "1"}, "profile": {"M": {SECRET_KEY: {SECRET_TAG: "v"}}}}))
    assert reason == "a nested value (depth 2): unknown DynamoDB type tag (expected one of S, N, B, BOOL, NULL, M, L, SS, NS, BS)"


def test_wire_encoding_makes_boto3_binary_json_safe_and_round_trips():
    boto3_item = {"b": {"B": b"\x01\x02"}, "bs": {"BS": [b"x"]}, "m": {"M": {"inner": {"B": b"z"}}}, "l": {"L": [{"B": b"q"}]}}
    wire = item_to_wire(boto3_item)
    json.dumps(wire)  # JSON-safe
    assert decode_item(wire) == {"b": b"\x01\x02", "bs": {b"x"}, "m": {"inner": b"z"}, "l": [b"q"]}
    # Lambda events already carry base64 text, which passes through unchanged.
    assert item_to_wire({"b": {"B": "AQI="}}) == {"b": {"B": "AQI="}}


# Python values as boto3 writes them to DynamoDB: numbers within its 38 digits and exponent range, any text, bytes,
# booleans, None, non-empty sets and nested maps and lists.
_numbers = (
    st.decimals(allow_nan=False, allow_infinity=False)
    .map(lambda number: number.normalize())
    .filter(lambda number: not number or (-130 <= number.adjusted() <= 125 and len(number.as_tuple().digits) <= 38))
)
_scalars = st.one_of(st.text(), _numbers, st.binary(), st.booleans(), st.none())
_sets = st.one_of(st.frozensets(st.text(), min_size=1), st.frozensets(_numbers, min_size=1), st.frozensets(st.binary(), min_size=1))
_values = st.recursive(
    st.one_of(_scalars, _sets), lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(), inner, max_size=4)), max_leaves=12
)


def _plain(value):
    """boto3's deserialized values (Binary, sets) as this module's (bytes, sets)."""
    if isinstance(value, Binary):
        return bytes(value)
    if isinstance(value, set | frozenset):
        return {_plain(member) for member in value}
    if isinstance(value, list):
        return [_plain(member) for member in value]
    if isinstance(value, dict):
        return {name: _plain(member) for name, member in value.items()}
    return value


@given(st.dictionaries(st.text(min_size=1), _values, max_size=6))
def test_an_item_boto3_serializes_decodes_exactly_as_boto3_deserializes_it_through_the_wire_json(item):
    serialized = {name: TypeSerializer().serialize(value) for name, value in item.items()}
    wire = json.loads(json.dumps(item_to_wire(serialized)))  # as it is written to a change file and read back
    decoded = decode_item(wire)
    assert decoded == {name: _plain(TypeDeserializer().deserialize(value)) for name, value in serialized.items()}
    assert decoded == _plain({name: set(value) if isinstance(value, frozenset) else value for name, value in item.items()})
    assert item_problem(json.dumps(wire)) is None
