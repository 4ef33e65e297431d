"""What a PostgreSQL store needs kept up between writes: planner statistics and GIN
pending lists (see docs/operations.md, "PostgreSQL maintenance").

A GIN index with ``fastupdate`` on (PostgreSQL's default) puts new entries in an unsorted
pending list that every search through the index reads whole; VACUUM, an autovacuum
ANALYZE or ``gin_clean_pending_list`` moves them into the index proper. Without
statistics (ANALYZE never ran) the planner guesses at row counts and may read every
message for a trigram search instead of using its index. With autovacuum off, or before
it comes round, nothing but `optimize` (and the end of a `copy`) keeps either in order.

Measuring a pending list exactly needs the ``pgstattuple`` extension (``pgstatginindex``,
which its installer grants to ``pg_stat_scan_tables``): PostgreSQL offers no catalog view
of it, and reading the index's metapage (``pageinspect``) takes a superuser. Without it
the check estimates it from the pages a search for a key the index does not hold reads
(:func:`estimate_pending_pages`); an index it cannot estimate is said to be not measured,
with how many rows were written since the last vacuum, an upper bound of what can be
pending.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

#: A pending list over this many bytes is reported by `check` (a quarter of PostgreSQL's
#: default gin_pending_list_limit of 4 MB): each search then reads and rechecks more than
#: a megabyte of unsorted entries before it uses the index proper.
PENDING_LIST_BYTES = 1 << 20
#: A table with at least this many rows and no statistics is reported by `check`; below
#: it, reading the whole table costs about what its index would.
STATISTICS_ROWS = 1000
#: The extension whose pgstatginindex reads a GIN index's pending list.
PGSTATTUPLE = "pgstattuple"


@dataclass(frozen=True)
class Pending:
    """One GIN index's pending list: pages, and the rows whose entries wait in it."""

    pages: int
    rows: int


def gin_indexes(conn: Connection, tables: Sequence[str]) -> list[tuple[str, str]]:
    """(index, table) of each valid GIN index on the given tables of the current schema."""
    rows = conn.execute(
        text(
            "SELECT i.relname, t.relname FROM pg_index x"
            " JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid"
            " JOIN pg_am am ON am.oid = i.relam"
            " WHERE am.amname = 'gin' AND x.indisvalid"
            " AND t.relnamespace = current_schema()::regnamespace"
            " AND t.relname = ANY(:tables) ORDER BY i.relname"
        ),
        {"tables": list(tables)},
    )
    return [(str(index), str(table)) for index, table in rows]


def _extension_schema(conn: Connection, name: str) -> str | None:
    found = conn.execute(
        text("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = :n"),
        {"n": name},
    ).scalar()
    return None if found is None else str(found)


def _first_line(exc: DBAPIError) -> str:
    lines = str(getattr(exc, "orig", exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _guarded(conn: Connection) -> contextlib.AbstractContextManager[object]:
    """A savepoint for a statement the server may refuse, so that a transaction goes on;
    nothing on an autocommit connection (each statement is its own transaction there)."""
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return contextlib.nullcontext()
    return conn.begin_nested()


def pending_lists(conn: Connection, indexes: Sequence[str]) -> dict[str, Pending] | str:
    """Each index's pending list, read with pgstattuple's pgstatginindex; or, when it
    cannot be read, why (one line). Read-only."""
    schema = _extension_schema(conn, PGSTATTUPLE)
    if schema is None:
        return (
            f"the {PGSTATTUPLE} extension is not installed in this database (CREATE "
            f"EXTENSION {PGSTATTUPLE} lets check measure them)"
        )
    found: dict[str, Pending] = {}
    for name in indexes:
        try:
            with _guarded(conn):
                pages, rows = conn.execute(
                    text(
                        f"SELECT pending_pages, pending_tuples FROM "
                        f'"{schema}".pgstatginindex(CAST(:name AS regclass))'
                    ),
                    {"name": name},
                ).one()
        except DBAPIError as exc:  # typically: EXECUTE not granted to this role
            return (
                f"{PGSTATTUPLE}'s pgstatginindex refused ({_first_line(exc)}); a role granted "
                "pg_stat_scan_tables can read them"
            )
        found[name] = Pending(int(pages or 0), int(rows or 0))
    return found


#: What a search for a word no index holds looks for, by the index's operator class; the
#: pages its Bitmap Index Scan reads are the metapage, one path down the entry tree per
#: key, and the whole pending list.
_NO_MATCH = {
    "tsvector_ops": "@@ CAST('hermesnomatchqzx' AS tsquery)",
    "gin_trgm_ops": "LIKE '%qzx%'",
}
#: Pages of that read that are not the pending list: the metapage and up to four levels
#: of the entry tree (one key each).
_NOT_PENDING = 5


def estimate_pending_pages(conn: Connection, name: str) -> int | None:
    """About how many pages ``name``'s pending list holds, without an extension or a
    superuser: the pages EXPLAIN (ANALYZE, BUFFERS) counts for a search of a key the index
    does not hold (it reads the whole pending list), less the metapage and entry tree
    path. None when the index's operator class has no such search here. Read-only; the
    planner settings it changes are rolled back with its savepoint."""
    row = conn.execute(
        text(
            "SELECT t.relname, pg_get_indexdef(x.indexrelid, 1, true), opc.opcname"
            " FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " JOIN pg_class t ON t.oid = x.indrelid JOIN pg_opclass opc ON opc.oid = x.indclass[0]"
            " WHERE x.indexrelid = CAST(:name AS regclass) AND x.indnatts = 1"
        ),
        {"name": name},
    ).first()
    if row is None or str(row[2]) not in _NO_MATCH:
        return None
    table, expression, opclass = str(row[0]), str(row[1]), str(row[2])
    savepoint = conn.begin_nested()
    try:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = conn.execute(
            text(
                f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT 1 FROM "{table}"'
                f" WHERE {expression} {_NO_MATCH[opclass]}"
            )
        ).scalar_one()
    except DBAPIError:
        return None
    finally:
        savepoint.rollback()
    node = _index_scan(plan[0]["Plan"] if isinstance(plan, list) else {}, name)
    if node is None:
        return None
    read = int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
    return max(0, read - _NOT_PENDING)


def _index_scan(node: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The Bitmap Index Scan of index ``name`` in a JSON plan."""
    if node.get("Node Type") == "Bitmap Index Scan" and node.get("Index Name") == name:
        return node
    for child in node.get("Plans", []):
        found = _index_scan(child, name)
        if found is not None:
            return found
    return None


def block_size(conn: Connection) -> int:
    """The server's page size in bytes (8192 unless it was built otherwise)."""
    return int(conn.execute(text("SELECT current_setting('block_size')::int")).scalar_one())


def too_long(pending: Pending, page_bytes: int) -> bool:
    """Whether a pending list is past :data:`PENDING_LIST_BYTES`."""
    return pending.pages * page_bytes > PENDING_LIST_BYTES


def written_since_vacuum(conn: Connection, tables: Sequence[str]) -> dict[str, int]:
    """Rows inserted into each table since its last vacuum (the server's counters)."""
    rows = conn.execute(
        text(
            "SELECT relname, n_ins_since_vacuum FROM pg_stat_user_tables"
            " WHERE schemaname = current_schema() AND relname = ANY(:tables)"
        ),
        {"tables": list(tables)},
    )
    return {str(name): int(count or 0) for name, count in rows}


def statistics_problem(conn: Connection, table: str) -> str | None:
    """Why the planner's statistics of ``table`` are missing or stale, or None.

    Missing: the table holds at least :data:`STATISTICS_ROWS` rows and pg_stats has no
    column of it (ANALYZE never ran since its rows were written). Stale: more rows changed
    since the last ANALYZE than it counted then (and at least :data:`STATISTICS_ROWS`).
    """
    held = int(
        conn.execute(
            text(f'SELECT count(*) FROM (SELECT 1 FROM "{table}" LIMIT :n) AS held'),
            {"n": STATISTICS_ROWS},
        ).scalar_one()
    )
    if held < STATISTICS_ROWS:
        return None
    analyzed = conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = current_schema()"
            " AND tablename = :t)"
        ),
        {"t": table},
    ).scalar_one()
    fix = "run `hermes-store optimize`"
    if not analyzed:
        return (
            f"no planner statistics, with {STATISTICS_ROWS:,} rows or more (ANALYZE never "
            f"ran on them): searches may read every row; {fix}"
        )
    row = conn.execute(
        text(
            "SELECT s.n_mod_since_analyze, c.reltuples FROM pg_stat_user_tables s"
            " JOIN pg_class c ON c.oid = s.relid"
            " WHERE s.schemaname = current_schema() AND s.relname = :t"
        ),
        {"t": table},
    ).first()
    if row is None:
        return None
    changed, counted = int(row[0] or 0), max(int(row[1] or 0), 0)
    if changed >= STATISTICS_ROWS and changed > counted:
        return (
            f"stale planner statistics: {changed:,} rows changed since the last ANALYZE, "
            f"which counted {counted:,}; {fix}"
        )
    return None


def clean_pending_lists(
    auto: Connection, indexes: Sequence[str]
) -> tuple[dict[str, int], dict[str, int] | None, dict[str, str]]:
    """gin_clean_pending_list on each index (an autocommit connection): the pages it
    removed from each, the rows they held (None when pgstattuple cannot tell), and the
    indexes the server refused to clean, with its reason (it takes the index's owner)."""
    before = pending_lists(auto, indexes)
    rows = None if isinstance(before, str) else {n: p.rows for n, p in before.items()}
    pages: dict[str, int] = {}
    refused: dict[str, str] = {}
    for name in indexes:
        try:
            removed = auto.execute(
                text("SELECT gin_clean_pending_list(CAST(:name AS regclass))"), {"name": name}
            ).scalar()
        except DBAPIError as exc:
            refused[name] = _first_line(exc)
            continue
        pages[name] = int(removed or 0)
    if rows is not None:
        rows = {name: count for name, count in rows.items() if name in pages}
    return pages, rows, refused


def vacuum_analyze(
    auto: Connection,
    tables: Sequence[str],
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """VACUUM (ANALYZE) each table on an autocommit connection (VACUUM runs outside a
    transaction): the tables done, and those the server refused with its reason (a lock
    held past the busy timeout, say); ``progress`` hears (table, done, total) first."""
    done: list[str] = []
    refused: dict[str, str] = {}
    for number, table in enumerate(tables):
        if progress is not None:
            progress(table, number, len(tables))
        try:
            auto.execute(text(f'VACUUM (ANALYZE) "{table}"'))
        except DBAPIError as exc:
            refused[table] = _first_line(exc)
            continue
        done.append(table)
    if progress is not None and tables:
        progress(tables[-1], len(tables), len(tables))
    return done, refused


__all__ = [
    "PENDING_LIST_BYTES",
    "PGSTATTUPLE",
    "STATISTICS_ROWS",
    "Pending",
    "block_size",
    "clean_pending_lists",
    "estimate_pending_pages",
    "gin_indexes",
    "pending_lists",
    "statistics_problem",
    "too_long",
    "vacuum_analyze",
    "written_since_vacuum",
]
