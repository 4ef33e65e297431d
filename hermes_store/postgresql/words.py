"""The stored words of search layout 2 (revision fts2): whether a store's search reads
them, checking and refilling them.

Each `messages` row holds its words as a tsvector (lexemes and positions, no text), set by
the trigger the layout declares in the writer's own transaction. `check` verifies the
column, the trigger and its function, that no row lacks its words, and that the newest
WORDS_SAMPLE rows hold exactly what their text gives again; `--repair` creates again
what is missing and refills the rows that lack their words or hold other ones, in short
transactions that never block the agent for long.
"""

from __future__ import annotations

from sqlalchemy import Connection, String, column, select, table, text

from hermes_store.declarations import LAYOUT_MARKER, POSTGRESQL_LAYOUTS

#: How many of the newest rows `check` tokenises again to compare with their stored words.
WORDS_SAMPLE = 200
#: Ids `--repair` refills in one transaction.
REPAIR_BATCH = 2_000
#: How a check's problem says that some rows hold words their text does not give.
STALE = "other words"
#: What a row's words are, from its text (revision fts1's functions).
RECOMPUTED = "hermes_search_words(hermes_search_document(content, tool_name, tool_calls))"


def column_item(column: str) -> str:
    return f"column messages.{column}"


def column_type(conn: Connection, column: str) -> str | None:
    """The type of `messages.<column>` (None: no such column)."""
    found = conn.execute(
        text(
            "SELECT udt_name FROM information_schema.columns WHERE table_schema ="
            " current_schema() AND table_name = 'messages' AND column_name = :c"
        ),
        {"c": column},
    ).scalar()
    return None if found is None else str(found)


def words_problem(conn: Connection, column: str, *, sample: bool = True) -> str | None:
    """What is wrong with the stored words themselves, or None; ``sample``: the newest
    rows' words compared with what their text gives again."""
    kind = column_type(conn, column)
    if kind is None:
        return "missing: search cannot read the stored words; --repair adds and fills it"
    if kind != "tsvector":
        return f"of type {kind}, not tsvector; run `hermes-store upgrade` again"
    found: list[str] = []
    lacking = int(
        conn.execute(text(f'SELECT count(*) FROM messages WHERE "{column}" IS NULL')).scalar_one()
    )
    if lacking:
        found.append(f"{lacking:,} rows have no stored words, so search misses them")
    if sample:
        stale = conn.execute(
            text(
                f'SELECT id FROM (SELECT id, "{column}" AS words, {RECOMPUTED} AS now'
                " FROM messages ORDER BY id DESC LIMIT :n) newest"
                " WHERE words IS NOT NULL AND words IS DISTINCT FROM now ORDER BY id"
            ),
            {"n": WORDS_SAMPLE},
        ).scalars()
        ids = [int(i) for i in stale]
        if ids:
            shown = ", ".join(str(i) for i in ids[:10])
            found.append(
                f"{len(ids)} of the newest {WORDS_SAMPLE} rows hold {STALE} than their text "
                f"gives (ids {shown})"
            )
    if not found:
        return None
    return "; ".join(found) + ": --repair gives every such row its words from its text"


def trigger_problem(
    name: str,
    function: str | None,
    trigger: tuple[str, str] | None,
    same_body: bool,
) -> str | None:
    """What is wrong with the trigger that keeps the column, or None."""
    if function is None:
        return "its function is missing: new messages get no stored words"
    if not same_body:
        return "its function differs from the one its revision creates"
    if trigger is None:
        return "missing: new messages get no stored words"
    if trigger[0] == "D":
        return "disabled: new messages get no stored words"
    if trigger[1] != name:
        return f"runs {trigger[1]}, not {name}"
    return None


def refill(auto: Connection, column: str, *, every_row: bool) -> int:
    """Give the rows that lack their words (``every_row``: every row whose words differ
    from its text's) their words, REPAIR_BATCH ids a transaction; how many rows."""
    high = int(auto.execute(text("SELECT coalesce(max(id), 0) FROM messages")).scalar_one())
    wrong = f'"{column}" IS DISTINCT FROM {RECOMPUTED}' if every_row else f'"{column}" IS NULL'
    done, low = 0, 0
    while low < high:
        result = auto.execute(
            text(
                f'UPDATE messages SET "{column}" = {RECOMPUTED}'
                f" WHERE id > :low AND id <= :high AND ({wrong})"
            ),
            {"low": low, "high": low + REPAIR_BATCH},
        )
        done += result.rowcount
        low += REPAIR_BATCH
    return done


def add_column(auto: Connection, column: str) -> None:
    """The column, added without a default (a change of the catalogue only), waiting at
    most a moment for the table's lock."""
    auto.execute(text("SET lock_timeout = '2s'"))
    try:
        auto.execute(text(f'ALTER TABLE messages ADD COLUMN IF NOT EXISTS "{column}" tsvector'))
    finally:
        auto.execute(text("RESET lock_timeout"))


STATE_META = table("state_meta", column("key", String), column("value", String))


#: The store's search layout marker (None: no marker), as a value a statement reads.
LAYOUT = (
    select(STATE_META.c.value)
    .where(STATE_META.c.key == LAYOUT_MARKER)
    .scalar_subquery()
    .label("search_layout")
)


def reads_stored(marker: str | None) -> bool:
    """Whether a store of this layout marker reads the stored words: the marker names a
    layout that stores them (revision fts2 switches it once they are all filled and
    indexed; until then the expression index serves)."""
    return any(
        layout.marker == marker and layout.words_column is not None
        for layout in POSTGRESQL_LAYOUTS.values()
    )
