"""Where the bytes go on PostgreSQL: every table and index of the store, grouped.

The counterpart of :mod:`hermes_store.sqlite.storage` (which reads SQLite's `dbstat`): the server
gives each table's bytes (heap, TOAST, free-space and visibility maps: `pg_table_size`)
and each index's (`pg_relation_size`). The report also carries what shows that the
message text is stored once there: no table beside the models' own (so no copy of the
text), no tsvector column but the search layout's own, and the search indexes with their
sizes. The stored words of revision fts2 (`messages.search_words`: lexemes and positions,
no text) are measured on a line of their own (`pg_column_size` of each value, as stored:
compressed or in TOAST) and filed with the search indexes, not with the message data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, text

from hermes_store.declarations import POSTGRESQL_LAYOUTS
from hermes_store.maintenance import (
    FTS_COPIES,
    FTS_INDEX,
    GROUPS,
    MESSAGE_DATA,
    OTHER,
    Table,
    View,
    human_bytes,
)
from hermes_store.postgresql.migration import facts, foreign_tables, relations

#: The search indexes of every layout (fts1's expression word index, fts2's over the
#: stored words, the trigram index of both).
INDEXES = tuple(
    dict.fromkeys(name for layout in POSTGRESQL_LAYOUTS.values() for name in layout.indexes)
)
#: ``table.column`` of the tsvector columns the search layouts declare.
WORDS_COLUMNS = tuple(
    f"messages.{layout.words_column}"
    for layout in POSTGRESQL_LAYOUTS.values()
    if layout.words_column is not None
)

#: The group the search indexes are filed under (the SQLite report's "FTS index data").
SEARCH_INDEX = FTS_INDEX


@dataclass
class ServerStorageReport:
    """Bytes per table and index and per group, and what shows the text is stored once."""

    database: str
    layout: str
    #: Table or index name -> bytes.
    objects: dict[str, int] = field(default_factory=dict)
    #: Table or index name -> "table" or "index on TABLE".
    kinds: dict[str, str] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    #: Search index name -> bytes; a missing index is absent.
    search_indexes: dict[str, int] = field(default_factory=dict)
    #: ``table.column`` of every tsvector column of the store's tables that no search
    #: layout declares (none is expected).
    tsvector_columns: list[str] = field(default_factory=list)
    #: ``table.column`` of the layout's stored words -> their bytes (lexemes and
    #: positions, no text; part of the table's bytes, filed with the search indexes).
    stored_words: dict[str, int] = field(default_factory=dict)
    #: Tables of the schema that are not the models' own (a copy of the text would be one).
    other_tables: list[str] = field(default_factory=list)
    #: The whole database as the server counts it (catalogs included).
    database_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """The store's tables and indexes together."""
        return sum(self.objects.values())

    @property
    def text_stored_once(self) -> bool:
        """No tsvector column but the layout's and no table but the models': the text is in
        `messages` only."""
        return not self.tsvector_columns and not self.other_tables

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the derived figures."""
        return {
            **asdict(self),
            "total_bytes": self.total_bytes,
            "text_stored_once": self.text_stored_once,
        }

    def _by_size(self) -> list[tuple[str, int]]:
        return sorted(self.objects.items(), key=lambda item: (-item[1], item[0]))

    def records(self) -> Table:
        """One record per table and index, largest first, with its kind."""
        return Table(
            [
                {"object": name, "kind": self.kinds[name], "bytes": size}
                for name, size in self._by_size()
            ],
            ("object", "kind", "bytes"),
        )

    def view(self) -> View:
        """The groups, whether the text is stored once, the search indexes, the largest
        objects."""
        total = self.total_bytes or 1
        rows: list[dict[str, Any]] = [
            {"group": group, "size": human_bytes(size), "share": f"{size / total:.1%}"}
            for group in GROUPS
            for size in [self.groups.get(group, 0)]
        ]
        rows.append({"group": "tables and indexes", "size": human_bytes(self.total_bytes)})
        rows.append({"group": "database", "size": human_bytes(self.database_bytes)})
        shown: View = [
            Table(
                rows,
                ("group", "size", "share"),
                title=f"layout: {self.layout} (PostgreSQL database {self.database})",
                right=("size", "share"),
            )
        ]
        if self.text_stored_once:
            shown.append(
                "message text stored once, in messages: no copy table"
                + (
                    "; its words stored as a tsvector (lexemes and positions, no text)"
                    if self.stored_words
                    else "; no tsvector column: search uses expression indexes over it"
                )
            )
        else:
            found = [f"tsvector column {name}" for name in self.tsvector_columns]
            found += [f"table {name}" for name in self.other_tables]
            shown.append(f"not only the store's tables here: {', '.join(found)}")
        for column, words in self.stored_words.items():
            shown.append(f"stored words {column}: {human_bytes(words)} (within messages' bytes)")
        for name in INDEXES:
            if name in self.search_indexes:
                shown.append(f"search index {name}: {human_bytes(self.search_indexes[name])}")
        shown.append(
            Table(
                [
                    {"object": name, "kind": self.kinds[name], "size": human_bytes(size)}
                    for name, size in self._by_size()[:15]
                ],
                ("object", "kind", "size"),
                right=("size",),
            )
        )
        return shown


def classify(name: str, table: str) -> str:
    """The group of a table or index: the search indexes, messages (heap, TOAST and its
    other indexes), a copy of the text (any table not the models'), everything else."""
    if name in INDEXES:
        return SEARCH_INDEX
    if table == "messages":
        return MESSAGE_DATA
    return OTHER


def tsvector_columns(conn: Connection) -> list[str]:
    """``table.column`` of each tsvector column in the current schema (declared or not)."""
    rows = conn.execute(
        text(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND udt_name = 'tsvector'"
            " ORDER BY 1, 2"
        )
    )
    return [f"{table}.{column}" for table, column in rows]


def server_storage_report(conn: Connection) -> ServerStorageReport:
    """Measure a PostgreSQL store: its tables and indexes, grouped like the SQLite report."""
    _revisions, _version, layout = facts(conn)
    report = ServerStorageReport(
        database=str(conn.execute(text("SELECT current_database()")).scalar_one()),
        layout=layout,
    )
    report.groups = dict.fromkeys(GROUPS, 0)
    others = foreign_tables(conn)
    for relation in relations(conn):
        report.objects[relation.name] = relation.bytes
        report.kinds[relation.name] = (
            "table" if relation.kind == "table" else f"index on {relation.table}"
        )
        owner = relation.name if relation.kind == "table" else relation.table
        group = FTS_COPIES if owner in others else classify(relation.name, relation.table)
        report.groups[group] += relation.bytes
        if relation.kind == "index" and relation.name in INDEXES:
            report.search_indexes[relation.name] = relation.bytes
    found = tsvector_columns(conn)
    report.tsvector_columns = [name for name in found if name not in WORDS_COLUMNS]
    for name in found:
        if name in WORDS_COLUMNS:
            table, column = name.split(".")
            size = int(
                conn.execute(
                    text(f'SELECT coalesce(sum(pg_column_size("{column}")), 0) FROM "{table}"')
                ).scalar_one()
            )
            report.stored_words[name] = size
            report.groups[MESSAGE_DATA] -= size
            report.groups[SEARCH_INDEX] += size
    report.other_tables = others
    report.database_bytes = int(
        conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    )
    if conn.in_transaction():
        conn.rollback()
    return report


def report_of(engine: Engine) -> ServerStorageReport:
    """:func:`server_storage_report` of the store an engine opens."""
    with engine.connect() as conn:
        return server_storage_report(conn)


__all__ = [
    "FTS_COPIES",
    "MESSAGE_DATA",
    "OTHER",
    "SEARCH_INDEX",
    "ServerStorageReport",
    "classify",
    "report_of",
    "server_storage_report",
    "tsvector_columns",
]
