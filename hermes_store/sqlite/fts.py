"""FTS5 layout introspection, integrity checks and index maintenance."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Connection, RootTransaction, bindparam, text
from sqlalchemy.exc import DBAPIError

from hermes_store.declarations import APPLICATION_MARKER as APPLICATION_MARKER
from hermes_store.declarations import APPLICATION_VIEW as APPLICATION_VIEW
from hermes_store.declarations import LAYOUT_MARKER as LAYOUT_MARKER
from hermes_store.declarations import SQLITE, TRIGRAM_INDEX, WORD_INDEX
from hermes_store.engine import BEGIN_OPTION, create_store_engine, db_path, translate_error
from hermes_store.errors import StoreError
from hermes_store.maintenance import CheckResult
from hermes_store.sqlite.mechanism import CREATED
from hermes_store.sqlite.mechanism import SearchObject as SearchObject
from hermes_store.sqlite.mechanism import head_objects as head_objects
from hermes_store.sqlite.mechanism import normalise_sql as normalise_sql

log = logging.getLogger(__name__)

INDEXES = tuple(index.name for index in SQLITE.indexes)
assert INDEXES == (WORD_INDEX, TRIGRAM_INDEX)
SOURCE_VIEW = SQLITE.view
TRIGGERS = tuple(name for index in SQLITE.indexes for name in index.trigger_names)


def _declaration(conn: Connection, name: str) -> str | None:
    row = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"),
        {"name": name},
    ).first()
    return None if row is None else str(row[0])


def index_layout(conn: Connection, name: str) -> str:
    """'external', 'inline' or 'none' for one FTS5 table."""
    sql = _declaration(conn, name)
    if sql is None:
        return "none"
    compact = sql.replace(" ", "").lower()
    return "external" if f"content='{SOURCE_VIEW}'" in compact else "inline"


def is_application_layout(conn: Connection) -> bool:
    """True when the Hermes application moved the indexes to its own layout (left alone).

    Recognised as the application itself does: its word index declares a `tool_name`
    column (every layout of its own; the legacy one and this package's have one column),
    its view `messages_fts_src` exists, or its `fts_storage_version` marker is set.
    """
    word = _declaration(conn, WORD_INDEX)
    if word is not None and "tool_name" in word.lower():
        return True
    names = {
        str(row[0])
        for row in conn.execute(
            text("SELECT name FROM sqlite_master WHERE name IN (:view, 'state_meta')"),
            {"view": APPLICATION_VIEW},
        )
    }
    if APPLICATION_VIEW in names:
        return True
    if "state_meta" not in names:  # a new, empty store
        return False
    marker = conn.execute(
        text("SELECT 1 FROM state_meta WHERE key = :marker"), {"marker": APPLICATION_MARKER}
    ).first()
    return marker is not None


def layout(conn: Connection) -> str:
    """The store's search layout: 'external', 'inline', 'staging', 'application' or 'none'.

    'application' is the Hermes application's own external layout (its view
    `messages_fts_src`), which this package recognises and leaves as it is. 'staging': an
    external index is being built beside a legacy one (:func:`staged_indexes`), which the
    application keeps reading until the backfill swaps them.
    """
    if is_application_layout(conn):
        return "application"
    if staged_indexes(conn):
        return "staging"
    return index_layout(conn, WORD_INDEX)


def set_layout_marker(conn: Connection, value: str | None) -> None:
    """Record (or, with None, forget) the layout in `state_meta` under this package's key."""
    conn.execute(text("DELETE FROM state_meta WHERE key = :key"), {"key": LAYOUT_MARKER})
    if value is not None:
        conn.execute(
            text("INSERT INTO state_meta (key, value) VALUES (:key, :value)"),
            {"key": LAYOUT_MARKER, "value": value},
        )


def present_indexes(conn: Connection) -> list[str]:
    """The FTS5 indexes this store has, word index first."""
    return [name for name in INDEXES if _declaration(conn, name) is not None]


# -- a legacy index rebuilt beside itself ----------------------------------------------------
# A legacy index that cannot be converted in place and is rebuilt by the deferred backfill
# stays where the application's own search reads it, fed by its legacy triggers, while the
# external index is built beside it as `<index>_next` (see the FTS branch's revision). The
# backfill swaps them when the new one is complete and then drops the old one, renamed
# `<index>_retired`, in short steps.


def staged_name(index: str) -> str:
    """The table an index is rebuilt in, beside the legacy one: ``messages_fts_next``."""
    return index + SQLITE.staged_suffix


#: Set in `state_meta` (on the staged table's name, ``messages_fts_next.compaction``) while
#: an index in the head's own layout is rebuilt beside itself to compact it
#: (:mod:`hermes_store.sqlite.compaction`): the current index stays complete and serves.
COMPACTION_KEY = "{index}.compaction"


def compaction_staged(conn: Connection, staged: Collection[str]) -> set[str]:
    """Those of the staged tables ``staged`` that compact a complete index."""
    if not staged:
        return set()
    keys = [COMPACTION_KEY.format(index=name) for name in staged]
    rows = conn.execute(
        text("SELECT key FROM state_meta WHERE key IN :keys").bindparams(
            bindparam("keys", expanding=True)
        ),
        {"keys": keys},
    )
    found = {str(row[0]) for row in rows}
    return {name for name in staged if COMPACTION_KEY.format(index=name) in found}


def retired_name(index: str) -> str:
    """The name a swapped-out legacy index keeps until it is dropped."""
    return index + SQLITE.retired_suffix


def logical_index(table: str) -> str:
    """The index a staged or retired table stands for (the name itself otherwise)."""
    for index in INDEXES:
        if table in (staged_name(index), retired_name(index), retired_copy_name(index)):
            return index
    return table


def _tables_named(conn: Connection, names: Collection[str]) -> set[str]:
    rows = conn.execute(
        text("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN :names").bindparams(
            bindparam("names", expanding=True)
        ),
        {"names": list(names)},
    )
    return {str(row[0]) for row in rows}


def staged_indexes(conn: Connection) -> dict[str, str]:
    """Index -> the table it is being rebuilt in, for each index being rebuilt beside itself."""
    staged = {staged_name(index): index for index in INDEXES}
    return {staged[name]: name for name in sorted(_tables_named(conn, staged))}


def retired_copy_name(index: str) -> str:
    """The name an in-place conversion gives the text copy it sets aside."""
    return index + SQLITE.retired_copy_suffix


def retired_indexes(conn: Connection) -> list[str]:
    """Swapped-out legacy indexes, and text copies set aside by an in-place conversion,
    whose pages are not freed yet (dropped in short steps by the backfill and optimize)."""
    names = [name(index) for index in INDEXES for name in (retired_name, retired_copy_name)]
    return sorted(_tables_named(conn, names))


def begin_writing(conn: Connection) -> RootTransaction:
    """Begin a transaction that is a writer from its BEGIN (BEGIN IMMEDIATE).

    SQLite then waits up to the busy timeout for the agent's write lock; a transaction
    that starts as a read and then writes gets SQLITE_BUSY at once instead of waiting.
    """
    previous = conn.get_execution_options().get(BEGIN_OPTION, "DEFERRED")
    conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
    try:
        return conn.begin()
    finally:
        conn.execution_options(**{BEGIN_OPTION: previous})


def check_index(conn: Connection, name: str) -> str | None:
    """Run FTS5 'integrity-check' with rank 1 (index versus its content); return the error.

    The check is an INSERT, so it needs write access: a held lock, a read-only store or a
    full disk says nothing about the index and is raised as its domain error instead.
    """
    error = None
    savepoint = conn.begin_nested() if conn.in_transaction() else begin_writing(conn)
    try:
        conn.exec_driver_sql(f"INSERT INTO {name}({name}, rank) VALUES ('integrity-check', 1)")
    except DBAPIError as exc:
        translated = translate_error(exc)
        if translated is not None:
            raise translated from exc
        error = str(exc.orig)
    finally:
        savepoint.rollback()
    if error is None:
        return None
    # FTS5 says 'SQL logic error' for a missing shadow table: name it.
    missing = missing_shadow_tables(conn, name)
    return f"{error}; {', '.join(missing)} missing" if missing else error


def integrity_check(
    conn: Connection,
    *,
    quick: bool = False,
    skip: Mapping[str, str] | None = None,
    snapshot: Path | None = None,
) -> CheckResult:
    """`PRAGMA integrity_check` (or quick_check) plus the FTS5 check of every index.

    ``skip`` maps indexes that must not be checked (an unfinished backfill) to the reason.
    With ``snapshot`` (a directory) the FTS5 checks run on a private copy made there, so
    the store's write lock is never taken (see :func:`_checks_on_snapshot`).
    """
    result = CheckResult()
    pragma = "quick_check" if quick else "integrity_check"
    reading = not conn.in_transaction()
    rows = [str(r[0]) for r in conn.exec_driver_sql(f"PRAGMA {pragma}")]
    result.checked.append(f"PRAGMA {pragma}")
    if rows != ["ok"]:
        result.problems["database"] = "; ".join(rows[:10])
    names = present_indexes(conn)
    if reading:
        conn.rollback()  # end the read: each index check below is a writer from its BEGIN
    for name in names:
        if skip and name in skip:
            result.skipped[name] = skip[name]
    names = [name for name in names if name not in result.skipped]
    result.checked.extend(names)
    errors = _checks_on_snapshot(conn, names, snapshot) if snapshot is not None else None
    if errors is not None:
        result.fts_checked_on = "snapshot"
    else:
        errors = {}
        for name in names:
            started = time.perf_counter()
            errors[name] = check_index(conn, name)
            result.longest_write_lock_s = max(
                result.longest_write_lock_s, time.perf_counter() - started
            )
    result.problems.update({name: error for name, error in errors.items() if error is not None})
    return result


def _checks_on_snapshot(
    conn: Connection, names: list[str], directory: Path
) -> dict[str, str | None] | None:
    """Run the FTS5 integrity checks on a private, consistent copy of the store.

    An FTS5 check is an INSERT: on the live store it holds the write lock for its whole run
    (2.2 s for the trigram index at 50k messages, growing with the store), and the agent
    cannot write meanwhile. The copy is taken with the backup API (one read transaction:
    writers go on) into ``directory`` (mode 0700, removed afterwards). Returns None, to
    check live instead, when the store is not a file or the copy does not fit.
    """
    if not names:
        return {}
    store = db_path(str(conn.engine.url))
    if store is None or not store.is_file():
        return None
    wal = store.with_name(store.name + "-wal")
    needed = store.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    if shutil.disk_usage(directory).free < needed * 1.1:
        log.info("check: no room for a snapshot in %s; checking the live store", directory)
        return None
    raw = conn.connection.driver_connection
    if not isinstance(raw, sqlite3.Connection):
        return None
    with tempfile.TemporaryDirectory(dir=directory, prefix="hermes-check-") as folder:
        copy_path = Path(folder) / "snapshot.db"
        with contextlib.closing(sqlite3.connect(copy_path)) as copy:
            raw.backup(copy)
        conn.rollback()  # the backup's read of the store, on the caller's connection
        snapshot = create_store_engine(copy_path, create=False, wal=False)
        try:
            with snapshot.connect() as copy_conn:
                return {name: check_index(copy_conn, name) for name in names}
        finally:
            snapshot.dispose()


#: The rowid of an FTS5 index's structure record in its `_data` table, and the marker its
#: second version starts with (SQLite 3.42+).
_STRUCTURE_ROWID = 10
_STRUCTURE_V2 = b"\xff\x00\x00\x01"


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """One SQLite varint of ``data`` at ``at``: (value, position after it)."""
    value = 0
    for offset in range(9):
        byte = data[at + offset]
        if offset == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, at + offset + 1
    raise AssertionError("unreachable")


def segment_count(conn: Connection, name: str) -> int | None:
    """How many segments an FTS5 index has on disk (1: fully merged), or None when its
    structure record cannot be read (then treat it as not merged).

    The structure record is a 4-byte cookie (and, from SQLite 3.42, a version marker),
    then the number of levels and the number of segments on all levels, as varints.
    """
    block = conn.exec_driver_sql(
        f"SELECT block FROM {name}_data WHERE id = {_STRUCTURE_ROWID}"
    ).scalar()
    if not isinstance(block, bytes):
        return None
    try:
        at = 8 if block[4:8] == _STRUCTURE_V2 else 4
        _levels, at = _varint(block, at)
        return _varint(block, at)[0]
    except IndexError:
        return None


def optimize_index(conn: Connection, name: str) -> None:
    """Merge an index's segments into one (FTS5 'optimize')."""
    conn.exec_driver_sql(f"INSERT INTO {name}({name}) VALUES ('optimize')")


def rebuild_index(conn: Connection, name: str) -> None:
    """Refill an index from its content (FTS5 'rebuild'), then merge it."""
    conn.exec_driver_sql(f"INSERT INTO {name}({name}) VALUES ('rebuild')")
    optimize_index(conn, name)


#: What each message contributes to both indexes (the view's `content`, the triggers' text).
INDEXED_EXPRESSION = (
    "COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"
)


def reindex_from_messages(conn: Connection, name: str) -> None:
    """Re-create an inline index empty and fill it from `messages`, then merge it.

    An inline index cannot be emptied reliably once damaged, so its table is dropped and
    declared again as it was; the triggers on `messages` keep working.
    """
    declaration = _declaration(conn, name)
    if declaration is None:
        raise ValueError(f"{name} does not exist in this store")
    recreate_index(conn, name, declaration)
    conn.exec_driver_sql(
        f"INSERT INTO {name}(rowid, content) SELECT id, {INDEXED_EXPRESSION} FROM messages"
    )
    optimize_index(conn, name)


_CONTENT_OPTION = re.compile(r"\bcontent\s*=\s*'([^']+)'", re.IGNORECASE)


def repair_index(conn: Connection, name: str) -> str:
    """Re-create a broken index from its own declaration and fill it again from what it
    indexes (external content: FTS5 'rebuild' from its view; inline: re-indexed from
    `messages`); return how, for the log and the report. Runs in the caller's transaction."""
    declaration = _declaration(conn, name)
    if declaration is None:
        raise ValueError(f"{name} does not exist in this store")
    source = _CONTENT_OPTION.search(declaration)
    if source is None:
        reindex_from_messages(conn, name)
        return "re-created and re-indexed from messages (inline layout)"
    recreate_index(conn, name, declaration)
    rebuild_index(conn, name)
    return f"re-created and rebuilt from {source.group(1)}"


# -- re-creating a damaged index --------------------------------------------------------------
# FTS5 keeps an index in shadow tables (`<index>_data`, `_idx`, `_config`, `_docsize`, and
# `_content` for an inline one). Some damage to them (a wrong 'version' in `_config`, a
# missing `_config` or `_data`, a lost structure record) makes FTS5 refuse to open the
# index at all: then neither its 'rebuild' nor DROP TABLE runs (SQLite 3.40), nor does any
# write to `messages` through the triggers. An index holds nothing that `messages` does not,
# so a damaged one is dropped whole and declared again, inside the caller's transaction.

_PROBE = "hermes_shadow_probe"


def shadow_tables(conn: Connection, name: str) -> list[str]:
    """The tables SQLite counts as the shadow tables of the virtual table ``name``."""
    prefix = name + "_"
    return sorted(
        str(row[1])
        for row in conn.exec_driver_sql("PRAGMA main.table_list")
        if row[2] == "shadow"
        and str(row[1]).startswith(prefix)
        and "_" not in str(row[1])[len(prefix) :]
    )


def missing_shadow_tables(conn: Connection, name: str) -> list[str]:
    """The shadow tables FTS5 creates for ``name``'s declaration that the store lacks (the
    declaration is tried on a temporary table: the list is FTS5's, not this package's)."""
    declaration = _declaration(conn, name)
    match = CREATED.match(declaration or "")
    if declaration is None or match is None:
        return []
    probe = declaration[: match.start(1)] + f"temp.{_PROBE}" + declaration[match.end(1) :]
    savepoint = conn.begin_nested() if conn.in_transaction() else conn.begin()
    try:
        conn.exec_driver_sql(probe)
        suffixes = [
            str(row[1])[len(_PROBE) :]
            for row in conn.exec_driver_sql("PRAGMA temp.table_list")
            if row[2] == "shadow" and str(row[1]).startswith(_PROBE + "_")
        ]
    except DBAPIError:  # this SQLite cannot declare it (no trigram tokenizer): say nothing
        return []
    finally:
        savepoint.rollback()
    present = set(shadow_tables(conn, name))
    return sorted(name + suffix for suffix in suffixes if name + suffix not in present)


def drop_index(conn: Connection, name: str) -> None:
    """Drop an FTS5 index and its shadow tables, even when FTS5 can no longer open it.

    When DROP TABLE fails (FTS5 cannot construct the table), the table's entry is removed
    from sqlite_master (`writable_schema`; a virtual table owns no pages, so none are lost)
    and its shadow tables are dropped as the plain tables they are. Runs in the caller's
    transaction: a failure later in it rolls all of this back.
    """
    shadows = shadow_tables(conn, name)
    savepoint = conn.begin_nested()
    try:
        conn.exec_driver_sql(f'DROP TABLE "{name}"')
    except DBAPIError as exc:
        savepoint.rollback()
        translated = translate_error(exc)
        if translated is not None:
            raise translated from exc
        log.info(
            "repair: FTS5 cannot open %s (%s); dropping it by its schema entry", name, exc.orig
        )
        _forget_virtual_table(conn, name)
        for table in shadows:
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}"')
    else:
        savepoint.commit()


def _forget_virtual_table(conn: Connection, name: str) -> None:
    """Remove a virtual table's entry from sqlite_master, then make every connection read
    the schema again (the schema cookie)."""
    try:
        conn.exec_driver_sql("PRAGMA writable_schema = ON")
        conn.execute(
            text("DELETE FROM sqlite_master WHERE type = 'table' AND name = :name"),
            {"name": name},
        )
    except DBAPIError as exc:
        raise StoreError(
            f"{name} cannot be dropped: FTS5 cannot open it and this SQLite refuses schema "
            f"edits ({exc.orig}); nothing was changed. Restore the backup, or rebuild the "
            "store with `hermes-store copy`"
        ) from None
    finally:
        conn.exec_driver_sql("PRAGMA writable_schema = OFF")
    cookie = int(conn.exec_driver_sql("PRAGMA schema_version").scalar_one())
    conn.exec_driver_sql(f"PRAGMA schema_version = {cookie + 1}")


def recreate_index(conn: Connection, name: str, declaration: str) -> None:
    """Drop an index (:func:`drop_index`) and declare it again, empty."""
    drop_index(conn, name)
    conn.exec_driver_sql(declaration)


# -- the search mechanism: the view, both declarations and the six triggers -----------------
# What they must be is the search layout's snapshot (`declarations.SQLITE`, see
# `mechanism.head_objects`). The Hermes application's FTS "recovery" (after an open on a
# SQLite without FTS5 dropped the triggers) re-creates the triggers with their INLINE-layout
# bodies and refills the indexes with `DELETE FROM` + `INSERT ... SELECT`: on external
# content both damage the index, and so does every later delete or update through them.

#: Why one object of the search mechanism is wrong.
MISSING = "missing"
INLINE_BODY = "inline-layout body (the Hermes application's FTS recovery re-created it)"
DIFFERS = "differs from this package's definition"

_SCHEMA_OBJECTS = (
    "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view', 'trigger')"
)


@dataclass
class MechanismCheck:
    """How a store's search mechanism compares with the search layout's snapshot."""

    #: Why nothing was checked (the indexes are not in this package's layout), else None.
    skipped: str | None = None
    #: ``"<kind> <name>"`` -> MISSING, INLINE_BODY or DIFFERS.
    problems: dict[str, str] = field(default_factory=dict)
    #: The indexes this store must have, word index first.
    expected: list[str] = field(default_factory=list)
    #: Index -> the table it is being rebuilt in, beside the legacy one.
    staged: dict[str, str] = field(default_factory=dict)
    #: What was compared (:func:`head_objects` for this store).
    objects: tuple[SearchObject, ...] = field(default_factory=head_objects)

    @property
    def ok(self) -> bool:
        """True when every object is as this package defines it (or nothing was checked)."""
        return not self.problems

    def problems_of(self, index: str, *, staged_only: bool = False) -> dict[str, str]:
        """The problems of the objects that write or declare ``index`` (with
        ``staged_only``: not those of a legacy index kept serving while it is rebuilt)."""
        objects = {obj.label: obj for obj in self.objects}
        return {
            label: why
            for label, why in self.problems.items()
            if objects[label].index == index and not (staged_only and objects[label].presence_only)
        }

    def damaged(self) -> dict[str, str]:
        """Index -> why search cannot use it; every index when the view is wrong.

        For an index being rebuilt beside itself, only the objects search reads or that
        feed the new index count (the legacy ones serve the application, not this package).
        """
        view = self.objects[0].label
        damaged: dict[str, str] = {}
        for index in self.expected:
            found = self.problems_of(index, staged_only=True)
            if view in self.problems:
                found = {view: self.problems[view], **found}
            if found:
                label, why = next(iter(found.items()))
                more = f" and {len(found) - 1} more" if len(found) > 1 else ""
                damaged[index] = f"{label}: {why}{more}"
        return damaged


def has_trigram(conn: Connection) -> bool:
    """True when this SQLite has FTS5's trigram tokenizer (probed on a temporary table)."""
    savepoint = conn.begin_nested() if conn.in_transaction() else conn.begin()
    try:
        conn.exec_driver_sql(
            "CREATE VIRTUAL TABLE temp.hermes_trigram_probe USING fts5(x, tokenize='trigram')"
        )
    except DBAPIError:
        return False
    finally:
        savepoint.rollback()
    return True


def _is_external(sql: str | None) -> bool:
    return f"content='{SOURCE_VIEW}'" in (sql or "").replace(" ", "").lower()


def _compare(obj: SearchObject, found: tuple[str, str | None] | None) -> str | None:
    """Why the object found under ``obj.name`` is wrong, or None when it is right."""
    if found is None:
        return MISSING
    if obj.presence_only:
        return None if found[0] == obj.kind else DIFFERS
    kind, sql = found
    if kind != obj.kind or sql is None:
        return DIFFERS
    actual = normalise_sql(sql)
    if actual == normalise_sql(obj.sql):
        return None
    if obj.kind == "trigger" and (
        (obj.legacy_sql is not None and actual == normalise_sql(obj.legacy_sql))
        or re.search(rf"\bDELETE FROM {obj.index} WHERE rowid\b", actual, re.IGNORECASE)
    ):
        return INLINE_BODY
    return DIFFERS


def check_mechanism(conn: Connection, *, probe_trigram: bool = True) -> MechanismCheck:
    """Compare the view, both declarations and the six triggers with the snapshot's DDL.

    Only stores in this package's external layout are checked: inline (legacy) indexes and
    the Hermes application's own newer layout are skipped, with the reason. The trigram
    index and its triggers are expected when the store has that index or, with
    ``probe_trigram``, when this SQLite has the trigram tokenizer.
    """
    master: dict[str, tuple[str, str | None]] = {
        str(name): (str(kind), None if sql is None else str(sql))
        for kind, name, sql in conn.execute(text(_SCHEMA_OBJECTS))
    }
    meta: dict[str, str] = {}
    if "state_meta" in master:
        meta = {
            str(key): str(value)
            for key, value in conn.execute(
                text("SELECT key, value FROM state_meta WHERE key = :ours"),
                {"ours": LAYOUT_MARKER},
            )
        }
    if is_application_layout(conn):
        return MechanismCheck(
            skipped="the indexes are in the Hermes application's own layout, not this "
            "package's; its search mechanism was not checked"
        )
    ours = (
        meta.get(LAYOUT_MARKER) == SQLITE.marker
        or head_objects()[0].name in master
        or _is_external(master.get(WORD_INDEX, ("", None))[1])
    )
    present = [name for name in INDEXES if master.get(name, ("", None))[0] == "table"]
    if not ours:
        state = "inline (legacy, not upgraded)" if present else "absent"
        return MechanismCheck(
            skipped=f"the search indexes are {state}: this package's search mechanism is not "
            "installed, so it was not checked"
        )
    if not present:
        return MechanismCheck(
            skipped="the store has no search index (upgraded on a SQLite without FTS5); "
            "nothing to check"
        )
    trigram = TRIGRAM_INDEX in present or (probe_trigram and has_trigram(conn))
    staged = {index: staged_name(index) for index in INDEXES if staged_name(index) in master}
    objects = head_objects(frozenset(staged), "messages_display_order_insert" in master)
    result = MechanismCheck(
        expected=[WORD_INDEX, *([TRIGRAM_INDEX] if trigram else [])],
        staged=staged,
        objects=objects,
    )
    for obj in objects:
        if obj.index is not None and obj.index not in result.expected:
            continue
        problem = _compare(obj, master.get(obj.name))
        if problem is not None:
            result.problems[obj.label] = problem
    return result


@dataclass
class MechanismRestore:
    """What :func:`restore_mechanism` re-created and rebuilt."""

    #: Why nothing was done (the indexes are not in this package's layout), else None.
    skipped: str | None = None
    #: ``"<kind> <name>"`` -> what was wrong with it before it was re-created.
    restored: dict[str, str] = field(default_factory=dict)
    #: Index -> how and why it was rebuilt.
    rebuilt: dict[str, str] = field(default_factory=dict)
    #: Index -> why it must be refilled, left to the caller (``rebuild=False`` or excluded).
    to_refill: dict[str, str] = field(default_factory=dict)


def _drop(conn: Connection, name: str) -> None:
    """Drop whatever object has that name (a trigger, a view or a table), if any."""
    row = conn.execute(
        text("SELECT type FROM sqlite_master WHERE name = :name"), {"name": name}
    ).first()
    if row is None:
        return
    if str(row[0]) == "table":
        drop_index(conn, name)  # an FTS5 declaration, perhaps one FTS5 cannot open
    elif str(row[0]) in ("trigger", "view"):
        conn.exec_driver_sql(f'DROP {str(row[0]).upper()} "{name}"')


def restore_mechanism(
    conn: Connection, *, rebuild: bool = True, exclude: Collection[str] = ()
) -> MechanismRestore:
    """Re-create what :func:`check_mechanism` finds wrong from the snapshot's DDL; rebuild.

    Runs in the caller's write transaction. Wrong objects are dropped (triggers first) and
    created again: the view, a wrong declaration (its index is refilled: the text lives in
    `messages`), then the triggers. Every index whose triggers or declaration were wrong, or
    whose FTS5 integrity check (rank 1) fails afterwards, is dropped whole and declared
    again from the snapshot (:func:`recreate_index`: damaged shadow tables may keep FTS5
    from opening it at all), then rebuilt from the view (FTS5 'rebuild') and merged
    ('optimize'). Indexes in ``exclude`` (a deferred backfill pending) are not checked;
    those of them, and with ``rebuild=False`` all of them, that need refilling are left
    declared again and empty, and returned in ``to_refill``.
    """
    check = check_mechanism(conn)
    outcome = MechanismRestore(skipped=check.skipped)
    if check.skipped is not None:
        log.debug("restore: %s", check.skipped)
        return outcome
    wrong = [obj for obj in check.objects if obj.label in check.problems]
    for kind in ("trigger", "view", "table"):
        for obj in wrong:
            if obj.kind == kind:
                _drop(conn, obj.name)
    for kind in ("view", "table", "trigger"):
        for obj in wrong:
            if obj.kind == kind:
                conn.exec_driver_sql(obj.sql)
                was = outcome.restored[obj.label] = check.problems[obj.label]
                log.info("restore: re-created %s (it was: %s)", obj.label, was)
    reasons: dict[str, str] = {}
    for index in check.expected:
        if index in check.staged:
            # Being rebuilt beside itself: a re-created staged object means its fill starts
            # over (left to the caller, as deferred); the legacy one only needed its objects.
            problems = check.problems_of(index, staged_only=True)
            if problems:
                outcome.to_refill[check.staged[index]] = "after restoring " + ", ".join(problems)
            continue
        problems = check.problems_of(index)
        if problems:
            reasons[index] = "after restoring " + ", ".join(problems)
        elif index not in exclude:
            error = check_index(conn, index)
            if error is not None:
                reasons[index] = f"because its integrity check failed: {error}"
    declarations = {obj.name: obj.sql for obj in check.objects if obj.kind == "table"}
    for index, reason in reasons.items():
        # Declared again whatever was wrong: FTS5 may not even open the one the store has.
        if f"table {index}" not in outcome.restored:
            recreate_index(conn, index, declarations[index])
        if rebuild and index not in exclude:
            rebuild_index(conn, index)
            outcome.rebuilt[index] = f"declared again and rebuilt from {SOURCE_VIEW} {reason}"
            log.info(
                "restore: %s declared again and rebuilt from %s %s", index, SOURCE_VIEW, reason
            )
        else:
            outcome.to_refill[index] = reason
    return outcome
