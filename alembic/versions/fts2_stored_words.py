"""Store each message's words as a tsvector on PostgreSQL, kept by a trigger, online.

Why: the expression index of revision fts1 keeps no positions, so every phrase, NEAR or
boolean candidate had its text tokenised again to be rechecked (about 1.35 ms a
candidate) and every ranked hit again to be ranked. A stored tsvector holds the lexemes
and their positions, not the text: the message text is still stored once, in `messages`.
Phrase, NEAR, prefix and boolean queries are then answered from the GIN index over the
column, and rank reads it.

On PostgreSQL, without a table rewrite and without blocking the agent:
1. in one short transaction: the nullable column `messages.search_words` is added (no
   default: a change of the catalogue only) and the trigger `messages_search_words`
   created, which sets the column on every INSERT and on every UPDATE of content,
   tool_name or tool_calls, in the writer's own transaction. Each attempt waits at most
   LOCK_TIMEOUT (100 ms) for the table's lock, since the agent's statements queue behind
   a waiting lock request; then a random pause of LOCK_PAUSE lets them run, and it tries
   again, for LOCK_PATIENCE (three minutes) before it gives up saying what to do (at 400 ms
   an attempt, appends of 0.4-0.6 s were measured queued behind the attempts);
2. the rows already there are filled in batches of about BATCH_SECONDS each, in id
   order; each batch commits with its progress (`state_meta` key FILLED_KEY), so that a
   run killed at any point goes on where it stopped; after each batch the fill pauses
   for as long as the batch took (FILL_DUTY: it works half the time), since back to
   back its batches' WAL writes and reads made an agent's COMMIT wait for its WAL flush
   (2.06 s at 500k messages); the table is vacuumed every VACUUM_EVERY rows so that the
   old row versions' space is used again;
3. the GIN index `messages_fts_words` is built CONCURRENTLY (an invalid one an
   interrupted build left is dropped and built again);
4. the layout marker switches from 'expression' to 'stored': until then searches use
   the expression index of fts1, which stays exact throughout; after it, the column;
5. the expression index `messages_fts`, no longer read, is dropped CONCURRENTLY, and the
   table analysed.

The CONCURRENTLY steps and VACUUM take no lock the agent's reads or writes wait for, but
wait for older transactions to end: they run without lock_timeout, as long as that takes.

On SQLite this revision changes nothing: FTS5 keeps positions already.

Downgrade restores fts1's layout online as well: the expression index is built again
CONCURRENTLY (which tokenises every message once), the marker switched back, then the
GIN index over the column, the trigger, its function and the column are dropped. Nothing
is lost: the column only ever holds what the text gives again.

Revision ID: fts2
Revises: fts1
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "fts2"
down_revision: str | None = "fts1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Why this revision cannot be written out as SQL by `--sql` (offline mode).
OFFLINE_REFUSAL = "it fills the stored words in batches sized by how long each one takes"

log = logging.getLogger("alembic.runtime.migration")

MARKER_KEY = "hermes_store.fts_layout"
LAYOUT_EXPRESSION = "expression"
LAYOUT_STORED = "stored"
#: The id up to which existing rows have their words stored (removed when done).
FILLED_KEY = "hermes_store.search_words_filled_upto"

#: How long one attempt at a statement that needs the table's lock waits for it before it
#: gives up and tries again. While it waits, PostgreSQL queues every later statement on the
#: table behind it (the agent's appends too), so this bounds how long one of them queues:
#: at 400 ms, appends of 0.4-0.6 s were measured behind the attempts (500k messages).
LOCK_TIMEOUT = "100ms"
#: The pause between two attempts, drawn at random between these (seconds): the agent's
#: queued statements run in it, and a random pause does not fall into step with an agent
#: that writes or searches at a steady pace.
LOCK_PAUSE = (0.05, 0.25)
#: How long (seconds) the attempts go on before the upgrade gives up with a line that says
#: what to do: three minutes, as patient as the 400 ms attempts were (150 of them and
#: their pauses, about 200 s), and longer than an agent's longest search at fts1's layout
#: (17-83 s for a phrase at 500k messages).
LOCK_PATIENCE = 180.0
#: The time one batch of the fill aims at (its row locks are held that long).
BATCH_SECONDS = 0.2
#: The share of the fill's time spent filling: after each batch it pauses for the batch's
#: own time again (at 0.5), so the fill takes twice as long. Back to back, its batches
#: wrote WAL and read the disk without a break, and an agent's COMMIT waited for its WAL
#: flush behind them (2.06 s at 500k messages); in the pauses the agent's commits flush
#: on a disk the fill leaves alone. The fill's commits keep synchronous_commit as it is:
#: turned off for them (safe: a batch commits with its progress, a lost one is filled
#: again) it changed nothing measured (100k messages: the fill's appends' p99 0.024 s
#: off, 0.022 s on). The WAL the batches write is flushed either way (by the WAL writer
#: when not by their commits): its volume, not their waits, is what the agent's commits
#: queue behind.
FILL_DUTY = 0.5
FIRST_BATCH = 500
MAX_BATCH = 50_000
VACUUM_EVERY = 100_000

WORDS_COLUMN = "search_words"
WORDS_INDEX = "messages_fts_words"
EXPRESSION_INDEX = "messages_fts"

MESSAGES_SEARCH_WORDS_FUNCTION = """
CREATE OR REPLACE FUNCTION messages_search_words() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.search_words := hermes_search_words(
        hermes_search_document(NEW.content, NEW.tool_name, NEW.tool_calls));
    RETURN NEW;
END
$$
"""
MESSAGES_SEARCH_WORDS_TRIGGER = """
CREATE TRIGGER messages_search_words
BEFORE INSERT OR UPDATE OF content, tool_name, tool_calls ON messages
FOR EACH ROW EXECUTE FUNCTION messages_search_words()
"""
#: The column and the trigger in one transaction: a row is never written between them
#: without its words, and a trigger replaced on a resumed run leaves no gap either.
ADD_COLUMN_AND_TRIGGER = f"""
DO $do$ BEGIN
    ALTER TABLE messages ADD COLUMN IF NOT EXISTS search_words tsvector;
    DROP TRIGGER IF EXISTS messages_search_words ON messages;
    {MESSAGES_SEARCH_WORDS_TRIGGER.strip()};
END $do$
"""
DROP_TRIGGER_AND_COLUMN = """
DO $do$ BEGIN
    DROP TRIGGER IF EXISTS messages_search_words ON messages;
    ALTER TABLE messages DROP COLUMN IF EXISTS search_words;
END $do$
"""
#: One batch of the fill and its progress, in one statement (so in one transaction).
FILL_BATCH = """
WITH filled AS (
    UPDATE messages
    SET search_words = hermes_search_words(
        hermes_search_document(content, tool_name, tool_calls))
    WHERE id > :low AND id <= :high AND search_words IS NULL
    RETURNING 1
)
INSERT INTO state_meta (key, value)
SELECT :key, CAST(:high AS text) || ' ' || CAST(count(*) AS text) FROM filled
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
"""
WORDS_INDEX_DDL = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_fts_words ON messages"
    " USING gin (search_words)"
)
#: fts1's word index, repeated for the downgrade.
EXPRESSION_INDEX_DDL = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_fts ON messages USING gin"
    " (hermes_search_words(hermes_search_document(content, tool_name, tool_calls)))"
)


def _bind() -> sa.Connection:
    return op.get_bind()


def _set_marker(value: str) -> None:
    _bind().execute(
        sa.text(
            "INSERT INTO state_meta (key, value) VALUES (:key, :value)"
            " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        ),
        {"key": MARKER_KEY, "value": value},
    )


def _lock_timeout(value: str) -> str:
    """Set the session's lock_timeout; the value it had."""
    bind = _bind()
    before = str(bind.execute(sa.text("SHOW lock_timeout")).scalar())
    bind.execute(sa.text("SELECT set_config('lock_timeout', :v, false)"), {"v": value})
    return before


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error, also when an engine's error handler raised its
    own error from it."""
    seen: BaseException | None = exc
    while seen is not None:
        state = getattr(getattr(seen, "orig", seen), "sqlstate", None)
        if state:
            return str(state)
        seen = seen.__cause__ or seen.__context__
    return None


def _locked(sql: str) -> None:
    """Run a statement that needs `messages`' lock, waiting at most LOCK_TIMEOUT at a time
    (so the agent's statements never queue longer behind it), trying again after a pause
    of LOCK_PAUSE while a long transaction holds the table, for LOCK_PATIENCE."""
    bind = _bind()
    before = _lock_timeout(LOCK_TIMEOUT)
    try:
        deadline = time.monotonic() + LOCK_PATIENCE
        while True:
            try:
                bind.execute(sa.text(sql))
                return
            except Exception as exc:  # the driver's error, or what an engine made of it
                if _sqlstate(exc) != "55P03":  # lock_not_available
                    raise
            if time.monotonic() >= deadline:
                break
            time.sleep(random.uniform(*LOCK_PAUSE))
        raise RuntimeError(
            "another transaction held the messages table for over three minutes; end it (see "
            "pg_stat_activity) and upgrade again: the upgrade goes on where it stopped"
        )
    finally:
        _lock_timeout(before)


def _patient(sql: str) -> None:
    """Run a statement that takes no lock the agent's reads or writes wait for (a
    CONCURRENTLY build or drop, a VACUUM) but waits for older transactions to end: as
    long as they last, with no lock_timeout."""
    before = _lock_timeout("0")
    try:
        op.execute(sql)
    finally:
        _lock_timeout(before)


def _drop_invalid_index(name: str) -> None:
    """An interrupted concurrent build leaves an invalid index: dropped, to be built again."""
    invalid = _bind().execute(
        sa.text(
            "SELECT 1 FROM pg_index JOIN pg_class ON pg_class.oid = pg_index.indexrelid"
            " WHERE pg_class.relname = :name AND NOT pg_index.indisvalid"
        ),
        {"name": name},
    )
    if invalid.first() is not None:
        _patient(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def _filled_upto() -> int:
    value = (
        _bind()
        .execute(sa.text("SELECT value FROM state_meta WHERE key = :key"), {"key": FILLED_KEY})
        .scalar()
    )
    return int(str(value).split()[0]) if value else 0


def _fill() -> None:
    """The existing rows' words, in batches of about BATCH_SECONDS, each committed with
    its progress. Rows written since the trigger exist have theirs already (a row a
    transaction begun earlier writes now runs the trigger too: it takes the table's lock
    after the trigger's transaction committed)."""
    bind = _bind()
    high_water = int(bind.execute(sa.text("SELECT coalesce(max(id), 0) FROM messages")).scalar())
    low = _filled_upto()
    size, since_vacuum, total = FIRST_BATCH, 0, 0
    if low < high_water:
        log.info("stored words: filling messages %d to %d in batches", low + 1, high_water)
    while low < high_water:
        high = min(low + size, high_water)
        started = time.monotonic()
        bind.execute(sa.text(FILL_BATCH), {"low": low, "high": high, "key": FILLED_KEY})
        elapsed = time.monotonic() - started
        since_vacuum += high - low
        total += high - low
        low = high
        # The next batch sized so that it takes about BATCH_SECONDS.
        scale = BATCH_SECONDS / max(elapsed, 0.001)
        size = int(min(max(size * min(scale, 4.0), 100), MAX_BATCH))
        if since_vacuum >= VACUUM_EVERY:
            _patient("VACUUM messages")
            since_vacuum = 0
        if low < high_water:  # working FILL_DUTY of the time: the agent's commits flush
            time.sleep(elapsed * (1 - FILL_DUTY) / FILL_DUTY)
    if total:
        log.info("stored words: %d message ids filled", total)


def _upgrade_postgresql() -> None:
    # Every step commits on its own (autocommit): nothing holds the table's lock for
    # longer than one step's statement, and a killed run resumes at the step it was in.
    with op.get_context().autocommit_block():
        op.execute(MESSAGES_SEARCH_WORDS_FUNCTION)
        _locked(ADD_COLUMN_AND_TRIGGER)
        _fill()
        _drop_invalid_index(WORDS_INDEX)
        _patient(WORDS_INDEX_DDL)
        _set_marker(LAYOUT_STORED)
        _patient(f"DROP INDEX CONCURRENTLY IF EXISTS {EXPRESSION_INDEX}")
        _bind().execute(sa.text("DELETE FROM state_meta WHERE key = :key"), {"key": FILLED_KEY})
        _patient("VACUUM (ANALYZE) messages")


def _downgrade_postgresql() -> None:
    with op.get_context().autocommit_block():
        _drop_invalid_index(EXPRESSION_INDEX)
        _patient(EXPRESSION_INDEX_DDL)
        _set_marker(LAYOUT_EXPRESSION)
        _patient(f"DROP INDEX CONCURRENTLY IF EXISTS {WORDS_INDEX}")
        _locked(DROP_TRIGGER_AND_COLUMN)
        op.execute("DROP FUNCTION IF EXISTS messages_search_words()")
        _bind().execute(sa.text("DELETE FROM state_meta WHERE key = :key"), {"key": FILLED_KEY})


def upgrade() -> None:
    if _bind().dialect.name == "postgresql":
        _upgrade_postgresql()


def downgrade() -> None:
    if _bind().dialect.name == "postgresql":
        _downgrade_postgresql()
