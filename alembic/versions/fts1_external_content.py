"""Store message text once: move both FTS5 indexes to external content over one view.

In the legacy INLINE layout each FTS5 table keeps a private copy of every message's
indexed text in its `<fts>_content` shadow table, so the text is stored three times.
This step creates the view `messages_fts_source` (id, indexed expression), re-declares
`messages_fts` and `messages_fts_trigram` as external-content tables over it, drops the
two copies and recreates the six triggers under their legacy names: insert; delete via
the FTS5 'delete' command with the OLD values and the same expression; update only when
`content`, `tool_name` or `tool_calls` change.

Two paths, chosen per index and logged:
- in place (default when verified): when every row of `<fts>_content` equals the view's
  row for the same id and both id sets are equal, the existing index already is the
  external-content index; the declaration is rewritten in `sqlite_master` and the copy
  dropped, without tokenizing anything (a lock held for the time of one scan).
- rebuild: when verification fails (a drifted or damaged legacy index), the SQLite build
  refuses schema edits, the index is missing, or `-x fts_convert=rebuild` asks for it:
  the table is recreated and filled with FTS5 'rebuild', then merged with 'optimize' so
  that appends are not slower than on the legacy index.

While a deferred backfill is pending (`-x fts_backfill=deferred`, for large stores that
cannot convert in place), `state_meta` holds `<fts>.backfill_high_water` and
`<fts>.backfill_indexed_upto`: ids in (indexed_upto, high_water] are not in the index yet,
and the triggers' WHEN clause leaves those rows to the backfill (a 'delete' for a row that
was never indexed would corrupt the index). Without those keys every row is indexed.
`UPDATE OF` also lists `id`, so a changed rowid never leaves a stale entry.

A legacy index that must be rebuilt under `-x fts_backfill=deferred` is not dropped: the
application's own search keeps reading it (its legacy triggers keep feeding it) while the
external index is built beside it as `<fts>_next` (declaration and triggers: the head's,
renamed; backfill keys `<fts>_next.backfill_*`). When that fill is complete, the backfill
(`hermes-store optimize-storage`) swaps them in one short transaction: the legacy index is
renamed `<fts>_retired`, `<fts>_next` becomes `<fts>` with the head's triggers, and the
retired index is then emptied and dropped in short steps.

A store whose indexes the Hermes application already moved to its own external layout
(its view `messages_fts_src`, marker `fts_storage_version`) is left as it is, in one log
line: the application maintains those objects itself.

This revision never changes `schema_version` (the application's relational version); it
records the layout in `state_meta` under `hermes_store.fts_layout` ('external', or
'application' for the case above).

Everything runs in the revision's transaction: interrupted at any point, the store keeps
its inline indexes. A full disk is never taken for a refusal: it fails the revision (no
rebuild is tried), and the store keeps its inline indexes. A store whose indexes are
already external is left as it is. Without the trigram tokenizer the word index converts
alone; without FTS5 the triggers are dropped (writes keep working, search returns nothing)
and a warning logged.

On PostgreSQL there is no FTS5 and no copy to remove: this step installs unaccent and
pg_trgm when missing, creates the search functions (`hermes_search_document`, the indexed
expression; `hermes_search_lexemes` and `hermes_search_words`, unicode61-like tokens) and
builds two GIN expression indexes over the text stored once in `messages`
(`messages_fts`: its tsvector; `messages_fts_trigram`: pg_trgm), CONCURRENTLY, so that
writers are never blocked; an invalid index an interrupted build left is dropped and built
again. The layout marker is 'expression'. Its downgrade drops the indexes and functions
(the extensions stay: other objects of the database may use them).

Downgrade converts back to the inline layout, in place as well (the copies are refilled
from the view) when each index holds exactly the view's ids, else by re-indexing.
Nothing is lost either way: every message stays in `messages`.

Revision ID: fts1
Revises: 17
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op

revision: str = "fts1"
down_revision: str | None = "17"
branch_labels: str | Sequence[str] | None = ("fts",)
depends_on: str | Sequence[str] | None = None

#: Why this revision cannot be written out as SQL by `--sql` (offline mode).
OFFLINE_REFUSAL = "it verifies the legacy index against the messages before converting it in place"

log = logging.getLogger("alembic.runtime.migration")

WORD = "messages_fts"
TRIGRAM = "messages_fts_trigram"
VIEW = "messages_fts_source"

MESSAGES_FTS_SOURCE_VIEW = """
CREATE VIEW messages_fts_source AS
SELECT
    id,
    COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')
        AS content
FROM messages
"""

#: Declarations of the external-content tables (also written into sqlite_master in place).
EXTERNAL_TABLES = {
    WORD: "CREATE VIRTUAL TABLE messages_fts USING fts5("
    "content, content='messages_fts_source', content_rowid='id')",
    TRIGRAM: "CREATE VIRTUAL TABLE messages_fts_trigram USING fts5("
    "content, content='messages_fts_source', content_rowid='id', tokenize='trigram')",
}

#: The legacy inline declarations, as the legacy application wrote them (for downgrade).
INLINE_TABLES = {
    WORD: "CREATE VIRTUAL TABLE messages_fts USING fts5(content)",
    TRIGRAM: "CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(content, tokenize='trigram')",
}

MESSAGES_FTS_INSERT_TRIGGER = """
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
WHEN new.id > coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                        WHERE key = 'messages_fts.backfill_high_water'), 0)
  OR new.id <= coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'messages_fts.backfill_indexed_upto'),
                        9223372036854775807)
BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
MESSAGES_FTS_DELETE_TRIGGER = """
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
WHEN old.id > coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                        WHERE key = 'messages_fts.backfill_high_water'), 0)
  OR old.id <= coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'messages_fts.backfill_indexed_upto'),
                        9223372036854775807)
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES (
        'delete',
        old.id,
        COALESCE(old.content, '') || ' ' || COALESCE(old.tool_name, '') || ' '
            || COALESCE(old.tool_calls, '')
    );
END
"""
MESSAGES_FTS_UPDATE_TRIGGER = """
CREATE TRIGGER messages_fts_update
AFTER UPDATE OF id, content, tool_name, tool_calls ON messages
WHEN old.id > coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                        WHERE key = 'messages_fts.backfill_high_water'), 0)
  OR old.id <= coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'messages_fts.backfill_indexed_upto'),
                        9223372036854775807)
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES (
        'delete',
        old.id,
        COALESCE(old.content, '') || ' ' || COALESCE(old.tool_name, '') || ' '
            || COALESCE(old.tool_calls, '')
    );
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
MESSAGES_FTS_TRIGRAM_INSERT_TRIGGER = """
CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages
WHEN new.id > coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                        WHERE key = 'messages_fts_trigram.backfill_high_water'), 0)
  OR new.id <= coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'messages_fts_trigram.backfill_indexed_upto'),
                        9223372036854775807)
BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
MESSAGES_FTS_TRIGRAM_DELETE_TRIGGER = """
CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages
WHEN old.id > coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                        WHERE key = 'messages_fts_trigram.backfill_high_water'), 0)
  OR old.id <= coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'messages_fts_trigram.backfill_indexed_upto'),
                        9223372036854775807)
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content) VALUES (
        'delete',
        old.id,
        COALESCE(old.content, '') || ' ' || COALESCE(old.tool_name, '') || ' '
            || COALESCE(old.tool_calls, '')
    );
END
"""
MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER = """
CREATE TRIGGER messages_fts_trigram_update
AFTER UPDATE OF id, content, tool_name, tool_calls ON messages
WHEN old.id > coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                        WHERE key = 'messages_fts_trigram.backfill_high_water'), 0)
  OR old.id <= coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'messages_fts_trigram.backfill_indexed_upto'),
                        9223372036854775807)
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content) VALUES (
        'delete',
        old.id,
        COALESCE(old.content, '') || ' ' || COALESCE(old.tool_name, '') || ' '
            || COALESCE(old.tool_calls, '')
    );
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
EXTERNAL_TRIGGERS = {
    WORD: (MESSAGES_FTS_INSERT_TRIGGER, MESSAGES_FTS_DELETE_TRIGGER, MESSAGES_FTS_UPDATE_TRIGGER),
    TRIGRAM: (
        MESSAGES_FTS_TRIGRAM_INSERT_TRIGGER,
        MESSAGES_FTS_TRIGRAM_DELETE_TRIGGER,
        MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER,
    ),
}

# The legacy triggers of revision 17, repeated here for the downgrade (revisions are frozen).
LEGACY_MESSAGES_FTS_INSERT_TRIGGER = """
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
LEGACY_MESSAGES_FTS_DELETE_TRIGGER = """
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
END
"""
LEGACY_MESSAGES_FTS_UPDATE_TRIGGER = """
CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
LEGACY_MESSAGES_FTS_TRIGRAM_INSERT_TRIGGER = """
CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
LEGACY_MESSAGES_FTS_TRIGRAM_DELETE_TRIGGER = """
CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
END
"""
LEGACY_MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER = """
CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
LEGACY_TRIGGERS = {
    WORD: (
        LEGACY_MESSAGES_FTS_INSERT_TRIGGER,
        LEGACY_MESSAGES_FTS_DELETE_TRIGGER,
        LEGACY_MESSAGES_FTS_UPDATE_TRIGGER,
    ),
    TRIGRAM: (
        LEGACY_MESSAGES_FTS_TRIGRAM_INSERT_TRIGGER,
        LEGACY_MESSAGES_FTS_TRIGRAM_DELETE_TRIGGER,
        LEGACY_MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER,
    ),
}
TRIGGER_NAMES = {
    WORD: ("messages_fts_insert", "messages_fts_delete", "messages_fts_update"),
    TRIGRAM: (
        "messages_fts_trigram_insert",
        "messages_fts_trigram_delete",
        "messages_fts_trigram_update",
    ),
}
#: The indexed expression over `messages` aliased `m`, for verification joins.
INDEXED_EXPRESSION = (
    "COALESCE(m.content, '') || ' ' || COALESCE(m.tool_name, '') || ' ' "
    "|| COALESCE(m.tool_calls, '')"
)


#: Suffix of an external index built beside the legacy one it replaces (deferred rebuild).
STAGED_SUFFIX = "_next"
#: Suffix of a legacy index swapped out, until its pages are freed in short steps.
RETIRED_SUFFIX = "_retired"
#: Name suffix of the text copy an in-place conversion sets aside (`<fts>_content` before),
#: until its pages are freed in short steps.
RETIRED_COPY_SUFFIX = "_content_retired"


def staged_sql(sql: str, name: str) -> str:
    """A declaration or trigger of index `name`, for the index built beside it.

    The table, its trigger names and its backfill keys get STAGED_SUFFIX:
    ``messages_fts_insert`` -> ``messages_fts_next_insert``,
    ``'messages_fts.backfill_high_water'`` -> ``'messages_fts_next.backfill_high_water'``.
    """
    return re.sub(rf"\b{name}(?=(?:_insert|_delete|_update)?\b)", name + STAGED_SUFFIX, sql)


STAGED_TABLES = {name: staged_sql(sql, name) for name, sql in EXTERNAL_TABLES.items()}
STAGED_TRIGGERS = {
    name: tuple(staged_sql(sql, name) for sql in ddl) for name, ddl in EXTERNAL_TRIGGERS.items()
}
STAGED_TRIGGER_NAMES = {
    name: tuple(staged_sql(trigger, name) for trigger in triggers)
    for name, triggers in TRIGGER_NAMES.items()
}


def legacy_triggers(name: str, display_triggers: bool) -> tuple[str, ...]:
    """The inline-layout triggers the application gives index `name`.

    From the application's schema 30 on (its display triggers exist) the update trigger is
    its narrow one: its display triggers update the row just inserted.
    """
    triggers = LEGACY_TRIGGERS[name]
    if display_triggers:
        narrow = NARROW_UPDATE_TRIGGER.format(name=f"{name}_update", index=name)
        triggers = (*triggers[:2], narrow)
    return triggers


#: This project's record of the search layout, apart from the application's `schema_version`
#: (which this revision never changes) and its own `fts_storage_version`.
LAYOUT_MARKER = "hermes_store.fts_layout"
LAYOUT_EXTERNAL = "external"
LAYOUT_APPLICATION = "application"
#: The view of the Hermes application's own external layout (its fts_storage_version >= 1).
APPLICATION_VIEW = "messages_fts_src"


def _application_layout() -> bool:
    """The application's own layout, told apart as it does: a word index with a `tool_name`
    column, its view `messages_fts_src`, or its `fts_storage_version` marker."""
    word = _declaration(WORD)
    if word is not None and "tool_name" in word.lower():
        return True
    row = (
        _bind()
        .execute(
            sa.text(
                "SELECT 1 FROM sqlite_master WHERE type = 'view' AND name = :view "
                "UNION ALL SELECT 1 FROM state_meta WHERE key = 'fts_storage_version'"
            ),
            {"view": APPLICATION_VIEW},
        )
        .first()
    )
    return row is not None


def _set_marker(value: str | None) -> None:
    bind = _bind()
    bind.execute(sa.text("DELETE FROM state_meta WHERE key = :key"), {"key": LAYOUT_MARKER})
    if value is not None:
        bind.execute(
            sa.text("INSERT INTO state_meta (key, value) VALUES (:key, :value)"),
            {"key": LAYOUT_MARKER, "value": value},
        )


class SchemaEditRefused(Exception):
    """This SQLite build does not let the schema table be edited (defensive mode)."""


def _bind() -> sa.Connection:
    return op.get_bind()


def _scalar(sql: str) -> object:
    return _bind().exec_driver_sql(sql).scalar()


def _declaration(name: str) -> str | None:
    row = (
        _bind()
        .execute(
            sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"),
            {"name": name},
        )
        .first()
    )
    return None if row is None else str(row[0])


def _layout(name: str) -> str:
    """'missing', 'inline' or 'external' for one FTS5 table."""
    sql = _declaration(name)
    if sql is None:
        return "missing"
    return "external" if "content=" in sql.replace(" ", "").lower() else "inline"


#: SQLite's primary result code for a full disk (or a store at `max_page_count`).
SQLITE_FULL = 13


def _disk_full(exc: BaseException) -> bool:
    """Whether SQLite ran out of space, here or in an error this one was raised from.

    Such a failure is no refusal to take another way: SQLite may have rolled the whole
    transaction back, and a rebuild writes far more than what did not fit.
    """
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        orig = getattr(current, "orig", current)
        code = getattr(orig, "sqlite_errorcode", None)
        if (isinstance(code, int) and code & 0xFF == SQLITE_FULL) or "disk is full" in str(orig):
            return True
        current = current.__cause__ or current.__context__
    return False


def _refusal(sql: str) -> str | None:
    """Run `sql` in a SAVEPOINT that is always rolled back; return SQLite's refusal if any."""
    bind = _bind()
    savepoint = bind.begin_nested()
    try:
        bind.exec_driver_sql(sql)
    except sa.exc.OperationalError as exc:
        if _disk_full(exc):
            raise
        return str(exc.orig)
    finally:
        savepoint.rollback()
    return None


def _has_fts5() -> bool:
    return _refusal("CREATE VIRTUAL TABLE temp.hermes_fts5_probe USING fts5(x)") is None


def _has_trigram() -> bool:
    return (
        _refusal("CREATE VIRTUAL TABLE temp.hermes_trigram_probe USING fts5(x, tokenize='trigram')")
        is None
    )


def _drop_triggers(name: str) -> None:
    for trigger in TRIGGER_NAMES[name]:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")


def verify_inline(conn: sa.Connection, name: str) -> str | None:
    """Why the inline index of `name` cannot be reused as is, or None when it can.

    Reads every row of its copy: O(messages). `hermes_store.migrate` runs it under a read
    snapshot before the upgrade takes the write lock (see CHANGE_LOG); this revision runs
    it in its own transaction when that was not done.
    """
    found = conn.execute(
        sa.text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :name"),
        {"name": f"{name}_content"},
    ).first()
    if found is None:
        return "its content copy is missing"
    messages = int(conn.exec_driver_sql("SELECT count(*) FROM messages").scalar() or 0)
    copies = int(conn.exec_driver_sql(f"SELECT count(*) FROM {name}_content").scalar() or 0)
    docs = int(conn.exec_driver_sql(f"SELECT count(*) FROM {name}_docsize").scalar() or 0)
    if not messages == copies == docs:
        return f"it holds {copies} rows ({docs} sized) for {messages} messages"
    matched, differing = conn.exec_driver_sql(
        f"SELECT count(*), coalesce(sum(c.c0 IS NOT {INDEXED_EXPRESSION}), 0) "
        f"FROM {name}_content AS c JOIN messages AS m ON m.id = c.id"
    ).one()
    if matched != messages:
        return f"{messages - int(matched)} message ids are not in it"
    if differing:
        return f"{int(differing)} rows differ from their messages"
    return None


# -- verification ahead of the write lock ---------------------------------------------------
# `hermes_store.migrate` verifies the legacy indexes under a read snapshot while the agent
# keeps writing: it first installs CHANGE_LOG and its triggers (one short write), then reads,
# then records each verdict under VERIFIED_KEY. Every id written, edited or deleted after the
# log exists is logged: through `messages`, and through the legacy copies `<fts>_content`
# themselves (the FTS5 table's own writes fire their triggers: the application's FTS recovery
# or any write made straight to the FTS table is seen too). In the write lock this revision
# then re-checks only the logged ids. Each installation has its own random id (LOG_ID_KEY),
# read in the verification's snapshot and stored with the verdict: a verdict is trusted only
# with the very log that ran since its snapshot.
CHANGE_LOG = "hermes_store_conversion_changes"
LOG_ID_KEY = "hermes_store.conversion_log"
#: state_meta key of an index's verdict: "<log id> exact", or "<log id> <why not>".
VERIFIED_KEY = "hermes_store.conversion_verified.{name}"
EXACT = "exact"


def _watched(conn: sa.Connection) -> list[str]:
    """The tables whose writes the change log records: messages and the legacy copies."""
    copies = [f"{name}_content" for name in (WORD, TRIGRAM)]
    found = {
        str(row[0])
        for row in conn.execute(
            sa.text(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN :n"
            ).bindparams(sa.bindparam("n", expanding=True)),
            {"n": copies},
        )
    }
    return ["messages", *(name for name in copies if name in found)]


def change_triggers(tables: Sequence[str]) -> dict[str, str]:
    """Trigger name -> DDL: each insert, update and delete of ``tables`` logs its ids."""
    log_id = f"INSERT OR IGNORE INTO {CHANGE_LOG}(id) VALUES"
    triggers = {}
    for table in tables:
        for event, body in (
            ("INSERT", f"{log_id} (new.id);"),
            ("UPDATE", f"{log_id} (old.id); {log_id} (new.id);"),
            ("DELETE", f"{log_id} (old.id);"),
        ):
            name = f"{CHANGE_LOG}__{table}_{event.lower()}"
            triggers[name] = f"CREATE TRIGGER {name} AFTER {event} ON {table} BEGIN {body} END"
    return triggers


def start_change_log(conn: sa.Connection) -> str:
    """Install the change log and its triggers afresh (in the caller's write transaction);
    return its id."""
    drop_change_log(conn)
    conn.exec_driver_sql(f"CREATE TABLE {CHANGE_LOG} (id INTEGER PRIMARY KEY)")
    for ddl in change_triggers(_watched(conn)).values():
        conn.exec_driver_sql(ddl)
    log_id = secrets.token_hex(8)
    conn.execute(
        sa.text("INSERT INTO state_meta (key, value) VALUES (:key, :value)"),
        {"key": LOG_ID_KEY, "value": log_id},
    )
    return log_id


def drop_change_log(conn: sa.Connection) -> None:
    """Remove the change log, its triggers, its id and the recorded verdicts."""
    triggers = conn.execute(
        sa.text("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE :p"),
        {"p": f"{CHANGE_LOG}%"},
    ).scalars()
    for name in list(triggers):
        conn.exec_driver_sql(f'DROP TRIGGER IF EXISTS "{name}"')
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {CHANGE_LOG}")
    conn.execute(
        sa.text("DELETE FROM state_meta WHERE key = :id OR key LIKE :verdicts"),
        {"id": LOG_ID_KEY, "verdicts": VERIFIED_KEY.format(name="%")},
    )


def current_log_id(conn: sa.Connection) -> str | None:
    """The id of the change log, when it and its triggers on `messages` and on each legacy
    copy still in place are as installed; else None. (A copy the conversion has already
    renamed aside keeps its triggers until the log is dropped.)"""
    found = {
        str(name): " ".join(str(sql).split())
        for name, sql in conn.execute(
            sa.text("SELECT name, sql FROM sqlite_master WHERE name LIKE :p"),
            {"p": f"{CHANGE_LOG}%"},
        )
    }
    expected = change_triggers(_watched(conn))
    if found.pop(CHANGE_LOG, None) is None or any(
        found.get(name) != ddl for name, ddl in expected.items()
    ):
        return None
    log_id = conn.execute(
        sa.text("SELECT value FROM state_meta WHERE key = :key"), {"key": LOG_ID_KEY}
    ).scalar()
    return None if log_id is None else str(log_id)


def verify_changes(conn: sa.Connection, name: str) -> str | None:
    """Re-check, against the messages, the index rows of every id in the change log."""
    (differing,) = conn.exec_driver_sql(
        f"SELECT count(*) FROM {CHANGE_LOG} AS l "
        f"LEFT JOIN messages AS m ON m.id = l.id "
        f"LEFT JOIN {name}_content AS c ON c.id = l.id "
        f"LEFT JOIN {name}_docsize AS d ON d.id = l.id "
        "WHERE NOT ((m.id IS NULL AND c.id IS NULL AND d.id IS NULL) OR "
        f"(m.id IS NOT NULL AND c.id IS NOT NULL AND d.id IS NOT NULL "
        f"AND c.c0 IS {INDEXED_EXPRESSION}))"
    ).one()
    if differing:
        return f"{int(differing)} messages changed since its verification differ from it"
    return None


def _verify_inline(name: str) -> str | None:
    """The verdict recorded under a read snapshot, completed for the rows changed since;
    or, without one (or with the log tampered with), a full verification here."""
    bind = _bind()
    recorded = bind.execute(
        sa.text("SELECT value FROM state_meta WHERE key = :key"),
        {"key": VERIFIED_KEY.format(name=name)},
    ).scalar()
    log_id, _, verdict = str(recorded or "").partition(" ")
    if not verdict or log_id != current_log_id(bind):
        return verify_inline(bind, name)
    if verdict != EXACT:
        return verdict
    return verify_changes(bind, name)


def _bump_schema_cookie() -> None:
    cookie = int(_scalar("PRAGMA schema_version") or 0)
    op.execute(f"PRAGMA schema_version = {cookie + 1}")


def _rewrite_declaration(name: str, sql: str) -> None:
    """Replace a virtual table's declaration in sqlite_master; raise if the build refuses."""
    bind = _bind()
    try:
        bind.exec_driver_sql("PRAGMA writable_schema = ON")
        bind.execute(
            sa.text("UPDATE sqlite_master SET sql = :sql WHERE type = 'table' AND name = :name"),
            {"sql": sql, "name": name},
        )
    except sa.exc.OperationalError as exc:
        raise SchemaEditRefused(str(exc.orig)) from exc
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")
    _bump_schema_cookie()


def _convert_in_place(name: str) -> str | None:
    """Re-declare a verified inline index as external content; return why not, if refused."""
    bind = _bind()
    savepoint = bind.begin_nested()
    try:
        _rewrite_declaration(name, EXTERNAL_TABLES[name])
        # Set aside, not dropped: freeing its pages here would hold the lock for a time
        # that grows with the store. `optimize` / `optimize-storage` drop it in short steps.
        op.execute(f"DROP TABLE IF EXISTS {name}{RETIRED_COPY_SUFFIX}")
        op.execute(f"ALTER TABLE {name}_content RENAME TO {name}{RETIRED_COPY_SUFFIX}")
    except (SchemaEditRefused, sa.exc.OperationalError) as exc:
        if _disk_full(exc):
            raise
        savepoint.rollback()
        return f"this SQLite refuses schema edits ({exc})"
    savepoint.commit()
    return None


def _rebuild_external(name: str, deferred: bool) -> str:
    """Recreate `name` as external content and fill it now, or leave the fill deferred."""
    op.execute(f"DROP TABLE IF EXISTS {name}")
    op.execute(EXTERNAL_TABLES[name])
    high_water = int(_scalar("SELECT coalesce(max(id), 0) FROM messages") or 0)
    if deferred and high_water:
        # Rows up to the high-water mark are indexed later, in short chunks, by
        # `hermes-store optimize-storage`; the triggers leave that range alone until then.
        # Automerge is off meanwhile so that no chunk pays for a merge; the backfill merges
        # the segments in short steps at the end and turns it back on.
        op.execute(f"INSERT INTO {name}({name}, rank) VALUES ('automerge', 0)")
        _bind().execute(
            sa.text("INSERT OR REPLACE INTO state_meta (key, value) VALUES (:key, :value)"),
            [
                {"key": f"{name}.backfill_high_water", "value": str(high_water)},
                {"key": f"{name}.backfill_indexed_upto", "value": "0"},
            ],
        )
        return f"left empty for a deferred backfill of ids 1..{high_water}"
    op.execute(f"INSERT INTO {name}({name}) VALUES ('rebuild')")
    # A freshly rebuilt index is slower to append to until merged.
    op.execute(f"INSERT INTO {name}({name}) VALUES ('optimize')")
    return "built from the view"


def _drop_staged(name: str) -> None:
    """Drop the index built beside `name` (and its triggers) and a retired one, if any."""
    for trigger in STAGED_TRIGGER_NAMES[name]:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    op.execute(f"DROP TABLE IF EXISTS {name}{STAGED_SUFFIX}")
    op.execute(f"DROP TABLE IF EXISTS {name}{RETIRED_SUFFIX}")
    op.execute(f"DROP TABLE IF EXISTS {name}{RETIRED_COPY_SUFFIX}")


def _stage_external(name: str, high_water: int) -> str:
    """Keep the legacy index serving; build the external one beside it, deferred."""
    staged = name + STAGED_SUFFIX
    _drop_staged(name)
    op.execute(STAGED_TABLES[name])
    op.execute(f"INSERT INTO {staged}({staged}, rank) VALUES ('automerge', 0)")
    _bind().execute(
        sa.text("INSERT OR REPLACE INTO state_meta (key, value) VALUES (:key, :value)"),
        [
            {"key": f"{staged}.backfill_high_water", "value": str(high_water)},
            {"key": f"{staged}.backfill_indexed_upto", "value": "0"},
        ],
    )
    # The legacy triggers as the application's version defines them keep the legacy index
    # current (a missing one may be why it drifted); the staged ones feed the new index.
    for ddl in (*legacy_triggers(name, _has_display_triggers()), *STAGED_TRIGGERS[name]):
        op.execute(ddl)
    return (
        f"kept serving the application while {staged} is built beside it (ids 1..{high_water},"
        " by `hermes-store optimize-storage`, which swaps it in when complete)"
    )


def _convert(name: str, forced_rebuild: bool, deferred: bool) -> None:
    layout = _layout(name)
    _drop_staged(name)
    _drop_triggers(name)
    if layout == "external":
        log.info("%s: already external content, left as it is", name)
    elif layout == "missing":
        done = _rebuild_external(name, deferred)
        log.info("%s: was missing; created as external content and %s", name, done)
    else:
        why = "-x fts_convert=rebuild was given" if forced_rebuild else _verify_inline(name)
        if why is None:
            why = _convert_in_place(name)
            if why is None:
                log.info("%s: converted in place (legacy index verified exact)", name)
        if why is not None:
            high_water = int(_scalar("SELECT coalesce(max(id), 0) FROM messages") or 0)
            if deferred and high_water:
                done = _stage_external(name, high_water)
                log.info("%s (legacy, must be rebuilt because %s): %s", name, why, done)
                return
            done = _rebuild_external(name, deferred)
            log.info("%s: re-created as external content and %s, because %s", name, done, why)
    for ddl in EXTERNAL_TRIGGERS[name]:
        op.execute(ddl)


# PostgreSQL: no FTS5 and no copies. The same indexed expression (the text stored once, in
# messages) is indexed twice by expression indexes: a GIN index over its tsvector for the
# word path and a pg_trgm GIN index for the trigram path. Tokenised like FTS5's unicode61:
# lower case ('simple' configuration: no stemming, no stop words), diacritics removed
# (unaccent), every character that is not a letter or a digit a separator.
LAYOUT_POSTGRESQL = "expression"
POSTGRESQL_EXTENSIONS = ("unaccent", "pg_trgm")
POSTGRESQL_DOCUMENT_FUNCTION = """
CREATE OR REPLACE FUNCTION hermes_search_document(content text, tool_name text, tool_calls text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT COALESCE($1, '') || ' ' || COALESCE($2, '') || ' ' || COALESCE($3, '') $$
"""
# `{schema}`: where unaccent is installed, named so that the function does not depend on
# the search_path of the session that runs it (an index expression must be immutable).
POSTGRESQL_LEXEMES_FUNCTION = """
CREATE OR REPLACE FUNCTION hermes_search_lexemes(document text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT regexp_replace({schema}.unaccent('{schema}.unaccent'\\:\\:regdictionary, $1),
                            '[^[\\:alnum\\:]]+', ' ', 'g') $$
"""
POSTGRESQL_WORDS_FUNCTION = """
CREATE OR REPLACE FUNCTION hermes_search_words(document text)
RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT to_tsvector('simple'\\:\\:regconfig, hermes_search_lexemes($1)) $$
"""
POSTGRESQL_FUNCTIONS = {
    "hermes_search_document(text, text, text)": POSTGRESQL_DOCUMENT_FUNCTION,
    "hermes_search_lexemes(text)": POSTGRESQL_LEXEMES_FUNCTION,
    "hermes_search_words(text)": POSTGRESQL_WORDS_FUNCTION,
}
POSTGRESQL_INDEXES = {
    WORD: "CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_fts ON messages USING gin"
    " (hermes_search_words(hermes_search_document(content, tool_name, tool_calls)))",
    TRIGRAM: "CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_fts_trigram ON messages USING gin"
    " (hermes_search_document(content, tool_name, tool_calls) gin_trgm_ops)",
}


def _extension_schema(name: str) -> str:
    """Install a contrib extension when missing; the schema it lives in."""
    bind = _bind()
    find = sa.text("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = :n")
    schema = bind.execute(find, {"n": name}).scalar()
    if schema is None:
        available = bind.execute(
            sa.text("SELECT 1 FROM pg_available_extensions WHERE name = :n"), {"n": name}
        ).first()
        if available is None:
            raise RuntimeError(
                f"PostgreSQL extension {name} is not installed on the server; install the "
                "server's contrib package (Debian: postgresql-contrib) and upgrade again"
            )
        op.execute(f"CREATE EXTENSION IF NOT EXISTS {name}")
        schema = bind.execute(find, {"n": name}).scalar()
    return str(schema)


def _drop_invalid_index(name: str) -> None:
    """A concurrent build that was interrupted leaves an invalid index behind: drop it, so
    that IF NOT EXISTS builds it again instead of keeping the broken one."""
    invalid = _bind().execute(
        sa.text(
            "SELECT 1 FROM pg_index JOIN pg_class ON pg_class.oid = pg_index.indexrelid"
            " WHERE pg_class.relname = :name AND NOT pg_index.indisvalid"
        ),
        {"name": name},
    )
    if invalid.first() is not None:
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def _upgrade_postgresql() -> None:
    schemas = {name: _extension_schema(name) for name in POSTGRESQL_EXTENSIONS}
    for ddl in POSTGRESQL_FUNCTIONS.values():
        op.execute(ddl.format(schema=schemas["unaccent"]))
    _set_marker(LAYOUT_POSTGRESQL)
    # Built without blocking writes to messages (they may be many): outside the revision's
    # transaction, as PostgreSQL requires for CONCURRENTLY.
    with op.get_context().autocommit_block():
        for name, ddl in POSTGRESQL_INDEXES.items():
            _drop_invalid_index(name)
            op.execute(ddl)


def _downgrade_postgresql() -> None:
    """Drop the indexes and functions; the extensions stay (others may use them)."""
    for name in POSTGRESQL_INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
    for signature in reversed(POSTGRESQL_FUNCTIONS):
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    _set_marker(None)


def upgrade() -> None:
    if _bind().dialect.name == "postgresql":
        _upgrade_postgresql()
        return
    x_args = context.get_x_argument(as_dictionary=True)
    mode = x_args.get("fts_convert", "auto")
    if mode not in ("auto", "rebuild"):
        raise ValueError(f"-x fts_convert must be 'auto' or 'rebuild', got {mode!r}")
    backfill = x_args.get("fts_backfill", "immediate")
    if backfill not in ("immediate", "deferred"):
        raise ValueError(f"-x fts_backfill must be 'immediate' or 'deferred', got {backfill!r}")
    if _application_layout():
        log.info(
            "search indexes: the Hermes application's own external layout (%s), left as it is",
            APPLICATION_VIEW,
        )
        _set_marker(LAYOUT_APPLICATION)
        drop_change_log(_bind())
        return
    op.execute(f"DROP VIEW IF EXISTS {VIEW}")
    op.execute(MESSAGES_FTS_SOURCE_VIEW)
    if not _has_fts5():
        for name in (WORD, TRIGRAM):
            _drop_triggers(name)
        log.warning(
            "this SQLite has no FTS5: search indexes left out, search returns nothing; "
            "upgrade again on a SQLite with FTS5 to build them"
        )
    else:
        deferred = backfill == "deferred"
        _convert(WORD, mode == "rebuild", deferred)
        if _layout(TRIGRAM) != "missing" or _has_trigram():
            _convert(TRIGRAM, mode == "rebuild", deferred)
        else:
            log.warning("this SQLite has no trigram tokenizer: CJK search will use LIKE scans")
    drop_change_log(_bind())
    _set_marker(LAYOUT_EXTERNAL)


#: The inline update trigger of the application's schema 30 and later (see revision 30).
NARROW_UPDATE_TRIGGER = """
CREATE TRIGGER {name}
AFTER UPDATE OF content, tool_name, tool_calls, role ON messages BEGIN
    DELETE FROM {index} WHERE rowid = old.id;
    INSERT INTO {index}(rowid, content) VALUES (
        new.id,
        COALESCE(CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END, '')
        || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END
"""


def _has_display_triggers() -> bool:
    row = (
        _bind()
        .execute(
            sa.text(
                "SELECT 1 FROM sqlite_master WHERE type = 'trigger' "
                "AND name = 'messages_display_order_insert'"
            )
        )
        .first()
    )
    return row is not None


def _ids_match(name: str) -> bool:
    """True when the external index has exactly one document per message id."""
    messages = int(_scalar("SELECT count(*) FROM messages") or 0)
    docs = int(_scalar(f"SELECT count(*) FROM {name}_docsize") or 0)
    joined = int(
        _scalar(f"SELECT count(*) FROM {name}_docsize AS d JOIN messages AS m ON m.id = d.id") or 0
    )
    return messages == docs == joined


def _revert(name: str) -> None:
    _drop_staged(name)
    _drop_triggers(name)
    if _layout(name) == "external":
        bind = _bind()
        savepoint = bind.begin_nested()
        try:
            if not _ids_match(name):
                raise SchemaEditRefused("its documents differ from the messages")
            op.execute(f"CREATE TABLE '{name}_content'(id INTEGER PRIMARY KEY, c0)")
            op.execute(f"INSERT INTO {name}_content (id, c0) SELECT id, content FROM {VIEW}")
            _rewrite_declaration(name, INLINE_TABLES[name])
            savepoint.commit()
            log.info("%s: converted back to inline in place", name)
        except (SchemaEditRefused, sa.exc.OperationalError) as exc:
            if _disk_full(exc):
                raise
            savepoint.rollback()
            op.execute(f"DROP TABLE IF EXISTS {name}")
            op.execute(INLINE_TABLES[name])
            op.execute(f"INSERT INTO {name}(rowid, content) SELECT id, content FROM {VIEW}")
            log.info("%s: re-indexed as inline because %s", name, exc)
    for ddl in legacy_triggers(name, _has_display_triggers()):
        op.execute(ddl)


def downgrade() -> None:
    if _bind().dialect.name == "postgresql":
        _downgrade_postgresql()
        return
    if _application_layout():
        _set_marker(None)  # the application's layout was never this revision's to change
        return
    # A pending deferred backfill is abandoned: the inline indexes are rebuilt whole.
    if _has_fts5():
        for name in (WORD, TRIGRAM):
            if _layout(name) != "missing":
                _revert(name)
            else:
                _drop_staged(name)
    op.execute("DELETE FROM state_meta WHERE key LIKE 'messages_fts%.backfill_%'")
    op.execute(f"DROP VIEW IF EXISTS {VIEW}")
    _set_marker(None)
