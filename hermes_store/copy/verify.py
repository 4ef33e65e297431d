"""Verifying a copy: both sides read again and compared, and searches run on both.

`verify` reads the target afresh and compares it with the source as the copy read it
(one snapshot): the revision, the row count and a checksum of every table
(``hermes_store.copy.tablesum``: computed in Python over the values the drivers return, so no
database hash function is trusted), the search markers side by side, and the hit sets of
sample searches run on both sides.

The sample searches are chosen from the source's own text, so that each has hits there:
words, a prefix, a phrase, OR and NOT, filters, inactive rows, CJK text for
the trigram index and the LIKE scan, each taken from messages spread over the store and
kept only when the source answers it with 1 to :data:`HIT_CAP` hits. Their words come
from messages, so a search is only ever named by its number and by how it was chosen.

Nothing passes by default: a comparison that could not be made (a search that failed, a
side that answered from the degraded scan, text with words but no search with hits) is
listed in ``not_checked``, and ``ok`` is then False.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, func, select, text

from hermes_store.copy.rows import CopyProgress
from hermes_store.copy.source import open_source
from hermes_store.copy.tables import (
    MARKER_PREFIX,
    REVISION_TABLES,
    count_rows,
    is_own_key,
    key_columns,
    own_filter,
    read_snapshot,
    revisions,
)
from hermes_store.copy.tablesum import table_sum
from hermes_store.engine import create_store_engine, to_url
from hermes_store.models import Base

__all__ = ["SampleSearch", "SearchCheck", "TableCheck", "Verification", "choose_searches", "verify"]

#: Messages read (spread evenly over the ids) to take the sample searches' words from.
SAMPLE_MESSAGES = 64
#: A sample search is kept when the source answers it with 1 to HIT_CAP hits: each hit
#: builds its snippet and context, and a query with 10k hits took 10 to 50 s on
#: PostgreSQL at 50k messages.
HIT_CAP = 500
#: Candidates tried for each kind of search before that kind is left out.
TRIES = 8
#: Hits asked of the target: all of them (the target may hold more with --append).
TARGET_LIMIT = 100_000
#: The search terms FTS5 (and the query sanitiser) read as operators.
_OPERATORS = frozenset({"and", "or", "not", "near"})
#: The runs of characters FTS5's unicode61 tokenizer reads as one token (letters and
#: digits), and of CJK ideographs, kana and hangul.
_TOKEN = re.compile(r"[^\W_]+")
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af]{3,}")
_JOINED = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[._-][A-Za-z0-9]+)+")


@dataclass
class TableCheck:
    """One table on both sides: rows and checksum."""

    table: str
    source_rows: int
    target_rows: int
    source_sum: str
    target_sum: str

    @property
    def equal(self) -> bool:
        return self.source_rows == self.target_rows and self.source_sum == self.target_sum


@dataclass(frozen=True)
class SampleSearch:
    """One search chosen from the source's text; ``arguments`` holds words of messages
    and is never printed (see :attr:`label`)."""

    number: int
    how: str
    arguments: dict[str, Any] = field(repr=False)
    source_ids: frozenset[int] = field(repr=False)

    @property
    def label(self) -> str:
        return f"sample search {self.number} ({self.how})"


@dataclass
class SearchCheck:
    """One sample search on both sides (named by number and how it was chosen)."""

    number: int
    how: str
    source_hits: int
    target_hits: int
    equal: bool


@dataclass
class Verification:
    """Everything compared after a copy; ``ok`` is False on any difference and on
    anything that could not be compared (``not_checked``)."""

    tables: list[TableCheck] = field(default_factory=list)
    revisions: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    markers: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    searches: list[SearchCheck] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    #: Why there is no sample search when the source holds no text to search, else None.
    no_searches: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            bool(self.tables)
            and all(check.equal for check in self.tables)
            and self.revisions[0] == self.revisions[1]
            and all(check.equal for check in self.searches)
            and not self.not_checked
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tables": [
                {
                    "table": c.table,
                    "source_rows": c.source_rows,
                    "target_rows": c.target_rows,
                    "source_checksum": c.source_sum,
                    "target_checksum": c.target_sum,
                    "equal": c.equal,
                }
                for c in self.tables
            ],
            "revision": {"source": list(self.revisions[0]), "target": list(self.revisions[1])},
            "markers": {k: {"source": s, "target": t} for k, (s, t) in self.markers.items()},
            "searches": [
                {
                    "number": s.number,
                    "chosen_as": s.how,
                    "source_hits": s.source_hits,
                    "target_hits": s.target_hits,
                    "equal": s.equal,
                }
                for s in self.searches
            ],
            "no_searches": self.no_searches,
            "not_checked": self.not_checked,
            "seconds": round(self.seconds, 3),
        }


# --------------------------------------------------------------------------------------
# Sample searches taken from the source's text
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sampled:
    """A message the sample searches take words from (never printed)."""

    id: int
    text: str
    role: str
    active: bool
    platform: str

    def words(self) -> list[str]:
        """Its words as the word index reads them, longest (so rarest) first."""
        found = {token for token in _TOKEN.findall(self.text) if _plain(token)}
        return sorted(found, key=lambda word: (-len(word), word))

    def adjacent(self) -> Iterator[tuple[str, str]]:
        tokens = _TOKEN.findall(self.text)
        for first, second in itertools.pairwise(tokens):
            if _plain(first, 3) and _plain(second, 3):
                yield first, second


def _plain(token: str, shortest: int = 4) -> bool:
    """An ASCII word the word index holds as it is, and no operator."""
    return (
        token.isascii()
        and token[0].isalpha()
        and shortest <= len(token) <= 24
        and token.lower() not in _OPERATORS
    )


def _sample(conn: Connection) -> list[_Sampled]:
    """Up to :data:`SAMPLE_MESSAGES` messages with text, spread evenly over the ids."""
    messages = Base.metadata.tables["messages"]
    sessions = Base.metadata.tables["sessions"]
    low, high = conn.execute(select(func.min(messages.c.id), func.max(messages.c.id))).one()
    if low is None:
        return []
    steps = max(SAMPLE_MESSAGES - 1, 1)
    picked: dict[int, _Sampled] = {}
    query = (
        select(
            messages.c.id,
            messages.c.content,
            messages.c.role,
            messages.c.active,
            sessions.c.source,
        )
        .join(sessions, sessions.c.id == messages.c.session_id)
        .order_by(messages.c.id)
        .limit(1)
    )
    for step in range(steps + 1):
        start = low + (high - low) * step // steps
        row = conn.execute(query.where(messages.c.id >= start)).first()
        if row is None or row[0] in picked:
            continue
        content = row[1]
        if isinstance(content, str) and content and not content.startswith("\x00"):
            picked[row[0]] = _Sampled(row[0], content, row[2], row[3] == 1, row[4])
    return list(picked.values())


Candidates = Iterator[dict[str, Any]]


def _kinds(sampled: list[_Sampled]) -> list[tuple[str, Candidates]]:
    """Each kind of sample search and its candidates, in a fixed order."""
    words = [(message, message.words()) for message in sampled]
    words = [(message, found) for message, found in words if found]
    platforms = sorted({message.platform for message in sampled})
    inactive = [(m, w) for m, w in words if not m.active] or words

    def one_word() -> Candidates:
        for _, found in words:
            yield {"query": found[0]}

    def prefix() -> Candidates:
        for _, found in words:
            if len(found[0]) >= 6:
                yield {"query": found[0][:5] + "*"}

    def two_words() -> Candidates:
        for _, found in words:
            if len(found) >= 2:
                yield {"query": f"{found[0]} {found[1]}"}

    def phrase() -> Candidates:
        for message in sampled:
            for first, second in message.adjacent():
                yield {"query": f'"{first} {second}"'}
                break

    def either() -> Candidates:
        for (_, a), (_, b) in itertools.pairwise(words):
            if a[0].lower() != b[0].lower():
                yield {"query": f"{a[0]} OR {b[0]}"}

    def without() -> Candidates:
        for (_, a), (_, b) in itertools.pairwise(words):
            if a[-1].lower() != b[-1].lower():
                yield {"query": f"{a[-1]} NOT {b[-1]}"}

    def platform() -> Candidates:
        for message, found in words:
            yield {"query": found[0], "source_filter": [message.platform]}

    def role() -> Candidates:
        for message, found in words:
            others = [p for p in platforms if p != message.platform]
            yield {
                "query": found[-1],
                "role_filter": [message.role],
                "exclude_sources": others[:1],
            }

    def inactive_rows() -> Candidates:
        for _, found in inactive:
            yield {"query": found[0], "include_inactive": True}

    def cjk(length: int) -> Callable[[], Candidates]:
        def candidates() -> Candidates:
            for message in sampled:
                for run in _CJK.findall(message.text):
                    yield {"query": run[:length]}
                    break

        return candidates

    def joined() -> Candidates:
        for message in sampled:
            for term in _JOINED.findall(message.text)[:1]:
                yield {"query": term}

    return [
        ("a word of one message", one_word()),
        ("the prefix of a word", prefix()),
        ("two words of one message", two_words()),
        ("a phrase of two adjacent words", phrase()),
        ("a word OR a word of another message", either()),
        ("a word NOT a word of another message", without()),
        ("a word, on its session's platform only", platform()),
        ("a word, in its role, another platform excluded", role()),
        ("a word, inactive rows included", inactive_rows()),
        ("three CJK characters (trigram index)", cjk(3)()),
        ("two CJK characters (LIKE scan)", cjk(2)()),
        ("a dotted or joined term", joined()),
    ]


def _hits(conn: Connection, arguments: dict[str, Any], limit: int) -> tuple[set[int], str | None]:
    """The ids a search finds, and why it degraded (None normally)."""
    from hermes_store.search import search_messages

    results = search_messages(conn, limit=limit, **arguments)
    return {int(hit["id"]) for hit in results}, results.degraded


def choose_searches(conn: Connection) -> tuple[list[SampleSearch], list[str], str | None]:
    """The sample searches, chosen from the source's text so that each has hits there.

    Returns the searches, what could not be checked (a failing or degraded source
    search, or text with words but no search with hits), and why there is no search at
    all when the source holds no text to search.
    """
    sampled = _sample(conn)
    kinds = _kinds(sampled)
    chosen: list[SampleSearch] = []
    problems: list[str] = []
    for how, candidates in kinds:
        for arguments in _first(candidates, TRIES):
            try:
                ids, degraded = _hits(conn, arguments, HIT_CAP + 1)
            except Exception as exc:
                problems.append(
                    f"sample searches: the source's search failed ({type(exc).__name__})"
                )
                return chosen, problems, None
            if degraded is not None:
                problems.append(
                    "sample searches: the source's search answers from the exact scan (its "
                    "index is damaged: `hermes-store check --db` on the source names it)"
                )
                return chosen, problems, None
            if 1 <= len(ids) <= HIT_CAP:
                chosen.append(SampleSearch(len(chosen) + 1, how, arguments, frozenset(ids)))
                break
    if chosen:
        return chosen, problems, None
    if any(message.words() or _CJK.search(message.text) for message in sampled):
        problems.append(
            "sample searches: no search built from the source's text found it in the source "
            "(its search index may be empty or broken: run `hermes-store check` on it)"
        )
        return chosen, problems, None
    return chosen, problems, "the source holds no message text to search"


def _first(candidates: Candidates, count: int) -> Iterator[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for arguments in candidates:
        if arguments in seen:
            continue
        seen.append(arguments)
        yield arguments
        if len(seen) >= count:
            return


def compare_searches(
    searches: list[SampleSearch],
    target: Connection,
    *,
    append: bool,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[SearchCheck], list[str]]:
    """Each sample search on the target, compared with the source's hits."""
    checks: list[SearchCheck] = []
    problems: list[str] = []
    for done, search in enumerate(searches, start=1):
        try:
            ids, degraded = _hits(target, search.arguments, TARGET_LIMIT)
        except Exception as exc:
            problems.append(f"{search.label}: the target's search failed ({type(exc).__name__})")
            continue
        if degraded is not None:
            problems.append(
                f"{search.label}: the target answered from the exact scan (its index is "
                "damaged: run `hermes-store check` on the target)"
            )
        # --append: the target's own rows may add hits; the source's must all be there.
        equal = search.source_ids <= ids if append else search.source_ids == ids
        checks.append(
            SearchCheck(search.number, search.how, len(search.source_ids), len(ids), equal)
        )
        if progress is not None:
            progress(done)
    return checks, problems


# --------------------------------------------------------------------------------------
# The verification
# --------------------------------------------------------------------------------------


def _state_meta_markers(conn: Connection) -> dict[str, str | None]:
    rows = conn.execute(text("SELECT key, value FROM state_meta")).all()
    return {str(k): v for k, v in rows if is_own_key(str(k)) and not k.startswith(MARKER_PREFIX)}


def verify(
    source: Connection,
    target: str,
    *,
    append: bool = False,
    progress: Callable[[CopyProgress], None] | None = None,
) -> Verification:
    """Compare the target (URL or path, read afresh) with ``source`` (a connection in the
    read transaction the copy used). With ``append`` only the target rows whose keys are
    in the source are compared."""
    started = time.perf_counter()
    result = Verification()
    engine = create_store_engine(to_url(target), create=False, wal=False)
    tables = Base.metadata.sorted_tables
    try:
        with read_snapshot(engine) as dst:
            result.revisions = (revisions(source), revisions(dst))
            totals = {t.name: count_rows(source, t) + count_rows(dst, t) for t in tables}
            total, done = sum(totals.values()), 0
            for table in tables:

                def tick(rows: int, name: str = table.name, base: int = done) -> None:
                    if progress is not None:
                        progress(
                            CopyProgress(
                                name, rows, totals[name], base + rows, total, 0, "verifying"
                            )
                        )

                where = own_filter(table)
                a = table_sum(source, table, where, progress=tick)
                if append and table.name not in REVISION_TABLES:
                    # Only the target's rows whose keys the source has: the rest are its own.
                    keys = select(*key_columns(table))
                    keys = keys if where is None else keys.where(where)
                    idents = (tuple(r) for r in source.execute(keys))
                    b = table_sum(dst, table, where, keys=idents)
                else:

                    def tick_target(rows: int, before: int = a.rows) -> None:
                        tick(before + rows)

                    b = table_sum(dst, table, where, progress=tick_target)
                tick(a.rows + b.rows)
                done += totals[table.name]
                result.tables.append(
                    TableCheck(table.name, a.rows, b.rows, a.hexdigest(), b.hexdigest())
                )
            mine, theirs = _state_meta_markers(source), _state_meta_markers(dst)
            result.markers = {k: (mine.get(k), theirs.get(k)) for k in sorted({*mine, *theirs})}
            searches, problems, result.no_searches = choose_searches(source)
            result.not_checked += problems

            def searched(count: int) -> None:
                if progress is not None:
                    of = len(searches)
                    progress(CopyProgress("messages", count, of, count, of, 0, "searching"))

            result.searches, problems = compare_searches(
                searches, dst, append=append, progress=searched
            )
            result.not_checked += problems
    finally:
        engine.dispose()
    result.seconds = time.perf_counter() - started
    return result


@contextlib.contextmanager
def _source(source: Engine | str) -> Iterator[Connection]:
    if isinstance(source, str):
        engine = open_source(to_url(source))
        try:
            with read_snapshot(engine) as conn:
                yield conn
        finally:
            engine.dispose()
        return
    with read_snapshot(source) as conn:
        yield conn


def verify_copy(
    source: Engine | str,
    target: str,
    *,
    append: bool = False,
    progress: Callable[[CopyProgress], None] | None = None,
) -> Verification:
    """Compare ``target`` with ``source`` (an engine, a path or a URL), each read in a
    read transaction of its own: see :func:`verify`."""
    with _source(source) as conn:
        return verify(conn, target, append=append, progress=progress)
