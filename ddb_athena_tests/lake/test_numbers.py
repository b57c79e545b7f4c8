"""DynamoDB numbers in decimal columns: one rule in Python (`table_keys.exact_number`) and in SQL
(`table_spec.exact_decimal_value_sql`), held to a plain model of DynamoDB's numbers (up to 38 significant digits,
magnitudes 1E-130 to 9.9...9E+125, in plain or exponent notation): a column holds a number when it keeps it exactly,
never rounded onto another value (a key onto another key)."""

import random
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from ddb_athena.lake.change_merge import merge_change_files
from ddb_athena.lake.export_load import ExportDataFile, load_export_files
from ddb_athena.lake.table_keys import InvalidKeyError, exact_number, key_value, row_key
from ddb_athena.lake.table_spec import METADATA_UPKEEP_PROPERTIES, ColumnSpec, TableSpec, typed_columns_sql
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeRecord, change_file_name, write_change_file
from ddb_athena_tests.exported.aws_layout import full_line, write_export


def holds_exactly(text: str, precision: int, scale: int) -> bool:
    """The model: a decimal(precision, scale) holds x when x has no digit past `scale` fractional digits and fewer than
    precision - scale integer digits."""
    value = Fraction(text)
    return (value * 10**scale).denominator == 1 and abs(value) < 10 ** (precision - scale)


@st.composite
def dynamodb_numbers(draw) -> str:
    """A DynamoDB number as its text may come: sign or not, a point anywhere or none, an exponent or not, 1 to 38
    significant digits with zeros around them, a magnitude within 1E-130 .. 1E+126."""
    significant = draw(st.from_regex(r"[1-9]([0-9]{0,36}[1-9])?", fullmatch=True))
    leading, trailing = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    digits = "0" * leading + significant + "0" * trailing
    point = draw(st.integers(0, len(digits)))  # the fraction's digits: len(digits) - point
    text = digits[:point] + ("." + digits[point:] if point < len(digits) else draw(st.sampled_from(["", "."])))
    magnitude = draw(st.integers(-130, 125))  # the power of ten of the first significant digit
    # The value is int(digits) x 10^(written - fraction digits), int(digits) = significant x 10^trailing.
    written = magnitude - (len(significant) - 1) - trailing + (len(digits) - point)
    if written or draw(st.booleans()):
        text += draw(st.sampled_from("eE")) + draw(st.sampled_from(["", "+"] if written >= 0 else [""])) + str(written)
    return draw(st.sampled_from(["", "-", "+"])) + text


decimal_types = st.integers(1, 38).flatmap(lambda precision: st.tuples(st.just(precision), st.integers(0, precision)))


def python_verdict(text: str, precision: int, scale: int) -> Decimal | None:
    try:
        return exact_number(text, precision, scale)
    except InvalidKeyError:
        return None


@given(dynamodb_numbers(), decimal_types)
def test_a_number_is_held_exactly_when_the_model_says_so_and_then_as_its_value(text, decimal_type):
    precision, scale = decimal_type
    held = python_verdict(text, precision, scale)
    assert (held is not None) == holds_exactly(text, precision, scale)
    assert held is None or Fraction(held) == Fraction(text)


@given(dynamodb_numbers(), decimal_types)
def test_a_number_key_is_its_value_whatever_its_notation(text, decimal_type):
    """7, 7.0, 0007 and 7E0 are one key (DynamoDB compares numbers by value): the canonical key is the value."""
    column = ColumnSpec("k", "k", "decimal", precision=decimal_type[0], scale=decimal_type[1])
    plain = format(Decimal(text), "f")  # the same value in plain notation
    keys = []
    for written in (text, plain, plain + ".000" if "." not in plain else plain + "000"):
        try:
            keys.append(key_value(column, {"N": written}))
        except InvalidKeyError:
            keys.append(None)
    assert keys[0] == keys[1] == keys[2] and len({hash(key) for key in keys}) == 1


@given(dynamodb_numbers())
def test_the_generated_numbers_are_dynamodbs(text):
    value = abs(Decimal(text))
    assert Decimal("1E-130") <= value < Decimal("1E+126") and len(value.normalize().as_tuple().digits) <= 38


@given(st.text(max_size=12))
def test_text_that_is_not_a_number_in_dynamodbs_notation_is_never_held(text):
    """Python's Decimal reads more than DynamoDB writes (spaces, underscores, NaN, Infinity): none of it is a number
    here, as in the SQL rule."""
    plain = all(character in "0123456789+-.eE" for character in text)
    if not plain or text.strip("+-.eE") == "":
        assert python_verdict(text, 38, 10) is None


# The cases the review found (exponent notation disagreed: 1E-20 became key 0), the edges of the range, and text that
# only looks like a number.
NUMBER_TEXTS = (
    *("7", "7.0", "7.000", "0007", "-0", "+3", ".5", "7.5", "1.", "1E+2", "1.5e1", "1.23E+1", "1e-3", "0E+9999", "0e-9999"),
    *("1E-19", "1E-20", "1E-130", "1.0000000000000000001E0", "1E+20", "1.5E+30", "9.9999999999999999999999999999999999999E+125"),
    *("1" * 38, "1" * 39, "-" + "9" * 38, "1" * 38 + "E-38", "0." + "0" * 37 + "1", "1" * 19 + "." + "1" * 19),
    *("abc", "", " 7", "7 ", "7\n", "7.5\n", "1_000", "NaN", "Infinity", "1e", "e5", ".", "+", "1E+99999", "1..2", "--1", "0x10", "७"),
)
DECIMAL_TYPES = ((38, 0), (10, 2), (38, 18), (38, 38), (5, 5))
DECIMAL_COLUMNS = tuple(ColumnSpec(f"n_{precision}_{scale}", "n", "decimal", precision=precision, scale=scale) for precision, scale in DECIMAL_TYPES)


def random_number_texts(seed: int, count: int) -> list[str]:
    """DynamoDB numbers over the whole range, seeded: the Spark round's cases beside the fixed ones."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        digits = str(rng.randrange(1, 10)) + "".join(rng.choice("0123456789") for _ in range(rng.randrange(0, 38)))
        exponent = rng.randrange(-130, 126) - (len(digits) - 1)
        notation = rng.random()
        if notation < 0.5:
            texts.append(f"{rng.choice(['', '-'])}{digits}E{exponent}")
        else:
            texts.append(f"{rng.choice(['', '-'])}{Decimal(digits).scaleb(exponent):f}")  # plain notation
    return texts


def test_python_and_sql_agree_on_which_numbers_a_decimal_column_holds_exactly_and_as_what(spark):
    texts = list(dict.fromkeys((*NUMBER_TEXTS, *random_number_texts(seed=68, count=400))))
    # Every case in one query (a query each took most of the time), typed by the expression the merge types an image with.
    numbers = {f"number_{index}": text for index, text in enumerate(texts)}
    typed = spark.sql(
        f"SELECT text, {', '.join(typed_columns_sql(DECIMAL_COLUMNS))} FROM (SELECT text, named_struct('n', named_struct('N', text)) AS image "
        f"FROM VALUES {', '.join(f'(:{name})' for name in numbers)} AS numbers(text))",
        args=numbers,
    )
    rows = {row["text"]: row for row in typed.collect()}
    assert rows.keys() == set(texts)
    disagreements = [
        f"{text!r} as {column.sql_type}: SQL {rows[text][column.name]!r}, Python {python_verdict(text, column.precision, column.scale)!r}"
        for text in texts
        for column in DECIMAL_COLUMNS
        if rows[text][column.name] != python_verdict(text, column.precision, column.scale)
    ]
    assert not disagreements, "\n".join(disagreements)
    # The review's cases: refused where they would round, kept where they fit.
    assert rows["1E-20"]["n_38_0"] is None and rows["1E-130"]["n_38_0"] is None and rows["1.0000000000000000001E0"]["n_10_2"] is None
    assert rows["1E+20"]["n_38_0"] == Decimal(10**20) and rows["1.5E+30"]["n_38_0"] == Decimal(15 * 10**29)


# Through the two write paths: numbers over DynamoDB's whole range in a number sort key and two decimal columns, merged
# from change files and loaded from an export, read back by PyIceberg (as Athena reads the table) against the model.
N_KEY, AMOUNT = ColumnSpec("n_key", "n.key", "decimal", scale=2), ColumnSpec("amount", "amount €", "decimal", precision=10, scale=2)
WHOLE = ColumnSpec("whole", "whole", "decimal")
NUMBERS_STREAMED = TableSpec(
    "numbers_stream", key=ColumnSpec("id", "id", "string"), sort_key=N_KEY, columns=(AMOUNT, WHOLE), properties=METADATA_UPKEEP_PROPERTIES
)
CREATED = ColumnSpec("created_at", "created_at", "iso_timestamp", required=True)
NUMBERS_EXPORTED = TableSpec(
    "numbers_export",
    key=ColumnSpec("id", "id", "string"),
    sort_key=N_KEY,
    columns=(AMOUNT, WHOLE, CREATED),
    partition_by=("days(created_at)",),
    properties=METADATA_UPKEEP_PROPERTIES,
    source="export",
)


def number_items(seed: int, count: int) -> tuple[list[dict], dict]:
    """Items whose numbers are drawn over the whole range (a quarter; the others small enough to fit), and the model: each
    item's row by its key when every number fits its column exactly, else none (its change is quarantined)."""
    rng = random.Random(seed)
    wide = iter(random_number_texts(seed, 3 * count))
    fitting = ("0", "-0.50", "7", "7.0E0", "12345678.99", "1E+2", "-3.25", "99999999.99", "5E-2")
    items, model = [], {}
    for index in range(count):
        n_key, amount, whole = (next(wide) if rng.random() < 0.25 else rng.choice(fitting) for _ in range(3))
        item = {"id": {"S": f"i{index}"}, "n.key": {"N": n_key}, "amount €": {"N": amount}, "whole": {"N": whole}}
        item["created_at"] = {"S": "2026-11-22T10:00:00+00:00"}
        items.append(item)
        held = {column.name: python_verdict(text, column.precision, column.scale) for column, text in ((N_KEY, n_key), (AMOUNT, amount), (WHOLE, whole))}
        if None not in held.values():
            model[(f"i{index}", held["n_key"])] = {"id": f"i{index}", **held}
    return items, model


def assert_pyiceberg_reads(settings, spec: TableSpec, table: str, model: dict) -> None:
    from ddb_athena_tests.lake.test_attribute_names import read_by_pyiceberg

    rows = {row_key(spec, row): {name: row[name] for name in ("id", "n_key", "amount", "whole")} for row in read_by_pyiceberg(settings, table)}
    assert rows == model


def test_numbers_over_the_whole_range_reach_the_table_by_both_paths_exactly_or_not_at_all(spark, settings):
    """Issue 68: a number each column holds exactly is its value in the table read by PyIceberg, whatever its
    notation; any other quarantines its change, on the stream path (then updated by a key written otherwise: one row)
    and on the export path alike."""
    items, model = number_items(seed=681, count=80)
    quarantined = len(items) - len(model)
    assert 10 < len(model) < len(items) - 10  # both outcomes are drawn
    s3 = settings.client("s3")
    stream_layout, stream_table = SourceLayout(settings.bucket, "numbers_stream_source"), f"{settings.namespace}.numbers_stream"
    records = []
    for sequence, item in enumerate(items):
        image = {name: value for name, value in item.items() if name != "created_at"}
        keys = {column.attribute: item[column.attribute] for column in NUMBERS_STREAMED.key_columns}
        records.append(ChangeRecord("INSERT", keys, image, str(sequence), "2026-12-01T00:00:00.000000Z", "shard-0"))
    uri = stream_layout.uri(write_change_file(s3, stream_layout, change_file_name(datetime(2026, 12, 1, tzinfo=UTC), "stream"), records), "s3a")
    merged = merge_change_files(spark, NUMBERS_STREAMED, stream_table, [uri], stream_layout.uri(f"{stream_layout.quarantine_prefix}q1", "s3a"))
    assert merged.records_quarantined == quarantined and all("keeps" in reason or "valid" in reason for reason in merged.quarantine_reasons)
    assert_pyiceberg_reads(settings, NUMBERS_STREAMED, stream_table, model)
    # Each kept item again, its key in exponent notation and its amount changed: the same row, by value.
    updates, updated = [], dict(model)
    for sequence, ((item_id, n_key), row) in enumerate(model.items(), start=len(items)):
        written = f"{n_key.normalize():E}"
        keys = {"id": {"S": item_id}, "n.key": {"N": written}}
        image = {**keys, "amount €": {"N": "1.5"}, "whole": {"N": str(row["whole"])}}
        updates.append(ChangeRecord("MODIFY", keys, image, str(sequence), "2026-12-01T00:01:00.000000Z", "shard-0"))
        updated[(item_id, n_key)] = {**row, "amount": Decimal("1.50")}
    uri = stream_layout.uri(write_change_file(s3, stream_layout, change_file_name(datetime(2026, 12, 1, 0, 1, tzinfo=UTC), "stream"), updates), "s3a")
    merged = merge_change_files(spark, NUMBERS_STREAMED, stream_table, [uri], stream_layout.uri(f"{stream_layout.quarantine_prefix}q2", "s3a"))
    assert merged.records_quarantined == 0
    assert_pyiceberg_reads(settings, NUMBERS_STREAMED, stream_table, updated)

    export_layout, export_table = SourceLayout(settings.bucket, "numbers_export_export"), f"{settings.namespace}.numbers_export"
    written = write_export(s3, settings.bucket, export_layout.prefix, [[full_line(item) for item in items]])
    files = [ExportDataFile(export_layout.uri(key, "s3a"), count) for key, count in zip(written["data_files"], written["data_file_items"], strict=True)]
    quarantine = export_layout.uri(f"{export_layout.quarantine_prefix}q", "s3a")
    loaded = load_export_files(spark, NUMBERS_EXPORTED, export_table, files, quarantine, datetime(2026, 11, 23, tzinfo=UTC))
    assert loaded.records_quarantined == quarantined and loaded.rows_inserted == len(model)
    assert_pyiceberg_reads(settings, NUMBERS_EXPORTED, export_table, model)
