"""Checking and repairing a PostgreSQL store: its indexes and its search mechanism.

The counterpart of the SQLite checks (PRAGMA integrity_check, FTS5 integrity-check) for a
server, which keeps its own pages consistent: every index of the store valid and ready
(a `CREATE INDEX CONCURRENTLY` or `REINDEX CONCURRENTLY` that was interrupted leaves an
invalid one that the planner ignores), every index and trigger the store's revisions
declare present (see `declared`), the search extensions and functions present with the
definitions the search layout's revision creates, both search indexes present over exactly
its expression, the display triggers with their functions, and, when the server has the
`amcheck` extension installed, each B-tree index verified against its table's order; and
the upkeep the planner needs: each table's statistics and each GIN index's pending list
(thresholds in :mod:`hermes_store.postgresql.upkeep`, which `--repair` restores the way
`optimize` does).

The expected objects are the typed snapshots of `hermes_store.declarations` (the search
layout SQLite's check expects too, and the display triggers of the store's application
version); a test proves each equal to what its revision creates.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from hermes_store.declarations import (
    LAYOUT_MARKER,
    POSTGRESQL,
    POSTGRESQL_LAYOUTS,
    POSTGRESQL_TRIGGERS,
    PostgreSQLLayout,
    postgresql_triggers,
)
from hermes_store.declared import Declared, declared_objects, newest_app_version
from hermes_store.engine import translate_error
from hermes_store.errors import StoreError
from hermes_store.maintenance import CheckResult, RepairResult
from hermes_store.postgresql import upkeep, words
from hermes_store.postgresql.maintenance import store_tables
from hermes_store.postgresql.migration import facts
from hermes_store.revisions import script_directory

#: The application schema version whose revision first creates the display triggers.
DISPLAY_VERSION = POSTGRESQL_TRIGGERS[0].app_version
#: The extension whose bt_index_check verifies B-tree indexes, when installed.
AMCHECK = "amcheck"
AMCHECK_ITEM = "amcheck"
#: The name PostgreSQL gives the copies of an index during REINDEX CONCURRENTLY.
LEFTOVER_COPY = re.compile(r"_cc(new|old)\d*$")


@dataclass(frozen=True)
class Expected:
    """The search and display objects a PostgreSQL store at head must have."""

    extensions: tuple[str, ...]
    #: "name(args)" -> CREATE FUNCTION DDL, with {schema} for unaccent's schema.
    functions: Mapping[str, str]
    #: index name -> CREATE INDEX DDL.
    indexes: Mapping[str, str]
    #: trigger (and its function's) name -> CREATE FUNCTION DDL.
    display_functions: Mapping[str, str]
    #: trigger name -> CREATE TRIGGER DDL.
    display_triggers: Mapping[str, str]
    layout: str
    #: The revision that creates the search layout.
    revision: str = POSTGRESQL.revision
    #: The tsvector column of `messages` holding each row's words (None: not stored).
    words_column: str | None = None
    #: trigger name -> (CREATE FUNCTION DDL, CREATE TRIGGER DDL) of the triggers that
    #: keep that column.
    words_triggers: Mapping[str, tuple[str, str]] = field(default_factory=dict)


def expected(app_version: int | None = None, layout: PostgreSQLLayout = POSTGRESQL) -> Expected:
    """The objects of search ``layout`` (the head's unless given), and the display
    triggers of application schema ``app_version`` (None: the newest this package
    declares)."""
    version = POSTGRESQL_TRIGGERS[-1].app_version if app_version is None else app_version
    display = postgresql_triggers(version)
    triggers = display.triggers if display is not None else ()
    return Expected(
        extensions=layout.extensions,
        functions=layout.functions,
        indexes=layout.indexes,
        display_functions={trigger.name: trigger.function_sql for trigger in triggers},
        display_triggers={trigger.name: trigger.trigger_sql for trigger in triggers},
        layout=layout.marker,
        revision=layout.revision,
        words_column=layout.words_column,
        words_triggers={
            trigger.name: (trigger.function_sql, trigger.trigger_sql)
            for trigger in layout.row_triggers
        },
    )


#: The revision that first creates the search objects.
FIRST_LAYOUT_REVISION = min(POSTGRESQL_LAYOUTS.values(), key=lambda x: x.version).revision


def origin(kind: str, name: str, create: str) -> str:
    """The oldest search-layout revision that creates ``name`` (a "function" or an
    "index") with this definition: the one a message about it names."""
    for layout in sorted(POSTGRESQL_LAYOUTS.values(), key=lambda x: x.version):
        declared = layout.functions if kind == "function" else layout.indexes
        if declared.get(name) == create:
            return layout.revision
    return POSTGRESQL.revision


def applied_layout(applied: set[str]) -> PostgreSQLLayout | None:
    """The newest search layout whose revision the store has run (None: none yet)."""
    found = [layout for layout in POSTGRESQL_LAYOUTS.values() if layout.revision in applied]
    return max(found, key=lambda layout: layout.version) if found else None


def _normal(sql: str) -> str:
    return " ".join(sql.split())


def ddl(revision_sql: str, schema: str = "") -> str:
    """A revision's DDL as the server is sent it: `{schema}` filled in, `\\:` unescaped
    (Alembic's op.execute runs it as a text() construct)."""
    return revision_sql.format(schema=schema).replace("\\:", ":")


def function_body(create_sql: str) -> str:
    """The body of a CREATE FUNCTION ... AS $$ body $$ (what pg_proc.prosrc holds)."""
    first, last = create_sql.index("$$"), create_sql.rindex("$$")
    return _normal(create_sql[first + 2 : last])


def index_expression(create_sql: str, schema: str) -> str:
    """A CREATE INDEX statement reduced to what it builds: no CONCURRENTLY / IF NOT EXISTS,
    no schema before the table name (pg_get_indexdef names it)."""
    sql = _normal(create_sql)
    sql = sql.replace(" CONCURRENTLY", "").replace(" IF NOT EXISTS", "")
    return re.sub(rf" ON {re.escape(schema)}\.", " ON ", sql)


def _schema_of_extension(conn: Connection, name: str) -> str | None:
    found = conn.execute(
        text("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = :n"),
        {"n": name},
    ).scalar()
    return None if found is None else str(found)


def _function_sources(conn: Connection) -> dict[str, tuple[str, str]]:
    """ "name(args)" -> (prosrc, provolatile) of each function in the current schema."""
    rows = conn.execute(
        text(
            "SELECT p.oid::regprocedure::text, p.prosrc, p.provolatile FROM pg_proc p"
            " WHERE p.pronamespace = current_schema()::regnamespace"
        )
    )
    return {str(sig): (str(src), str(vol)) for sig, src, vol in rows}


def _indexes(conn: Connection, tables: list[str]) -> dict[str, tuple[str, bool, bool, str]]:
    """index name -> (definition, valid, ready, access method) of the tables' indexes."""
    rows = conn.execute(
        text(
            "SELECT i.relname, pg_get_indexdef(x.indexrelid), x.indisvalid, x.indisready,"
            " am.amname"
            " FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " JOIN pg_class t ON t.oid = x.indrelid JOIN pg_am am ON am.oid = i.relam"
            " WHERE t.relnamespace = current_schema()::regnamespace"
            " AND t.relname = ANY(:tables) ORDER BY i.relname"
        ),
        {"tables": tables},
    )
    return {str(n): (str(d), bool(v), bool(r), str(am)) for n, d, v, r, am in rows}


def _triggers(conn: Connection) -> dict[str, tuple[str, str]]:
    """trigger name -> (enabled flag, function) of the triggers on messages."""
    rows = conn.execute(
        text(
            "SELECT tgname, tgenabled, tgfoid::regproc::text FROM pg_trigger"
            " WHERE tgrelid = 'messages'::regclass AND NOT tgisinternal"
        )
    )
    return {str(name): (str(enabled), str(function)) for name, enabled, function in rows}


def _signature(name: str) -> str:
    """ "hermes_search_document(text, text, text)" as regprocedure prints it (no spaces)."""
    return name.replace(" ", "")


def search_index_states(conn: Connection) -> dict[str, str]:
    """Each search index of the store's layout (its marker's; the head's when it has none
    of this package): "valid", "invalid" (an interrupted concurrent build) or "missing"."""
    marker = conn.execute(
        text("SELECT value FROM state_meta WHERE key = :key"), {"key": LAYOUT_MARKER}
    ).scalar()
    layout = next((x for x in POSTGRESQL_LAYOUTS.values() if x.marker == marker), POSTGRESQL)
    names = list(layout.indexes)
    rows = conn.execute(
        text(
            "SELECT i.relname, x.indisvalid AND x.indisready FROM pg_index x"
            " JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE i.relnamespace = current_schema()::regnamespace AND i.relname = ANY(:names)"
        ),
        {"names": names},
    )
    found = {str(name): bool(valid) for name, valid in rows}
    if conn.in_transaction():
        conn.rollback()
    return {
        name: "missing" if name not in found else "valid" if found[name] else "invalid"
        for name in names
    }


def applied_revisions(conn: Connection) -> set[str]:
    """Every revision the store has run: its heads in alembic_version and their ancestors."""
    heads, _version, _layout = facts(conn)
    if not heads:
        return set()
    return {script.revision for script in script_directory().iterate_revisions(heads, "base")}


class _Report:
    """Collects checks into a CheckResult: each item checked, with its problem if any."""

    def __init__(self) -> None:
        self.result = CheckResult(fts_checked_on="server")

    def __call__(self, item: str, problem: str | None) -> None:
        self.result.checked.append(item)
        if problem:
            self.result.problems[item] = problem


def check_server(conn: Connection, *, quick: bool = False) -> CheckResult:
    """Check a PostgreSQL store's indexes and search mechanism (read-only).

    Items are named like the SQLite check's ("index messages_fts", "function
    hermes_search_words(text)", "trigger messages_display_order_insert"). The search
    objects are expected once the store has run the search layout's revision, the display
    triggers once it is at an application version that declares them; before, they are
    listed as not checked. ``quick`` skips the amcheck verification of B-tree indexes, the
    one check that reads them whole.
    """
    report = _Report()
    applied = applied_revisions(conn)
    layout = applied_layout(applied)
    want = expected(newest_app_version(applied), layout or POSTGRESQL)
    tables = store_tables(conn)
    schema = str(conn.execute(text("SELECT current_schema()")).scalar_one())
    sources = _function_sources(conn)
    indexes = _indexes(conn, tables)
    if layout is not None:
        _check_search(conn, want, report, sources, indexes, schema)
        if want.words_column is not None:
            _check_words(conn, want, report, sources)
    else:
        report.result.skipped["search indexes"] = (
            f"the store has not run revision {FIRST_LAYOUT_REVISION}, which creates them: "
            "run `hermes-store upgrade`"
        )
    declared = declared_at(applied)
    for name, (_definition, valid, ready, _am) in indexes.items():
        if name not in want.indexes:
            report(f"index {name}", _validity(valid, ready))
    for obj in declared:
        if obj.kind == "index" and obj.name not in indexes:
            report(obj.label, "missing: --repair creates it again (CONCURRENTLY)")
    triggers = [obj.name for obj in declared if obj.kind == "trigger"]
    if triggers:
        _check_display(conn, want, report, sources, triggers)
    else:
        report.result.skipped["display triggers"] = (
            f"the store is below application schema {DISPLAY_VERSION}, which creates them"
        )
    _check_btrees(conn, report, indexes, quick=quick)
    _check_upkeep(conn, report, tables)
    if conn.in_transaction():
        conn.rollback()
    return report.result


#: The item under which pending lists that could not be measured are listed.
PENDING_ITEM = "GIN pending lists"


def _check_upkeep(conn: Connection, report: _Report, tables: list[str]) -> None:
    """The planner's statistics of each table, and each GIN index's pending list (see
    :mod:`hermes_store.postgresql.upkeep` for the thresholds)."""
    for table in tables:
        report(f"statistics {table}", upkeep.statistics_problem(conn, table))
    gin = upkeep.gin_indexes(conn, tables)
    if not gin:
        return
    pending = upkeep.pending_lists(conn, [name for name, _table in gin])
    page = upkeep.block_size(conn)
    if isinstance(pending, str):
        _estimate_pending(conn, report, gin, pending, page)
        return
    for name, found in pending.items():
        problem = None
        if upkeep.too_long(found, page):
            problem = (
                f"{found.pages:,} pages ({found.rows:,} rows) wait in its pending list, over "
                f"{upkeep.PENDING_LIST_BYTES // 1024:,} kB, and every search reads them: "
                "run `hermes-store optimize`"
            )
        report(f"pending list {name}", problem)


def _estimate_pending(
    conn: Connection, report: _Report, gin: list[tuple[str, str]], why: str, page: int
) -> None:
    """Without pgstattuple: each pending list estimated from what a search reads; those
    that cannot be are listed as not measured, never passed."""
    unmeasured: list[tuple[str, str]] = []
    for name, table in gin:
        pages = upkeep.estimate_pending_pages(conn, name)
        if pages is None:
            unmeasured.append((name, table))
            continue
        problem = None
        if upkeep.too_long(upkeep.Pending(pages, 0), page):
            problem = (
                f"about {pages:,} pages wait in its pending list (estimated without "
                f"{upkeep.PGSTATTUPLE} from the pages a search reads), over "
                f"{upkeep.PENDING_LIST_BYTES // 1024:,} kB, and every search reads them: "
                "run `hermes-store optimize`"
            )
        report(f"pending list {name}", problem)
    if unmeasured:
        written = upkeep.written_since_vacuum(conn, sorted({table for _n, table in unmeasured}))
        since = ", ".join(f"{count:,} into {table}" for table, count in written.items())
        names = ", ".join(name for name, _table in unmeasured)
        report.result.skipped[PENDING_ITEM] = (
            f"{names}: could not be measured: {why}; rows inserted since the last vacuum, "
            f"which bound what can be pending: {since or 'unknown'}"
        )


def _check_search(
    conn: Connection,
    want: Expected,
    report: _Report,
    sources: Mapping[str, tuple[str, str]],
    indexes: Mapping[str, tuple[str, bool, bool, str]],
    schema: str,
) -> None:
    """The layout marker, extensions, functions and indexes of the search layout."""
    _revisions, _version, layout = facts(conn)
    report(
        "search layout",
        None
        if layout == want.layout
        else f"state_meta says {layout!r}, the upgrade records {want.layout!r}",
    )
    unaccent = None
    for extension in want.extensions:
        where = _schema_of_extension(conn, extension)
        if extension == "unaccent":
            unaccent = where
        report(
            f"extension {extension}",
            None if where else "not installed in this database (the search functions need it)",
        )
    for signature, create in want.functions.items():
        found = sources.get(_signature(signature))
        problem: str | None = None
        if found is None:
            problem = "missing"
        elif unaccent is None and "{schema}" in create:
            problem = None  # cannot be compared without unaccent, reported above
        elif _normal(found[0]) != function_body(ddl(create, unaccent or "")):
            problem = (
                "its definition differs from the one the "
                f"{origin('function', signature, create)} revision creates"
            )
        elif found[1] != "i":
            problem = "not IMMUTABLE: an index expression cannot use it"
        report(f"function {signature}", problem)
    for name, create in want.indexes.items():
        found_index = indexes.get(name)
        if found_index is None:
            problem = "missing: search falls back to reading every message"
        elif index_expression(found_index[0], schema) != index_expression(ddl(create), schema):
            problem = (
                f"not over the search expression of the {origin('index', name, create)} revision"
                f" ({_normal(found_index[0])})"
            )
        else:
            problem = _validity(found_index[1], found_index[2])
        report(f"index {name}", problem)


def _check_words(
    conn: Connection, want: Expected, report: _Report, sources: Mapping[str, tuple[str, str]]
) -> None:
    """The stored words (search layout 2): the column, its rows, the trigger keeping it."""
    assert want.words_column is not None
    # A search function found different makes every row's words differ: that is the
    # function's problem, named above; the rows are compared only with the functions whole.
    sample = not any(item.startswith("function ") for item in report.result.problems)
    problem = words.words_problem(conn, want.words_column, sample=sample)
    report(words.column_item(want.words_column), problem)
    triggers = _triggers(conn)
    for name, (function, _trigger) in want.words_triggers.items():
        body = sources.get(f"{name}()")
        same = body is not None and _normal(body[0]) == function_body(ddl(function))
        report(
            f"trigger {name}",
            words.trigger_problem(
                name, None if body is None else body[0], triggers.get(name), same
            ),
        )


def _repair_words(
    engine: Engine,
    auto: Connection,
    want: Expected,
    problems: Mapping[str, str],
    result: RepairResult,
) -> None:
    """The column added again if missing, each trigger keeping it created again (with its
    function, in one transaction), then the rows refilled: those without words, or every
    row whose words differ when the sample found some."""
    column = want.words_column
    if column is None:
        return
    for name, (function, trigger) in want.words_triggers.items():
        item = f"trigger {name}"
        if item in problems or words.column_item(column) in problems:
            if words.column_type(auto, column) is None:
                words.add_column(auto, column)
            with engine.begin() as tx:
                tx.execute(text(ddl(function)))
                tx.execute(text(f'DROP TRIGGER IF EXISTS "{name}" ON messages'))
                tx.execute(text(ddl(trigger)))
            if item in problems:
                result.restored[item] = problems[item]
    item = words.column_item(column)
    if item in problems:
        every_row = words.STALE in problems[item]
        filled = words.refill(auto, column, every_row=every_row)
        result.repaired[item] = f"{filled:,} rows given their words from their text"


def declared_at(applied: set[str]) -> tuple[Declared, ...]:
    """The indexes and triggers the revisions ``applied`` declare (search objects apart)."""
    version = newest_app_version(applied)
    return declared_objects(version) if version is not None else ()


def _check_display(
    conn: Connection,
    want: Expected,
    report: _Report,
    sources: Mapping[str, tuple[str, str]],
    names: list[str],
) -> None:
    """Each trigger the store's revisions declare, with its function."""
    triggers = _triggers(conn)
    for name in names:
        create = want.display_functions.get(name)
        body = sources.get(f"{name}()")
        trigger = triggers.get(name)
        problem: str | None = None
        if create is None or name not in want.display_triggers:
            problem = "declared by the revisions, but this package has no PostgreSQL definition"
        elif body is None:
            problem = "its function is missing"
        elif _normal(body[0]) != function_body(ddl(create)):
            problem = "its function differs from the one its revision creates"
        elif trigger is None:
            problem = "missing: display orders are no longer kept"
        elif trigger[0] == "D":
            problem = "disabled: display orders are no longer kept"
        elif trigger[1] != name:
            problem = f"runs {trigger[1]}, not {name}"
        report(f"trigger {name}", problem)


def _check_btrees(
    conn: Connection,
    report: _Report,
    indexes: Mapping[str, tuple[str, bool, bool, str]],
    *,
    quick: bool,
) -> None:
    """amcheck's bt_index_check on each valid B-tree index, when the extension is there."""
    amcheck = _schema_of_extension(conn, AMCHECK)
    if quick:
        report.result.skipped[AMCHECK_ITEM] = "skipped with --quick"
        return
    if amcheck is None:
        report.result.skipped[AMCHECK_ITEM] = (
            "the amcheck extension is not installed in this database (CREATE EXTENSION "
            "amcheck lets check verify the B-tree indexes)"
        )
        return
    for name, (_definition, valid, _ready, am) in indexes.items():
        if am != "btree" or not valid:
            continue
        item = f"amcheck {name}"
        try:
            with conn.begin_nested():
                conn.execute(
                    text(f"SELECT {amcheck}.bt_index_check(CAST(:name AS regclass))"),
                    {"name": name},
                )
            report(item, None)
        except DBAPIError as exc:  # the server's verdict on one index
            detail = str(getattr(exc, "orig", exc)).strip().splitlines()
            report(item, detail[0] if detail else type(exc).__name__)


def _validity(valid: bool, ready: bool) -> str | None:
    if not ready:
        return "not ready (an interrupted concurrent build); --repair rebuilds it"
    if not valid:
        return "invalid (an interrupted concurrent build or reindex); --repair rebuilds it"
    return None


def repair_server(engine: Engine, *, quick: bool = False) -> RepairResult:
    """Rebuild each invalid index (REINDEX INDEX CONCURRENTLY), create again each missing
    index the revisions declare, re-create each missing or different search function,
    search index and display trigger from its revision's DDL, then check again. Writes are
    never blocked: index builds run CONCURRENTLY. An index the rows refuse (a unique one
    they violate) is named in ``not_repaired`` and the rest goes on."""
    with engine.connect() as conn:
        before = check_server(conn, quick=quick)
        applied = applied_revisions(conn)
        declared = {obj.label: obj for obj in declared_at(applied)}
    want = expected(newest_app_version(applied), applied_layout(applied) or POSTGRESQL)
    result = RepairResult(before=before, after=before)
    if before.ok:
        return result
    with engine.connect() as conn, _server_errors():
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        schema = str(auto.execute(text("SELECT current_schema()")).scalar_one())
        problems = before.problems
        for extension in want.extensions:
            if f"extension {extension}" in problems:
                auto.execute(text(f"CREATE EXTENSION IF NOT EXISTS {extension}"))
                result.restored[f"extension {extension}"] = problems[f"extension {extension}"]
        unaccent = _schema_of_extension(auto, "unaccent") or schema
        for signature, create in want.functions.items():
            item = f"function {signature}"
            if item in problems:
                auto.execute(text(ddl(create, unaccent)))
                result.restored[item] = problems[item]
        for name, create in want.indexes.items():
            item = f"index {name}"
            if item not in problems:
                continue
            # A missing index, one over another expression, or an invalid one: dropped
            # and built again from the revision's DDL, without blocking writes.
            auto.execute(text(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"'))
            auto.execute(text(ddl(create)))
            result.repaired[name] = (
                f"built again from the {origin('index', name, create)} revision's definition"
            )
        for item, problem in problems.items():
            name = item.removeprefix("index ")
            if not item.startswith("index ") or name in want.indexes:
                continue
            if item in declared and problem.startswith("missing"):
                _create_declared_index(auto, declared[item], result)
                continue
            if LEFTOVER_COPY.search(name):
                # The new or old copy an interrupted REINDEX CONCURRENTLY left beside the
                # index it rebuilt: PostgreSQL's advice is to drop it (the index is whole).
                auto.execute(text(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"'))
                result.repaired[name] = f"dropped, left by an interrupted reindex ({problem})"
                continue
            auto.execute(text(f'REINDEX INDEX CONCURRENTLY "{name}"'))
            result.repaired[name] = f"REINDEX INDEX CONCURRENTLY ({problem})"
        for name, create in want.display_functions.items():
            item = f"trigger {name}"
            if item not in problems or name not in want.display_triggers:
                continue
            with engine.begin() as tx:  # function and trigger together, or neither
                tx.execute(text(ddl(create)))
                tx.execute(text(f'DROP TRIGGER IF EXISTS "{name}" ON messages'))
                tx.execute(text(ddl(want.display_triggers[name])))
            result.restored[item] = problems[item]
        for item in problems:
            if item.startswith("amcheck "):
                name = item.removeprefix("amcheck ")
                auto.execute(text(f'REINDEX INDEX CONCURRENTLY "{name}"'))
                result.repaired[name] = f"REINDEX INDEX CONCURRENTLY ({problems[item]})"
        _repair_words(engine, auto, want, problems, result)
        _repair_upkeep(auto, problems, result)
        if "search layout" in problems:
            result.refused = (
                "the search layout recorded in state_meta is not PostgreSQL's: run "
                "`hermes-store upgrade` (a check repairs objects, not the revision history)"
            )
    with engine.connect() as conn:
        result.after = check_server(conn, quick=quick)
    return result


def _repair_upkeep(auto: Connection, problems: Mapping[str, str], result: RepairResult) -> None:
    """What `optimize` does, for the pending lists and statistics the check found wanting:
    gin_clean_pending_list on each index named, VACUUM (ANALYZE) of each table."""
    indexes = [i.removeprefix("pending list ") for i in problems if i.startswith("pending list ")]
    tables = [i.removeprefix("statistics ") for i in problems if i.startswith("statistics ")]
    pages, _rows, _refused = upkeep.clean_pending_lists(auto, indexes)
    for name, removed in pages.items():
        result.repaired[f"pending list {name}"] = f"gin_clean_pending_list: {removed:,} pages"
    done, _not_done = upkeep.vacuum_analyze(auto, tables)
    for table in done:
        result.repaired[f"statistics {table}"] = "VACUUM (ANALYZE)"


_CREATE_INDEX = re.compile(r"^\s*CREATE\s+(UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?", re.I)


def concurrently(create_index: str) -> str:
    """A revision's CREATE INDEX as a build that does not block writes, and that does
    nothing when the index is there already."""
    return _CREATE_INDEX.sub(
        lambda m: f"CREATE {m.group(1) or ''}INDEX CONCURRENTLY IF NOT EXISTS ", create_index
    )


def _create_declared_index(auto: Connection, obj: Declared, result: RepairResult) -> None:
    """Build a missing index from its revision's DDL, CONCURRENTLY; one the rows refuse is
    dropped again (a failed concurrent build leaves an invalid index) and named."""
    try:
        auto.execute(text(concurrently(obj.sql)))
    except DBAPIError as exc:
        translated = translate_error(exc)
        if translated is not None:
            raise translated from None
        auto.execute(text(f'DROP INDEX CONCURRENTLY IF EXISTS "{obj.name}"'))
        result.not_repaired[obj.label] = (
            f"not created again: the rows of {obj.table} refuse it ({first_line(exc)}); "
            "correct them and run `hermes-store check --repair` again"
        )
        return
    result.repaired[obj.name] = "created again (CONCURRENTLY) from its revision's definition"


def first_line(exc: DBAPIError) -> str:
    """The server's one-line message: its DETAIL (which quotes row values) left out."""
    lines = str(getattr(exc, "orig", exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def _server_errors() -> Iterator[None]:
    """A repair step the server refuses: one line, without the values it may quote."""
    try:
        yield
    except DBAPIError as exc:
        translated = translate_error(exc)
        if translated is not None:
            raise translated from None
        raise StoreError(
            f"the repair stopped on PostgreSQL: {first_line(exc)}; what it did before that "
            "is kept: run `hermes-store check` to see what is left"
        ) from None


def check_of(engine: Engine, *, quick: bool = False) -> CheckResult:
    """:func:`check_server` of the store an engine opens."""
    with engine.connect() as conn:
        return check_server(conn, quick=quick)


__all__ = [
    "AMCHECK",
    "Expected",
    "applied_revisions",
    "check_of",
    "check_server",
    "concurrently",
    "ddl",
    "declared_at",
    "expected",
    "first_line",
    "function_body",
    "index_expression",
    "repair_server",
    "search_index_states",
]
