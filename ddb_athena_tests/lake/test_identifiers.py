import random

import pytest

from ddb_athena.lake.identifiers import InvalidIdentifierError, dotted_name, qualified_name, quoted_identifier, string_literal, validate_identifier


@pytest.mark.parametrize("name", ["books", "library", "_sequence_number", "t_0a1b", "A" * 128])
def test_plain_identifiers_pass(name):
    assert validate_identifier(name) == name


@pytest.mark.parametrize("name", ["", "1books", "books; DROP TABLE x", "bo-oks", "books.x", "`books`", "bøker", "a b", "A" * 129, None, 7])
def test_anything_else_is_refused(name):
    with pytest.raises(InvalidIdentifierError):
        validate_identifier(name, "table name")


def test_qualified_name_validates_every_part():
    assert qualified_name("library", "books") == "library.books"
    with pytest.raises(InvalidIdentifierError):
        qualified_name("library", "books--")
    with pytest.raises(InvalidIdentifierError):
        qualified_name()


def test_dotted_names_validate_every_part():
    assert dotted_name("library.books") == "library.books"
    with pytest.raises(InvalidIdentifierError):
        dotted_name("library.books; DROP TABLE x")


# Text that could end a literal or an identifier early, or read as an escape: what attribute names and messages hold.
AWKWARD_TEXT = (
    "it's",
    "back\\slash",
    "\\'",
    "'; DROP TABLE x; --",
    "a`b",
    "``",
    "\\u0041",
    "\\n",
    "50\\%_",
    "line\nbreak",
    "Ümlaut ß €",
    "order.id",
    "user-id",
    " ",
    "日本",
)


def test_any_text_is_itself_as_a_string_literal_and_any_name_as_a_quoted_identifier(spark):
    rng = random.Random(68)
    texts = [*AWKWARD_TEXT, *("".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(160, 0x2FFF)))) for _ in range(12)) for _ in range(50))]
    literals = spark.sql("SELECT " + ", ".join(f"{string_literal(text)} AS v{index}" for index, text in enumerate(texts))).collect()[0]
    assert [literals[f"v{index}"] for index in range(len(texts))] == texts
    # A struct whose fields are those names, each read back by its quoted name.
    fields = ", ".join(f"{string_literal(text)}, {index}" for index, text in enumerate(texts))
    names = spark.sql(
        "SELECT " + ", ".join(f"s.{quoted_identifier(text)} AS n{index}" for index, text in enumerate(texts)) + f" FROM (SELECT named_struct({fields}) AS s)"
    )
    assert list(names.collect()[0]) == list(range(len(texts)))


def test_nothing_but_text_is_a_string_literal_and_no_empty_name_an_identifier():
    with pytest.raises(InvalidIdentifierError):
        string_literal(None)
    with pytest.raises(InvalidIdentifierError):
        quoted_identifier("")
