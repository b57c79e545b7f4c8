"""Quarantine reasons go to logs and asset metadata, where no item data may go; the quarantined record keeps the raw line."""

import json

import pytest

from ddb_athena_tests.lake.helpers import ChangeFiles, change

# A map's keys and a type tag are the item's data: a secret can sit in either.
SECRET_KEY = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
SECRET_TAG = "ZZ"


@pytest.fixture
def files(spark, settings) -> ChangeFiles:
    return ChangeFiles(spark, settings)


def test_reasons_of_records_with_a_nested_secret_key_or_an_unknown_type_tag_quote_neither(files):
    files.write(
        change(1, "nested-tag", "INSERT", profile={"M": {SECRET_KEY: {SECRET_TAG: "v"}}}),
        change(2, "nested-number", "INSERT", profile={"M": {"outer": {"M": {SECRET_KEY: {"N": "not a number"}}}}}),
        change(3, "top-level-tag", "INSERT", **{SECRET_KEY: {SECRET_TAG: "v"}}),
        change(4, "good", "INSERT"),
    )
    result = files.merge()
    assert set(files.names()) == {"good"} and result.records_quarantined == 3

    # What the cycle logs and the quarantine check records as metadata.
    reasons = list(result.quarantine_reasons) + [record["reason"] for record in files.quarantined()]
    assert reasons and not [reason for reason in reasons if SECRET_KEY in reason or SECRET_TAG in reason or "profile" in reason]
    assert set(result.quarantine_reasons) == {
        "a nested value (depth 2): unknown DynamoDB type tag (expected one of S, N, B, BOOL, NULL, M, L, SS, NS, BS)",
        "a nested value (depth 3): N is not a number",
        "a top-level attribute: unknown DynamoDB type tag (expected one of S, N, B, BOOL, NULL, M, L, SS, NS, BS)",
    }
    # The operator who fixes the records reads them whole in the quarantine.
    lines = [json.loads(record["line"]) for record in files.quarantined()]
    assert {line["keys"]["id"]["S"] for line in lines} == {"nested-tag", "nested-number", "top-level-tag"}
    assert all(SECRET_KEY in json.dumps(line) for line in lines)
