"""Validation of every name that reaches SQL: tables, columns, namespaces, catalogs."""

import re

# Glue, Athena and Spark all accept this subset; anything else is refused rather than quoted.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class InvalidIdentifierError(ValueError):
    """A name that would reach SQL is not a plain identifier."""


def validate_identifier(name: str, kind: str = "identifier") -> str:
    """Returns `name` if it is a plain SQL identifier, otherwise raises InvalidIdentifierError."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise InvalidIdentifierError(
            f"{kind} {name!r} is not allowed: use letters, digits and underscores, starting with a letter or underscore, at most 128 characters"
        )
    return name


def qualified_name(*parts: str) -> str:
    """`catalog.namespace.table` (or any prefix of it), every part validated."""
    if not parts:
        raise InvalidIdentifierError("an empty qualified name is not allowed")
    return ".".join(validate_identifier(part) for part in parts)


def dotted_name(name: str) -> str:
    """A dotted name (`library.books`) with every part validated."""
    return qualified_name(*name.split("."))


def quoted_identifier(name: str) -> str:
    """Any name, a DynamoDB attribute's (dashes, dots, spaces, quotes, any UTF-8), as a Spark SQL quoted identifier: in
    backticks, a backtick in it doubled. For names that are read, never for the names of what SQL creates."""
    if not isinstance(name, str) or not name:
        raise InvalidIdentifierError(f"{name!r} cannot be a quoted identifier: a non-empty name is needed")
    return "`" + name.replace("`", "``") + "`"


def string_literal(value: str) -> str:
    """Any text as a Spark SQL string literal: a backslash and a quote escaped with a backslash (Spark's parser reads
    `\\` as one backslash, `\\'` as a quote, and nothing else in the text as an escape once every backslash is)."""
    if not isinstance(value, str):
        raise InvalidIdentifierError(f"{value!r} cannot be a SQL string literal: not text")
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
