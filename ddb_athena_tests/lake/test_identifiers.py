import pytest

from ddb_athena.lake.identifiers import InvalidIdentifierError, dotted_name, qualified_name, string_literal, validate_identifier


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


def test_string_literals_are_quoted():
    assert string_literal("struct<`id`: struct<`S`: string>>") == "'struct<`id`: struct<`S`: string>>'"


@pytest.mark.parametrize("value", ["it's", "back\\slash", None])
def test_string_literals_that_could_end_early_are_refused(value):
    with pytest.raises(InvalidIdentifierError):
        string_literal(value)
