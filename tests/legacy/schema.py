"""Describe an SQLite database semantically, so that two schemas can be compared for equality.

`schema_snapshot` returns plain dicts, tuples and strings: equal snapshots mean the same
tables, columns (type, default, NOT NULL, primary-key position), foreign keys, indexes
(uniqueness, key columns in order with DESC and collation, partial WHERE clause), virtual
tables, views and triggers. What it deliberately ignores, because SQLite behaves the same
either way:

- column order (a long-lived legacy store has its newer columns at the end);
- whitespace, letter case outside string literals, identifier quoting, `IF NOT EXISTS`
  and a trailing `;` in stored SQL; outer parentheses of a DEFAULT (`0` equals `(0)`);
- quoting of simple option values in virtual-table arguments (`tokenize='trigram'` equals
  `tokenize="trigram"` equals `tokenize=trigram`);
- the NOT NULL flag of a rowid alias (`INTEGER PRIMARY KEY` on a rowid table), which can
  never hold NULL whether declared NOT NULL or not (SQLite assigns a rowid);
- names of automatic indexes (`sqlite_autoindex_*`): a UNIQUE constraint is listed by its
  columns, a PRIMARY KEY by the columns' `pk` positions;
- `sqlite_*` internal tables, `alembic_version`, and the shadow tables of virtual tables
  (`<vtab>_data`, `_idx`, `_docsize`, `_config`, `_content`; whether `_content` exists
  follows from the virtual table's declaration, which is compared).

A DEFAULT is compared as written, apart from the normalisation above: `DEFAULT '0'` (a text
literal, what SQLAlchemy renders for `server_default="0"`) differs from `DEFAULT 0`.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ConnOrPath",
    "diff_snapshots",
    "normalise_sql",
    "schema_snapshot",
    "table_data",
]

#: Tables that are not part of the store's schema.
IGNORED_TABLES = frozenset({"alembic_version"})

#: Suffixes of FTS5 shadow tables, ignored when the prefix is a virtual table.
SHADOW_SUFFIXES = ("_data", "_idx", "_docsize", "_config", "_content")


@runtime_checkable
class _SQLAlchemyConnection(Protocol):
    """The part of `sqlalchemy.engine.Connection` used here (duck-typed, no import)."""

    def exec_driver_sql(self, statement: str) -> Any: ...


@runtime_checkable
class _SQLAlchemyEngine(Protocol):
    """The part of `sqlalchemy.engine.Engine` used here (duck-typed, no import)."""

    def raw_connection(self) -> Any: ...


ConnOrPath = sqlite3.Connection | str | os.PathLike[str] | _SQLAlchemyConnection | _SQLAlchemyEngine


@contextmanager
def _connection(conn_or_path: ConnOrPath) -> Iterator[sqlite3.Connection]:
    """A stdlib connection for a connection, a path, or a SQLAlchemy connection or engine."""
    if isinstance(conn_or_path, sqlite3.Connection):
        yield conn_or_path
    elif isinstance(conn_or_path, str | os.PathLike):
        path = Path(conn_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"no database at {path}")
        conn = sqlite3.connect(path)
        try:
            yield conn
        finally:
            conn.close()
    elif isinstance(conn_or_path, _SQLAlchemyConnection):
        raw = conn_or_path.connection.driver_connection  # type: ignore[attr-defined]
        if not isinstance(raw, sqlite3.Connection):
            raise TypeError(f"not a stdlib sqlite3 connection underneath: {raw!r}")
        yield raw
    elif isinstance(conn_or_path, _SQLAlchemyEngine):
        pooled = conn_or_path.raw_connection()
        try:
            raw = pooled.driver_connection
            if not isinstance(raw, sqlite3.Connection):
                raise TypeError(f"not a stdlib sqlite3 connection underneath: {raw!r}")
            yield raw
        finally:
            pooled.close()
    else:
        raise TypeError(f"expected a connection, engine or path, got {conn_or_path!r}")


# --------------------------------------------------------------------------------------------
# SQL text normalisation
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|--[^\n]*|/\*.*?\*/)
    |(?P<str>'(?:[^']|'')*')
    |(?P<qid>"(?:[^"]|"")*"|`(?:[^`]|``)*`|\[[^\]]*\])
    |(?P<word>[\w$]+)
    |(?P<op>\|\||<=|>=|<>|!=|==|<<|>>|.)
    """,
    re.VERBOSE | re.DOTALL,
)
_SIMPLE_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_WORDISH = frozenset({"word", "str", "qid"})

Token = tuple[str, str, bool]  # (kind, text, whitespace before it)


def _tokenize(sql: str) -> list[Token]:
    """Split SQL into tokens, dropping whitespace and comments but remembering them."""
    tokens: list[Token] = []
    spaced = False
    for match in _TOKEN.finditer(sql):
        kind = match.lastgroup or "op"
        if kind == "ws":
            spaced = True
            continue
        tokens.append((kind, match.group(), spaced))
        spaced = False
    return tokens


def _unquote(text: str) -> str:
    """The content of a quoted identifier or string literal."""
    if text[0] == "[":
        return text[1:-1]
    quote = text[0]
    return text[1:-1].replace(quote * 2, quote)


def _render(tokens: list[Token], *, unquote_strings: bool = False) -> str:
    """Canonical text: one space only between two word-like tokens, case folded outside
    string literals, identifiers unquoted when simple (string literals too if asked)."""
    out: list[str] = []
    previous_kind = ""
    for kind, text, spaced in tokens:
        if kind == "word":
            rendered = text.lower()
        elif kind == "qid" or (kind == "str" and unquote_strings):
            content = _unquote(text)
            if _SIMPLE_IDENTIFIER.match(content):
                rendered = content.lower()
            elif kind == "qid":
                rendered = '"' + content.replace('"', '""') + '"'
            else:
                rendered = "'" + content.replace("'", "''") + "'"
        else:
            rendered = text
        if out and spaced and kind in _WORDISH and previous_kind in _WORDISH:
            out.append(" ")
        out.append(rendered)
        previous_kind = kind
    return "".join(out)


def _strip_statement(tokens: list[Token]) -> list[Token]:
    """Drop `IF NOT EXISTS` after `CREATE ... <object>` and any trailing `;`."""
    words = [text.lower() if kind == "word" else None for kind, text, _ in tokens]
    for start in range(min(len(tokens) - 2, 6)):
        if words[start : start + 3] == ["if", "not", "exists"]:
            tokens = tokens[:start] + tokens[start + 3 :]
            break
    while tokens and tokens[-1][:2] == ("op", ";"):
        tokens = tokens[:-1]
    return tokens


def normalise_sql(sql: str, *, unquote_strings: bool = False) -> str:
    """Canonical form of a CREATE statement for comparison (see the module docstring)."""
    return _render(_strip_statement(_tokenize(sql)), unquote_strings=unquote_strings)


def _matching_paren(tokens: list[Token], open_at: int) -> int:
    """Index of the `)` closing the `(` at `open_at`, or -1."""
    depth = 0
    for index in range(open_at, len(tokens)):
        kind, text, _ = tokens[index]
        if kind == "op" and text == "(":
            depth += 1
        elif kind == "op" and text == ")":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _normalise_default(default: str | None) -> str | None:
    """A column default without outer parentheses, whitespace or case differences."""
    if default is None:
        return None
    tokens = _tokenize(default)
    while tokens and tokens[0][:2] == ("op", "(") and _matching_paren(tokens, 0) == len(tokens) - 1:
        tokens = tokens[1:-1]
    return _render(tokens)


def _normalise_type(declared: str) -> str:
    """A declared column type, upper case, whitespace normalised."""
    return _render(_tokenize(declared)).upper()


def _partial_where(index_sql: str) -> str | None:
    """The normalised WHERE clause of a CREATE INDEX statement, or None."""
    tokens = _strip_statement(_tokenize(index_sql))
    for index, (kind, text, _) in enumerate(tokens):
        if kind == "op" and text == "(":
            close = _matching_paren(tokens, index)
            rest = tokens[close + 1 :] if close >= 0 else []
            if rest and rest[0][0] == "word" and rest[0][1].lower() == "where":
                return _render(rest[1:])
            return None
    return None


def _leading_words(sql: str, count: int) -> list[str]:
    """The first `count` tokens of a statement, lower case."""
    return [text.lower() for _kind, text, _ in _tokenize(sql)[:count]]


def _has_words(sql: str, *words: str) -> bool:
    """Whether the bare words appear consecutively in the statement (outside literals)."""
    found = [text.lower() for kind, text, _ in _tokenize(sql) if kind == "word"]
    wanted = [word.lower() for word in words]
    return any(found[i : i + len(wanted)] == wanted for i in range(len(found)))


# --------------------------------------------------------------------------------------------
# Snapshot
# --------------------------------------------------------------------------------------------


def _quote(name: str) -> str:
    """Quote an identifier for a PRAGMA argument or a FROM clause."""
    return '"' + name.replace('"', '""') + '"'


def _primary_key(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    """The primary-key columns of `table`, in key order."""
    rows = conn.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
    return tuple(row[1].lower() for row in sorted(rows, key=lambda row: row[5]) if row[5])


def _columns(
    conn: sqlite3.Connection, table: str, *, without_rowid: bool
) -> dict[str, dict[str, Any]]:
    """Columns by name: declared type, default, NOT NULL and primary-key position."""
    rows = conn.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
    pk_rows = [row for row in rows if row[5]]
    columns: dict[str, dict[str, Any]] = {}
    for _cid, name, declared, notnull, default, pk in rows:
        column_type = _normalise_type(declared or "")
        rowid_alias = not without_rowid and len(pk_rows) == 1 and pk and column_type == "INTEGER"
        columns[name.lower()] = {
            "type": column_type,
            "default": _normalise_default(default),
            "notnull": bool(notnull) or bool(rowid_alias),
            "pk": int(pk),
        }
    return columns


def _foreign_keys(conn: sqlite3.Connection, table: str) -> tuple[tuple[Any, ...], ...]:
    """Foreign keys as (parent table, child columns, parent columns, ON UPDATE, ON DELETE)."""
    rows = conn.execute(f"PRAGMA foreign_key_list({_quote(table)})").fetchall()
    grouped: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    keys: list[tuple[Any, ...]] = []
    for parts in grouped.values():
        parts.sort(key=lambda row: row[1])
        parent = parts[0][2]
        child_columns = tuple(row[3].lower() for row in parts)
        if any(row[4] is None for row in parts):
            parent_columns = _primary_key(conn, parent)  # `REFERENCES parent` without columns
        else:
            parent_columns = tuple(row[4].lower() for row in parts)
        keys.append(
            (
                parent.lower(),
                child_columns,
                parent_columns,
                parts[0][5].upper(),
                parts[0][6].upper(),
            )
        )
    return tuple(sorted(keys))


def _index_columns(conn: sqlite3.Connection, index: str) -> tuple[tuple[str, ...], bool]:
    """Key columns of an index (`name [DESC] [COLLATE x]`) and whether any is an expression."""
    rows = conn.execute(f"PRAGMA index_xinfo({_quote(index)})").fetchall()
    columns: list[str] = []
    has_expression = False
    for _seqno, _cid, name, is_desc, collation, is_key in sorted(rows):
        if not is_key:
            continue
        if name is None:
            has_expression = True
        text = "<expression>" if name is None else name.lower()
        if is_desc:
            text += " DESC"
        if collation and collation.upper() != "BINARY":
            text += f" COLLATE {collation.upper()}"
        columns.append(text)
    return tuple(columns), has_expression


def _indexes(
    conn: sqlite3.Connection, table: str, index_sql: dict[str, str | None]
) -> tuple[dict[str, dict[str, Any]], tuple[tuple[str, ...], ...]]:
    """Explicit indexes by name, and UNIQUE constraints as column tuples."""
    explicit: dict[str, dict[str, Any]] = {}
    unique_constraints: list[tuple[str, ...]] = []
    for _seq, name, unique, origin, partial in conn.execute(
        f"PRAGMA index_list({_quote(table)})"
    ).fetchall():
        if origin == "pk":
            continue
        columns, has_expression = _index_columns(conn, name)
        if origin == "u":
            unique_constraints.append(columns)
            continue
        sql = index_sql.get(name) or ""
        entry: dict[str, Any] = {
            "unique": bool(unique),
            "columns": columns,
            "where": _partial_where(sql) if partial else None,
        }
        if has_expression:
            entry["sql"] = normalise_sql(sql)
        explicit[name.lower()] = entry
    return explicit, tuple(sorted(unique_constraints))


def schema_snapshot(conn_or_path: ConnOrPath) -> dict[str, Any]:
    """A semantic description of a database's schema; equal dicts mean equivalent schemas.

    Keys: `tables` (name -> columns, foreign_keys, indexes, unique_constraints,
    autoincrement, without_rowid), `virtual_tables` (name -> normalised CREATE), `views`
    (name -> normalised CREATE), `triggers` (name -> table and normalised CREATE).
    """
    with _connection(conn_or_path) as conn:
        master = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
        virtual = {
            name.lower(): sql
            for kind, name, _tbl, sql in master
            if kind == "table" and sql and _leading_words(sql, 3) == ["create", "virtual", "table"]
        }
        shadow = {f"{vtab}{suffix}" for vtab in virtual for suffix in SHADOW_SUFFIXES}
        index_sql = {name: sql for kind, name, _tbl, sql in master if kind == "index"}

        tables: dict[str, dict[str, Any]] = {}
        for kind, name, _tbl, sql in master:
            lowered = name.lower()
            if (
                kind != "table"
                or lowered.startswith("sqlite_")
                or lowered in IGNORED_TABLES
                or lowered in virtual
                or lowered in shadow
            ):
                continue
            without_rowid = _has_words(sql or "", "without", "rowid")
            indexes, unique_constraints = _indexes(conn, name, index_sql)
            tables[lowered] = {
                "columns": _columns(conn, name, without_rowid=without_rowid),
                "foreign_keys": _foreign_keys(conn, name),
                "indexes": indexes,
                "unique_constraints": unique_constraints,
                "autoincrement": _has_words(sql or "", "autoincrement"),
                "without_rowid": without_rowid,
            }

        return {
            "tables": tables,
            "virtual_tables": {
                name: normalise_sql(sql, unquote_strings=True) for name, sql in virtual.items()
            },
            "views": {
                name.lower(): normalise_sql(sql or "")
                for kind, name, _tbl, sql in master
                if kind == "view"
            },
            "triggers": {
                name.lower(): {"table": tbl.lower(), "sql": normalise_sql(sql or "")}
                for kind, name, tbl, sql in master
                if kind == "trigger"
            },
        }


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def _sort_key(value: Any) -> tuple[int, Any]:
    """Order values of mixed SQLite storage classes: NULL, numbers, text, blobs."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, bytes(value))


def table_data(conn_or_path: ConnOrPath, table: str) -> list[dict[str, Any]]:
    """Every row of `table` as a dict (column name -> value), sorted, column order ignored."""
    with _connection(conn_or_path) as conn:
        cursor = conn.execute(f"SELECT * FROM {_quote(table)}")
        names = [description[0] for description in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    ordered = sorted(names)
    return sorted(rows, key=lambda row: tuple(_sort_key(row[name]) for name in ordered))


# --------------------------------------------------------------------------------------------
# Diff
# --------------------------------------------------------------------------------------------

#: Snapshot entries that are sets stored as sorted tuples: diffed member by member.
_SET_LIKE = frozenset({"foreign_keys", "unique_constraints"})


def _short(value: Any, limit: int = 300) -> str:
    """`repr` cut to a readable length; a whole table is summarised by its column names."""
    if isinstance(value, dict) and isinstance(value.get("columns"), dict):
        text = f"table with columns {', '.join(sorted(value['columns']))}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _diff(path: str, a: Any, b: Any, labels: tuple[str, str], out: list[str]) -> None:
    """Append one line per difference between `a` and `b` under `path`."""
    if a == b:
        return
    left, right = labels
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in b:
                out.append(f"{where}: only in {left}: {_short(a[key])}")
            elif key not in a:
                out.append(f"{where}: only in {right}: {_short(b[key])}")
            else:
                _diff(where, a[key], b[key], labels, out)
        return
    if isinstance(a, tuple) and isinstance(b, tuple) and path.rsplit(".", 1)[-1] in _SET_LIKE:
        for item in a:
            if item not in b:
                out.append(f"{path}: only in {left}: {_short(item)}")
        for item in b:
            if item not in a:
                out.append(f"{path}: only in {right}: {_short(item)}")
        return
    out.append(f"{path}: {left}={_short(a)} {right}={_short(b)}")


def diff_snapshots(
    a: dict[str, Any], b: dict[str, Any], labels: tuple[str, str] = ("a", "b")
) -> str:
    """Readable differences between two snapshots, one per line; empty when they are equal."""
    out: list[str] = []
    _diff("", a, b, labels, out)
    return "\n".join(out)
