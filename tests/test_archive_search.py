"""Search over a hot store and its archives (docs/search.md, "Searching archives").

One store is filled with the parity corpus; a copy of it is split in two, the older
session trees moved (same ids, rows copied with SQLAlchemy, then deleted from the hot
copy) into an archive at head. The hot store searched with its archive must answer what
the whole store answers: the same hits, fields, snippets and context, in the same order
where the order is the timestamp's, and the same hit set by rank.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from parity_queries import PARITY_QUERIES
from sqlalchemy import Engine, delete, insert, select, text, update

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.errors import ArchiveRefused
from hermes_store.models import Base
from hermes_store.search import SearchResults
from hermes_store.store import NewMessage, Store

CORPUS_MESSAGES = 1500
CORPUS_SEED = 7
COPIED = ("system_prompts", "sessions", "messages")
SESSIONS = Base.metadata.tables["sessions"]
MESSAGES = Base.metadata.tables["messages"]


def _affordable(query: dict[str, Any]) -> dict[str, Any]:
    """test_parity's cut of its one pathological entry (FTS5's snippet is quadratic in it)."""
    return {**query, "query": "def " * 40} if query["query"] == "def " * 1000 else query


QUERIES = [_affordable(query) for query in PARITY_QUERIES]
SORTS = (None, "newest", "oldest")


def _build_original(path: Path) -> None:
    from test_parity import add_targeted_rows

    migrate.upgrade(str(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(CORPUS_MESSAGES, CORPUS_SEED))
        conn.commit()
    add_targeted_rows(path)


def _trees(engine: Engine) -> list[list[str]]:
    """The session trees (root first, then its descendants), oldest root first."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(SESSIONS.c.id, SESSIONS.c.parent_session_id, SESSIONS.c.started_at)
        ).all()
    parent = {sid: up for sid, up, _ in rows}
    started = {sid: at for sid, _, at in rows}

    def root(sid: str) -> str:
        while parent[sid] is not None and parent[sid] in parent:
            sid = parent[sid]
        return sid

    trees: dict[str, list[str]] = {}
    for sid, _, _ in sorted(rows, key=lambda row: (row[2], row[0])):
        trees.setdefault(root(sid), []).append(sid)
    return sorted(trees.values(), key=lambda tree: (started[tree[0]], tree[0]))


def copy_sessions(source: Engine, target: Engine, session_ids: Sequence[str]) -> None:
    """Copy sessions and their messages (same ids), and every system prompt, to ``target``."""
    ids = list(session_ids)
    with source.connect() as read, target.begin() as write:
        prompts = Base.metadata.tables["system_prompts"]
        have = set(
            write.execute(select(prompts.c[prompts.primary_key.columns.keys()[0]])).scalars()
        )
        rows = [dict(row) for row in read.execute(select(prompts)).mappings()]
        key = prompts.primary_key.columns.keys()[0]
        rows = [row for row in rows if row[key] not in have]
        if rows:
            write.execute(insert(prompts), rows)
        # Parents first: a session's parent is copied before it (or is not in the batch).
        sessions = [
            dict(row)
            for row in read.execute(
                select(SESSIONS).where(SESSIONS.c.id.in_(ids)).order_by(SESSIONS.c.started_at)
            ).mappings()
        ]
        moved = {row["id"] for row in sessions}
        for row in sessions:
            write.execute(insert(SESSIONS), [row])
        messages = [
            dict(row)
            for row in read.execute(select(MESSAGES).where(MESSAGES.c.session_id.in_(moved)))
            .mappings()
            .all()
        ]
        if messages:
            write.execute(insert(MESSAGES), messages)


def delete_sessions(engine: Engine, session_ids: Sequence[str]) -> None:
    ids = list(session_ids)
    with engine.begin() as conn:
        conn.execute(delete(MESSAGES).where(MESSAGES.c.session_id.in_(ids)))
        conn.execute(
            update(SESSIONS)
            .where(SESSIONS.c.parent_session_id.in_(ids))
            .values(parent_session_id=None)
        )
        conn.execute(delete(SESSIONS).where(SESSIONS.c.id.in_(ids)))


def move_sessions(hot: Path | str, archive: Path | str, session_ids: Sequence[str]) -> None:
    """What `hermes-store archive` does: copy the rows, then delete them from the hot store."""
    source, target = create_store_engine(hot, create=False), create_store_engine(archive)
    try:
        copy_sessions(source, target, session_ids)
        delete_sessions(source, session_ids)
    finally:
        source.dispose()
        target.dispose()


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The whole store, and the same data as a hot store plus one archive."""
    folder = tmp_path_factory.mktemp("archive-search")
    original = folder / "original.db"
    _build_original(original)
    hot, archive = folder / "hot.db", folder / "archive.db"
    shutil.copy(original, hot)
    migrate.upgrade(str(archive))
    engine = create_store_engine(original, create=False)
    trees = _trees(engine)
    engine.dispose()
    old = [sid for tree in trees[: len(trees) // 2] for sid in tree]
    move_sessions(hot, archive, old)
    return {"folder": folder, "original": original, "hot": hot, "archive": archive, "trees": trees}


def answer(results: SearchResults) -> tuple[list[Any], str | None, str | None]:
    return list(results), results.degraded, results.query_error


def by_id(results: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {hit["id"]: hit for hit in results}


def test_the_split_moved_whole_trees_into_the_archive(split: dict[str, Any]) -> None:
    counts = []
    for name in ("original", "hot", "archive"):
        with contextlib.closing(sqlite3.connect(split[name])) as conn:
            counts.append(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
            orphans = conn.execute(
                "SELECT count(*) FROM messages WHERE session_id NOT IN (SELECT id FROM sessions)"
            ).fetchone()[0]
            assert orphans == 0
    assert counts[1] > 0
    assert counts[2] > 0
    assert counts[1] + counts[2] == counts[0]


@pytest.mark.parametrize("query", QUERIES, ids=[repr(q)[:60] for q in QUERIES])
def test_hot_and_archive_answer_what_the_whole_store_answers(
    split: dict[str, Any], query: dict[str, Any]
) -> None:
    with (
        Store.open(split["original"]) as whole,
        Store.open(split["hot"], archives=[split["archive"]]) as both,
    ):
        expected, merged = whole.search(**query), both.search(**query)
        assert (merged.degraded, merged.query_error) == (expected.degraded, expected.query_error)
        if "rank" in (expected.order, merged.order):
            # By rank the stores' lists are fused: the same hits, every field, another order.
            options = {**query, "limit": -1, "offset": 0}
            expected, merged = whole.search(**options), both.search(**options)
            assert by_id(merged) == by_id(expected)
            assert len(merged) == len(expected)
        else:
            assert list(merged) == list(expected)


@pytest.mark.parametrize("sort", SORTS)
@pytest.mark.parametrize("query", ["def", "error OR exception", "数据库", "的", "terminal"])
def test_pages_of_the_merged_list_are_the_merged_list(
    split: dict[str, Any], query: str, sort: str | None
) -> None:
    with Store.open(split["hot"], archives=[split["archive"]]) as both:
        whole = list(both.search(query, sort=sort, limit=-1))
        assert whole, query
        pages: list[Any] = []
        for offset in range(0, len(whole) + 7, 7):
            pages += both.search(query, sort=sort, limit=7, offset=offset)
    assert pages == whole


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
)
@given(
    query=st.sampled_from(["def", "error OR exception", "数据库", "的", "import NOT os"]),
    sort=st.sampled_from(SORTS),
    limit=st.integers(-1, 40),
    offset=st.integers(-3, 400),
)
def test_any_page_is_that_slice_of_the_merged_list(
    split: dict[str, Any], query: str, sort: str | None, limit: int, offset: int
) -> None:
    with Store.open(split["hot"], archives=[split["archive"]]) as both:
        whole = list(both.search(query, sort=sort, limit=-1))
        page = list(both.search(query, sort=sort, limit=limit, offset=offset))
    start = max(offset, 0)
    assert page == (whole[start:] if limit < 0 else whole[start : start + limit])


@pytest.fixture
def overlapping(split: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Copies of the split where one hot session (with many hits) is in the archive too, as
    while an archive batch is in flight; the archive's copy says so in its model."""
    hot, archive = tmp_path / "hot.db", tmp_path / "archive.db"
    shutil.copy(split["hot"], hot)
    shutil.copy(split["archive"], archive)
    with contextlib.closing(sqlite3.connect(hot)) as conn:
        busiest = conn.execute(
            "SELECT session_id FROM messages WHERE session_id IN (SELECT id FROM sessions "
            "WHERE parent_session_id IS NULL) GROUP BY session_id ORDER BY count(*) DESC"
        ).fetchone()[0]
    source, target = create_store_engine(hot, create=False), create_store_engine(archive)
    copy_sessions(source, target, [busiest])
    source.dispose()
    with target.begin() as conn:
        conn.execute(update(SESSIONS).where(SESSIONS.c.id == busiest).values(model="in-flight"))
    target.dispose()
    return {"hot": hot, "archive": archive, "session": busiest}


@pytest.mark.parametrize("sort", SORTS)
def test_a_message_in_both_stores_counts_once_and_the_hot_copy_serves(
    split: dict[str, Any], overlapping: dict[str, Any], sort: str | None
) -> None:
    with (
        Store.open(split["original"]) as whole,
        Store.open(overlapping["hot"], archives=[overlapping["archive"]]) as both,
    ):
        expected = whole.search("def OR error OR the", sort=sort, limit=-1)
        merged = both.search("def OR error OR the", sort=sort, limit=-1)
        in_session = [hit for hit in merged if hit["session_id"] == overlapping["session"]]
        assert len(in_session) > 10
        assert {hit["model"] for hit in in_session} != {"in-flight"}
        assert len(merged) == len({hit["id"] for hit in merged}) == len(expected)
        if sort is None:
            assert by_id(merged) == by_id(expected)
        else:
            assert list(merged) == list(expected)
        # Page by page, although each page's archive hits lose the session's to the hot.
        size = max(5, len(merged) // 10)
        pages: list[Any] = []
        for offset in range(0, len(merged) + size, size):
            pages += both.search("def OR error OR the", sort=sort, limit=size, offset=offset)
        assert pages == list(merged)


def test_the_archive_is_read_further_when_the_hot_store_serves_its_best_hits(
    split: dict[str, Any], tmp_path: Path
) -> None:
    # By rank: the archive's best hits are an in-flight session's, which the hot store
    # also holds but ranks below its own; the archive's own hits come after them.
    hot, archive = tmp_path / "hot.db", tmp_path / "archive.db"
    shutil.copy(split["hot"], hot)
    shutil.copy(split["archive"], archive)
    word = "zebracorn"
    filler = " ".join(["plain filler words"] * 40)
    with Store.open(hot) as store:
        for sid, text_of in (
            ("old-only", lambda n: f"{word} {filler} {n}"),
            ("in-flight", lambda n: f"{word} {word} {word} {n}"),
            ("hot-only", lambda n: f"{word} {word} {word} {word} {word} {n}"),
        ):
            store.create_session(sid, "cli", model=sid)
            rows = [NewMessage(role="user", content=text_of(n)) for n in range(6)]
            store.append_messages(sid, rows)
    move_sessions(hot, archive, ["old-only"])
    source, target = create_store_engine(hot, create=False), create_store_engine(archive)
    copy_sessions(source, target, ["in-flight"])
    source.dispose()
    target.dispose()

    with Store.open(hot) as alone:
        alone_models = [h["model"] for h in alone.search(word, limit=-1)]
        assert alone_models == ["hot-only"] * 6 + ["in-flight"] * 6
    with Store.open(hot, archives=[archive]) as both:
        merged = both.search(word, limit=-1)
        pages: list[Any] = []
        for offset in range(0, 20, 4):
            pages += both.search(word, limit=4, offset=offset)
    # Fused by position: the hot store's first, the archive's first (not in the hot), ...
    assert [h["model"] for h in merged] == ["hot-only", "old-only"] * 6 + ["in-flight"] * 6
    assert pages == list(merged)


def test_between_archives_the_first_given_wins(
    split: dict[str, Any], overlapping: dict[str, Any], tmp_path: Path
) -> None:
    # The in-flight session only in two archives: the first given serves it.
    second = tmp_path / "second.db"
    shutil.copy(overlapping["archive"], second)
    with contextlib.closing(sqlite3.connect(second)) as conn, conn:
        conn.execute("UPDATE sessions SET model = 'second' WHERE id = ?", (overlapping["session"],))
    hot = tmp_path / "bare-hot.db"
    shutil.copy(overlapping["hot"], hot)
    engine = create_store_engine(hot, create=False)
    delete_sessions(engine, [overlapping["session"]])
    engine.dispose()
    for archives, model in (
        ([overlapping["archive"], second], "in-flight"),
        ([second, overlapping["archive"]], "second"),
    ):
        with Store.open(hot, archives=archives) as store:
            hits = store.search("def OR error", sort="newest", limit=-1)
        mine = [hit for hit in hits if hit["session_id"] == overlapping["session"]]
        assert mine
        assert {hit["model"] for hit in mine} == {model}
        assert len(hits) == len({hit["id"] for hit in hits})


def test_a_degraded_archive_makes_the_merged_answer_degraded(
    split: dict[str, Any], tmp_path: Path
) -> None:
    archive = tmp_path / "damaged.db"
    shutil.copy(split["archive"], archive)
    with contextlib.closing(sqlite3.connect(archive)) as conn, conn:
        conn.execute("DROP TABLE messages_fts_idx")
    with (
        Store.open(split["original"]) as whole,
        Store.open(split["hot"], archives=[archive]) as both,
    ):
        expected = whole.search("error", sort="newest", limit=-1)
        merged = both.search("error", sort="newest", limit=-1)
    assert [hit["id"] for hit in merged] == [hit["id"] for hit in expected]
    assert merged.degraded is not None
    assert merged.degraded.startswith(f"archive {archive}: ")
    assert "is damaged" in merged.degraded


def test_an_archive_that_cannot_be_searched_is_refused_naming_it(
    split: dict[str, Any], tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.db"
    with pytest.raises(ArchiveRefused, match=r"nowhere\.db: no such store"):
        Store.open(split["hot"], archives=[missing])
    assert not missing.exists()
    old = tmp_path / "old.db"
    migrate.upgrade(str(old), app_version=21)
    with pytest.raises(ArchiveRefused, match=r"run `hermes-store upgrade --db .*old\.db`"):
        Store.open(split["hot"], archives=[old])


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_cli_searches_the_archives_it_is_given(split: dict[str, Any]) -> None:
    import json

    result = invoke(
        "search", "def", "--db", split["hot"], "--archive", split["archive"],
        "--sort", "newest", "--limit", "1000", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with Store.open(split["original"]) as whole:
        expected = whole.search("def", sort="newest", limit=1000)
    assert [hit["id"] for hit in json.loads(result.stdout)] == [hit["id"] for hit in expected]
    hot_only = invoke("search", "def", "--db", split["hot"], "--limit", "1000", "--json")
    assert len(json.loads(hot_only.stdout)) < len(expected)


@pytest.mark.parametrize("bad", ["missing", "not a database", "old revision"])
def test_the_cli_refuses_a_bad_archive_in_one_line(
    split: dict[str, Any], tmp_path: Path, bad: str
) -> None:
    path = tmp_path / "bad.db"
    if bad == "not a database":
        path.write_text("these are not the pages of a database\n")
    elif bad == "old revision":
        migrate.upgrade(str(path), app_version=21)
    result = invoke("search", "def", "--db", split["hot"], "--archive", path)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: archive "), lines
    assert str(path) in lines[0]
    assert "Traceback" not in result.output
    if bad == "old revision":
        assert "hermes-store upgrade --db" in lines[0]
    assert bad != "missing" or not path.exists()


# --------------------------------------------------------------------------------------
# PostgreSQL: the hot store there and its archive on SQLite, and the other way round
# --------------------------------------------------------------------------------------


def _to_postgresql(path: Path, pg_url: str) -> None:
    """The store at ``path`` copied, with its ids, into the PostgreSQL database at head."""
    migrate.upgrade(pg_url)
    source = create_store_engine(path, create=False)
    server = create_store_engine(pg_url)
    with source.connect() as read, server.begin() as write:
        for name in COPIED:
            table = Base.metadata.tables[name]
            rows = [dict(row) for row in read.execute(select(table)).mappings()]
            if rows:
                write.execute(insert(table), rows)
        write.execute(
            text("SELECT setval(pg_get_serial_sequence('messages', 'id'), max(id)) FROM messages")
        )
    source.dispose()
    server.dispose()


@pytest.mark.postgresql
@pytest.mark.parametrize("on_server", ["hot", "archive"])
def test_a_store_and_its_archive_on_either_database(
    split: dict[str, Any], pg_url: str, on_server: str
) -> None:
    _to_postgresql(split[on_server], pg_url)
    hot = pg_url if on_server == "hot" else split["hot"]
    archive = pg_url if on_server == "archive" else split["archive"]
    with Store.open(split["original"]) as whole, Store.open(hot, archives=[archive]) as both:
        for query in ("def", "error OR exception", "数据库", "的"):
            for sort in SORTS:
                expected = whole.search(query, sort=sort, limit=-1)
                merged = both.search(query, sort=sort, limit=-1)
                assert merged.degraded is None
                assert merged.query_error is None
                if "rank" in (expected.order, merged.order):
                    # PostgreSQL ranks by ts_rank_cd: the same hits, in another order.
                    assert set(by_id(merged)) == set(by_id(expected)), query
                else:
                    assert [h["id"] for h in merged] == [h["id"] for h in expected], (query, sort)
                    assert [h["snippet"] for h in merged] == [h["snippet"] for h in expected]
                    assert [h["context"] for h in merged] == [h["context"] for h in expected]
                size = max(9, len(merged) // 3)
                pages: list[Any] = []
                for offset in range(0, len(merged) + size, size):
                    pages += both.search(query, sort=sort, limit=size, offset=offset)
                assert [h["id"] for h in pages] == [h["id"] for h in merged], (query, sort)
