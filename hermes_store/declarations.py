"""What the search layout's revisions create, as typed data the library owns.

`check`, `--repair`, the deferred backfill and the upgrade's verification compare a store
with these snapshots: one frozen snapshot per search-layout version and database. The
revisions stay frozen leaves that import nothing of the library, so they keep their own
copy of the same DDL; tests/test_declarations.py runs the revisions on both databases and
proves each snapshot equal to what its revision creates. A new layout version is a new
revision, a new snapshot here, and :data:`SEARCH_LAYOUT` moved to it: SQLite's and
PostgreSQL's checks follow that one constant.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

#: The search layout both databases' checks and repairs expect (the FTS branch's head).
SEARCH_LAYOUT = 2

#: `state_meta` key under which this package records the search layout of a store.
LAYOUT_MARKER = "hermes_store.fts_layout"
#: The Hermes application's own external layout: its view and its layout marker.
APPLICATION_VIEW = "messages_fts_src"
APPLICATION_MARKER = "fts_storage_version"

WORD_INDEX = "messages_fts"
TRIGRAM_INDEX = "messages_fts_trigram"

_EVENTS = ("insert", "delete", "update")


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


# -- SQLite: FTS5 over the view `messages_fts_source` --------------------------------------

#: The indexed text of a `messages` row (``{row}``: new, old, or an alias).
_DOCUMENT = (
    "COALESCE({row}.content, '') || ' ' || COALESCE({row}.tool_name, '') || ' '\n"
    "            || COALESCE({row}.tool_calls, '')"
)
#: The triggers leave ids (indexed_upto, high_water] to the deferred backfill.
_BACKFILL_GUARD = """WHEN {row}.id > coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                        WHERE key = '{index}.backfill_high_water'), 0)
  OR {row}.id <= coalesce((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = '{index}.backfill_indexed_upto'),
                        9223372036854775807)"""
_ADD = """    INSERT INTO {index}(rowid, content) VALUES (
        new.id,
        {new}
    );"""
_REMOVE = """    INSERT INTO {index}({index}, rowid, content) VALUES (
        'delete',
        old.id,
        {old}
    );"""
_EXTERNAL_HEADS = {
    "insert": "CREATE TRIGGER {index}_insert AFTER INSERT ON messages",
    "delete": "CREATE TRIGGER {index}_delete AFTER DELETE ON messages",
    "update": "CREATE TRIGGER {index}_update\nAFTER UPDATE OF id, content, tool_name, tool_calls"
    " ON messages",
}
_EXTERNAL_BODIES = {"insert": (_ADD,), "delete": (_REMOVE,), "update": (_REMOVE, _ADD)}
_GUARD_ROW = {"insert": "new", "delete": "old", "update": "old"}

# The inline layout's triggers, as the legacy application (and revision 17) write them.
_LEGACY = {
    "insert": "CREATE TRIGGER {index}_insert AFTER INSERT ON messages BEGIN\n{add}\nEND",
    "delete": "CREATE TRIGGER {index}_delete AFTER DELETE ON messages BEGIN\n"
    "    DELETE FROM {index} WHERE rowid = old.id;\nEND",
    "update": "CREATE TRIGGER {index}_update AFTER UPDATE ON messages BEGIN\n"
    "    DELETE FROM {index} WHERE rowid = old.id;\n{add}\nEND",
}
#: The inline update trigger of the application's schema 30 and later: its display
#: triggers update the row just inserted, which the broad one would index twice.
_NARROW_UPDATE = """CREATE TRIGGER {index}_update
AFTER UPDATE OF content, tool_name, tool_calls, role ON messages BEGIN
    DELETE FROM {index} WHERE rowid = old.id;
    INSERT INTO {index}(rowid, content) VALUES (
        new.id,
        COALESCE(CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END, '')
        || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""


def _external_trigger(index: str, event: str) -> str:
    body = "\n".join(
        part.format(index=index, new=_DOCUMENT.format(row="new"), old=_DOCUMENT.format(row="old"))
        for part in _EXTERNAL_BODIES[event]
    )
    guard = _BACKFILL_GUARD.format(row=_GUARD_ROW[event], index=index)
    return f"{_EXTERNAL_HEADS[event].format(index=index)}\n{guard}\nBEGIN\n{body}\nEND"


def _legacy_trigger(index: str, event: str) -> str:
    add = _ADD.format(index=index, new=_DOCUMENT.format(row="new"))
    return _LEGACY[event].format(index=index, add=add)


@dataclass(frozen=True)
class FtsIndex:
    """One FTS5 index of the SQLite layout: its declarations and its three triggers."""

    name: str
    #: Its declaration as external content over the view (what the layout creates).
    external_sql: str
    #: Its legacy inline declaration (the application's own, before the conversion).
    inline_sql: str
    #: Insert, delete and update trigger names (the legacy application's names, kept).
    trigger_names: tuple[str, str, str]
    #: The layout's triggers, in the order of ``trigger_names``.
    triggers: tuple[str, str, str]
    #: The inline-layout triggers the legacy application gives the same names.
    legacy_triggers: tuple[str, str, str]
    #: The application's narrow inline update trigger (its schema 30 and later).
    narrow_update_trigger: str

    def legacy_triggers_at(self, display_triggers: bool) -> tuple[str, ...]:
        """The inline-layout triggers the application gives this index; with its display
        triggers (schema 30 and later) the update trigger is its narrow one."""
        if display_triggers:
            return (*self.legacy_triggers[:2], self.narrow_update_trigger)
        return self.legacy_triggers


def _fts_index(name: str, options: str) -> FtsIndex:
    tokenize = f", tokenize='{options}'" if options else ""
    return FtsIndex(
        name=name,
        external_sql=f"CREATE VIRTUAL TABLE {name} USING fts5("
        f"content, content='messages_fts_source', content_rowid='id'{tokenize})",
        inline_sql=f"CREATE VIRTUAL TABLE {name} USING fts5(content{tokenize})",
        trigger_names=(f"{name}_insert", f"{name}_delete", f"{name}_update"),
        triggers=(
            _external_trigger(name, "insert"),
            _external_trigger(name, "delete"),
            _external_trigger(name, "update"),
        ),
        legacy_triggers=(
            _legacy_trigger(name, "insert"),
            _legacy_trigger(name, "delete"),
            _legacy_trigger(name, "update"),
        ),
        narrow_update_trigger=_NARROW_UPDATE.format(index=name),
    )


@dataclass(frozen=True)
class ChangeLog:
    """The log of ids written while the upgrade verifies the legacy indexes unlocked."""

    table: str
    #: `state_meta` key of the installed log's random id.
    id_key: str
    #: `state_meta` key of an index's verdict, ``{name}``: the index.
    verified_key: str
    #: The verdict of an index whose copy equals its messages.
    exact: str


@dataclass(frozen=True)
class SQLiteLayout:
    """What one search-layout revision creates on SQLite."""

    version: int
    #: The revision that creates it (on the FTS branch).
    revision: str
    view: str
    view_sql: str
    #: Word index first.
    indexes: tuple[FtsIndex, ...]
    #: The value of :data:`LAYOUT_MARKER` it records.
    marker: str
    #: The value it records on a store in the application's own layout (left alone).
    application_marker: str
    #: An external index built beside the legacy one it replaces (deferred rebuild).
    staged_suffix: str
    #: A legacy index swapped out, until its pages are freed in short steps.
    retired_suffix: str
    #: The text copy an in-place conversion sets aside (`<index>_content` before).
    retired_copy_suffix: str
    change_log: ChangeLog
    #: The indexed text of a `messages` row, ``{row}`` its alias.
    document: str

    def indexed_expression(self, row: str) -> str:
        """The indexed text of the `messages` row aliased ``row``, on one line."""
        return " ".join(self.document.format(row=row).split())

    def index(self, name: str) -> FtsIndex:
        """The index called ``name``."""
        return next(index for index in self.indexes if index.name == name)

    def staged(self, sql: str, name: str) -> str:
        """A declaration or trigger of index ``name`` for the index built beside it: the
        table, its trigger names and its backfill keys get the staged suffix."""
        return re.sub(
            rf"\b{name}(?=(?:_insert|_delete|_update)?\b)", name + self.staged_suffix, sql
        )

    def staged_table(self, name: str) -> str:
        """The declaration of the index built beside ``name``."""
        return self.staged(self.index(name).external_sql, name)

    def staged_triggers(self, name: str) -> tuple[str, ...]:
        """The triggers that feed the index built beside ``name``."""
        return tuple(self.staged(sql, name) for sql in self.index(name).triggers)

    def staged_trigger_names(self, name: str) -> tuple[str, ...]:
        """The names of :meth:`staged_triggers`."""
        return tuple(self.staged(trigger, name) for trigger in self.index(name).trigger_names)


SQLITE_FTS1 = SQLiteLayout(
    version=1,
    revision="fts1",
    view="messages_fts_source",
    view_sql="""CREATE VIEW messages_fts_source AS
SELECT
    id,
    COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')
        AS content
FROM messages""",
    indexes=(_fts_index(WORD_INDEX, ""), _fts_index(TRIGRAM_INDEX, "trigram")),
    marker="external",
    application_marker="application",
    staged_suffix="_next",
    retired_suffix="_retired",
    retired_copy_suffix="_content_retired",
    change_log=ChangeLog(
        table="hermes_store_conversion_changes",
        id_key="hermes_store.conversion_log",
        verified_key="hermes_store.conversion_verified.{name}",
        exact="exact",
    ),
    document=_DOCUMENT,
)


# -- PostgreSQL: expression indexes over the text stored once in `messages` ----------------


@dataclass(frozen=True)
class PostgreSQLLayout:
    """What one search-layout revision creates on PostgreSQL.

    The DDL is as the revision's source spells it: ``{schema}`` stands for the schema of
    unaccent, and ``\\:`` for ``:`` (Alembic runs it as a text() construct).
    """

    version: int
    revision: str
    extensions: tuple[str, ...]
    #: "name(args)" -> CREATE FUNCTION DDL.
    functions: Mapping[str, str]
    #: index name -> CREATE INDEX DDL (CONCURRENTLY).
    indexes: Mapping[str, str]
    #: The value of :data:`LAYOUT_MARKER` it records.
    marker: str
    #: The tsvector column of `messages` that holds each row's words (None: not stored).
    words_column: str | None = None
    #: The triggers on `messages` that keep that column exact.
    row_triggers: tuple[PostgreSQLTrigger, ...] = ()


POSTGRESQL_FTS1 = PostgreSQLLayout(
    version=1,
    revision="fts1",
    extensions=("unaccent", "pg_trgm"),
    functions=_frozen(
        {
            "hermes_search_document(text, text, text)": """
CREATE OR REPLACE FUNCTION hermes_search_document(content text, tool_name text, tool_calls text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT COALESCE($1, '') || ' ' || COALESCE($2, '') || ' ' || COALESCE($3, '') $$
""",
            "hermes_search_lexemes(text)": """
CREATE OR REPLACE FUNCTION hermes_search_lexemes(document text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT regexp_replace({schema}.unaccent('{schema}.unaccent'\\:\\:regdictionary, $1),
                            '[^[\\:alnum\\:]]+', ' ', 'g') $$
""",
            # A tsvector holds at most 1 MB: of a text over 512 KB the first 131,072
            # characters are indexed by words.
            "hermes_search_words(text)": """
CREATE OR REPLACE FUNCTION hermes_search_words(document text)
RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT to_tsvector('simple'\\:\\:regconfig, hermes_search_lexemes(
    CASE WHEN octet_length($1) < 524288 THEN $1 ELSE left($1, 131072) END)) $$
""",
        }
    ),
    indexes=_frozen(
        {
            WORD_INDEX: "CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_fts ON messages"
            " USING gin"
            " (hermes_search_words(hermes_search_document(content, tool_name, tool_calls)))",
            TRIGRAM_INDEX: "CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_fts_trigram ON"
            " messages USING gin"
            " (hermes_search_document(content, tool_name, tool_calls) gin_trgm_ops)",
        }
    ),
    marker="expression",
)


# -- PostgreSQL: the display triggers of the application's chain ---------------------------


@dataclass(frozen=True)
class PostgreSQLTrigger:
    """A trigger on `messages` and the PL/pgSQL function of the same name it runs."""

    name: str
    function_sql: str
    trigger_sql: str


@dataclass(frozen=True)
class PostgreSQLTriggers:
    """The triggers an application schema version's revision creates on PostgreSQL (on
    SQLite the same revisions' triggers are read from a store they create in memory, see
    `declared`)."""

    #: The application schema version from which these definitions hold.
    app_version: int
    triggers: tuple[PostgreSQLTrigger, ...]

    def trigger(self, name: str) -> PostgreSQLTrigger | None:
        """The trigger called ``name``, if this version defines one."""
        return next((found for found in self.triggers if found.name == name), None)


_NEAREST_PEER = """COALESCE((
        SELECT display_order FROM messages
        WHERE session_id = NEW.session_id AND id <> NEW.id
          AND (active = 1 OR compacted = 1)
          AND display_identity = NEW.display_identity AND display_order IS NOT NULL
        ORDER BY display_order LIMIT 1
    ), NEW.id)"""
_LOWEST_PEER = """UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = OLD.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = OLD.display_identity
    ) WHERE session_id = OLD.session_id AND (active = 1 OR compacted = 1)
      AND display_identity = OLD.display_identity"""


def _plpgsql(name: str, body: str) -> str:
    return (
        f"\nCREATE OR REPLACE FUNCTION {name}() RETURNS trigger\nLANGUAGE plpgsql AS $$\n"
        f"BEGIN\n{body}\nEND\n$$\n"
    )


POSTGRESQL_DISPLAY_30 = PostgreSQLTriggers(
    app_version=30,
    triggers=(
        PostgreSQLTrigger(
            "messages_display_order_insert",
            _plpgsql(
                "messages_display_order_insert",
                f"    NEW.display_order = {_NEAREST_PEER};\n    RETURN NEW;",
            ),
            """
CREATE TRIGGER messages_display_order_insert
BEFORE INSERT ON messages FOR EACH ROW WHEN (NEW.display_order IS NULL)
EXECUTE FUNCTION messages_display_order_insert()
""",
        ),
        PostgreSQLTrigger(
            "messages_display_visibility_update",
            _plpgsql(
                "messages_display_visibility_update",
                f"""    UPDATE messages SET display_order = LEAST(NEW.id, {_NEAREST_PEER})"""
                f""" WHERE id = NEW.id
      AND (NEW.active = 1 OR NEW.compacted = 1);
    UPDATE messages SET display_order = (SELECT display_order FROM messages WHERE id = NEW.id)
    WHERE session_id = NEW.session_id AND id <> NEW.id AND (active = 1 OR compacted = 1)
      AND display_identity = NEW.display_identity
      AND (NEW.active = 1 OR NEW.compacted = 1);
    {_LOWEST_PEER}
      AND NOT (NEW.active = 1 OR NEW.compacted = 1);
    RETURN NULL;""",
            ),
            """
CREATE TRIGGER messages_display_visibility_update
AFTER UPDATE OF active, compacted ON messages FOR EACH ROW
WHEN ((NEW.active = 1 OR NEW.compacted = 1) <> (OLD.active = 1 OR OLD.compacted = 1))
EXECUTE FUNCTION messages_display_visibility_update()
""",
        ),
        PostgreSQLTrigger(
            "messages_display_identity_update",
            _plpgsql(
                "messages_display_identity_update",
                """    UPDATE messages SET display_identity = NULL, display_order = NULL
    WHERE id = NEW.id OR (
        session_id = OLD.session_id AND display_identity = OLD.display_identity
        AND (active = 1 OR compacted = 1)
    );
    RETURN NULL;""",
            ),
            """
CREATE TRIGGER messages_display_identity_update
AFTER UPDATE OF role, content, timestamp, tool_call_id, tool_calls, tool_name,
                display_kind ON messages FOR EACH ROW
WHEN (NEW.role IS DISTINCT FROM OLD.role
  OR NEW.content IS DISTINCT FROM OLD.content
  OR NEW.timestamp IS DISTINCT FROM OLD.timestamp
  OR NEW.tool_call_id IS DISTINCT FROM OLD.tool_call_id
  OR NEW.tool_calls IS DISTINCT FROM OLD.tool_calls
  OR NEW.tool_name IS DISTINCT FROM OLD.tool_name
  OR NEW.display_kind IS DISTINCT FROM OLD.display_kind)
EXECUTE FUNCTION messages_display_identity_update()
""",
        ),
        PostgreSQLTrigger(
            "messages_display_identity_delete",
            _plpgsql("messages_display_identity_delete", f"    {_LOWEST_PEER};\n    RETURN NULL;"),
            """
CREATE TRIGGER messages_display_identity_delete
AFTER DELETE ON messages FOR EACH ROW WHEN (OLD.active = 1 OR OLD.compacted = 1)
EXECUTE FUNCTION messages_display_identity_delete()
""",
        ),
    ),
)


# -- layout 2: the words stored (PostgreSQL); nothing changes on SQLite ---------------------

#: On SQLite revision fts2 changes nothing: FTS5 keeps positions already.
SQLITE_FTS2 = replace(SQLITE_FTS1, version=2, revision="fts2")

#: The column revision fts2 adds to `messages` on PostgreSQL.
WORDS_COLUMN = "search_words"
#: Columns of `messages` that a search layout owns (not the models': a copy leaves them to
#: the target's own layout, autogenerate leaves them alone).
SEARCH_COLUMNS = frozenset({WORDS_COLUMN})
#: The GIN index over it, which replaces fts1's expression index `messages_fts`.
WORDS_INDEX = "messages_fts_words"

POSTGRESQL_FTS2 = replace(
    POSTGRESQL_FTS1,
    version=2,
    revision="fts2",
    indexes=_frozen(
        {
            WORDS_INDEX: "CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_fts_words ON messages"
            " USING gin (search_words)",
            TRIGRAM_INDEX: POSTGRESQL_FTS1.indexes[TRIGRAM_INDEX],
        }
    ),
    marker="stored",
    words_column=WORDS_COLUMN,
    row_triggers=(
        PostgreSQLTrigger(
            name="messages_search_words",
            function_sql="""
CREATE OR REPLACE FUNCTION messages_search_words() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.search_words := hermes_search_words(
        hermes_search_document(NEW.content, NEW.tool_name, NEW.tool_calls));
    RETURN NEW;
END
$$
""",
            trigger_sql="""
CREATE TRIGGER messages_search_words
BEFORE INSERT OR UPDATE OF content, tool_name, tool_calls ON messages
FOR EACH ROW EXECUTE FUNCTION messages_search_words()
""",
        ),
    ),
)


# -- the snapshots, and the one each database's check expects ------------------------------

SQLITE_LAYOUTS: Mapping[int, SQLiteLayout] = MappingProxyType({1: SQLITE_FTS1, 2: SQLITE_FTS2})
POSTGRESQL_LAYOUTS: Mapping[int, PostgreSQLLayout] = MappingProxyType(
    {1: POSTGRESQL_FTS1, 2: POSTGRESQL_FTS2}
)
#: By the application schema version from which each holds, oldest first.
POSTGRESQL_TRIGGERS: tuple[PostgreSQLTriggers, ...] = (POSTGRESQL_DISPLAY_30,)

#: What `check` and `--repair` expect of a store upgraded to head.
SQLITE = SQLITE_LAYOUTS[SEARCH_LAYOUT]
POSTGRESQL = POSTGRESQL_LAYOUTS[SEARCH_LAYOUT]


def postgresql_triggers(app_version: int | None) -> PostgreSQLTriggers | None:
    """The PostgreSQL trigger definitions that hold at ``app_version`` (None: none yet)."""
    held = [
        snapshot
        for snapshot in POSTGRESQL_TRIGGERS
        if app_version is not None and snapshot.app_version <= app_version
    ]
    return held[-1] if held else None


__all__ = [
    "APPLICATION_MARKER",
    "APPLICATION_VIEW",
    "LAYOUT_MARKER",
    "POSTGRESQL",
    "POSTGRESQL_DISPLAY_30",
    "POSTGRESQL_FTS1",
    "POSTGRESQL_FTS2",
    "POSTGRESQL_LAYOUTS",
    "POSTGRESQL_TRIGGERS",
    "SEARCH_COLUMNS",
    "SEARCH_LAYOUT",
    "SQLITE",
    "SQLITE_FTS1",
    "SQLITE_FTS2",
    "SQLITE_LAYOUTS",
    "TRIGRAM_INDEX",
    "WORDS_COLUMN",
    "WORDS_INDEX",
    "WORD_INDEX",
    "ChangeLog",
    "FtsIndex",
    "PostgreSQLLayout",
    "PostgreSQLTrigger",
    "PostgreSQLTriggers",
    "SQLiteLayout",
    "postgresql_triggers",
]
