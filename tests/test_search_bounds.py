"""Search is bounded: huge and dense messages get snippets of bounded cost, every other
answer stays FTS5's own (docs/search.md, "Bounds").

The oracles are FTS5 itself: a raw ``snippet(...)`` over the store's index, or over an
in-memory table holding the window docs/search.md defines. No test times anything (the
benchmark benchmarks/test_bench_search_bounds.py does): a search that stalled as it did
(7.7 s for 1.4 MB, over 10 minutes for 10 MB) would still fail them by never ending.
"""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from hermes_store import migrate
from hermes_store.postgresql import snippets as postgresql
from hermes_store.search import search_messages
from hermes_store.search import snippet as fts5_snippet
from hermes_store.search.snippet import (
    EXACT_INSTANCES,
    WINDOW_BEFORE,
    WINDOW_CHARS,
    _Finder,
    _positions,
    _trigram_tokens,
    _word_pattern,
    _word_tokens,
    bounded_word_snippet,
    word_snippet,
)
from hermes_store.sqlite import search as sqlite
from hermes_store.store import NewMessage, Store

KB = 1024
MB = 1024 * KB
MARKS = "'>>>', '<<<', '...', 40"


def words(size: int, seed: int) -> str:
    """``size`` characters of random lower-case words, no sentence ends."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in "x" * 3000
    ]
    return " ".join(rng.choices(vocabulary, k=size // 5))[:size]


def dense(size: int) -> str:
    """``size`` characters full of the query terms (over EXACT_INSTANCES in 6 KB)."""
    return ("error docker value error exception " * (size // 35 + 1))[:size].rstrip()


def fts5(text_: str, query: str, *, trigram: bool = False) -> str:
    """FTS5's own snippet of one text (a table of its own)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        tokenize = ", tokenize='trigram'" if trigram else ""
        db.execute(f"CREATE VIRTUAL TABLE t USING fts5(content{tokenize})")
        db.execute("INSERT INTO t(rowid, content) VALUES (1, ?)", (text_,))
        rows = db.execute(f"SELECT snippet(t, 0, {MARKS}) FROM t WHERE t MATCH ?", (query,))
        return str(rows.fetchone()[0])


def documented(text_: str, term: str, *others: str) -> str:
    """The documented bounded snippet of an ASCII text for a query of words OR-ed, made by
    FTS5: the window of WINDOW_CHARS characters from WINDOW_BEFORE before the first
    occurrence of a word of the query, less a word an edge cuts, snippeted alone, with
    "..." where it cuts the text."""
    either = "|".join((term, *others))
    first = re.search(rf"(?<![0-9A-Za-z])(?:{either})(?![0-9A-Za-z])", text_, re.IGNORECASE)
    begin = max(first.start() - WINDOW_BEFORE, 0) if first else 0
    finish = min(begin + WINDOW_CHARS, len(text_))
    while 0 < begin < len(text_) and text_[begin - 1].isalnum() and text_[begin].isalnum():
        begin += 1
    if finish < len(text_) and text_[finish - 1].isalnum() and text_[finish].isalnum():
        while text_[finish - 1].isalnum():
            finish -= 1
    window = text_[begin:finish]
    query = " OR ".join((term, *others))
    snippet = fts5(window.rstrip(" "), query)  # trailing separators: as the window's last word
    if begin > 0 and not snippet.startswith("..."):
        snippet = "..." + snippet[len(window) - len(window.lstrip(" ")) :]
    if finish < len(text_) and not snippet.endswith("..."):
        snippet += "..."
    return snippet


@pytest.fixture
def head_store(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    migrate.upgrade(str(path))
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store at head on each database."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        migrate.upgrade(url)
        return url
    path = tmp_path / "state.db"
    migrate.upgrade(str(path))
    return str(path)


def fill(store: Store, contents: list[str | tuple[str, str]]) -> list[int]:
    store.create_session("s", "cli")
    ids = []
    for content in contents:
        role, body = content if isinstance(content, tuple) else ("tool", content)
        ids.append(store.append_message("s", NewMessage(role, body)))
    return ids


def fts5_answer(path: Path, table: str, query: str) -> list[tuple[int, str]]:
    """(id, snippet) of every row the index matches, in rank order: the contract's
    statement without its joins (every message here is active, in one session)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(
            f"SELECT rowid, snippet({table}, 0, {MARKS}) FROM {table} "
            f"WHERE {table} MATCH ? ORDER BY rank",
            (query,),
        ).fetchall()


# -- ordinary messages: FTS5's own answer, byte for byte -----------------------------------


ORDINARY = [
    ("user", "please check the error in docker"),
    words(5 * KB, 1) + " error docker value " + words(5 * KB, 2),
    words(40 * KB, 3) + " docker error. Error value " + words(40 * KB, 4) + " error",
    words(200 * KB, 5) + " exception value error " + words(50 * KB, 6),
    dense(4 * KB),  # about 500 instances: under EXACT_INSTANCES
    "数据库连接错误 " + words(30 * KB, 7) + " 数据库 error",
    ("assistant", "docker value exception, no error here"),
]
ORDINARY_QUERIES = [
    ("messages_fts", "error"),
    ("messages_fts", "e*"),
    ("messages_fts", "error OR docker OR value OR exception"),
    ("messages_fts", '"error value"'),
    ("messages_fts", "error NOT docker"),
    ("messages_fts_trigram", '"数据库"'),
]


def _text(hit_id: int) -> str:
    content = ORDINARY[hit_id - 1]  # the store holds them in this order, from id 1
    return content if isinstance(content, str) else content[1]


@pytest.mark.parametrize(("table", "query"), ORDINARY_QUERIES)
def test_hits_and_snippets_under_the_limits_are_fts5s_own(
    head_store: Path, table: str, query: str
) -> None:
    with Store.open(head_store) as store:
        fill(store, ORDINARY)
        hits = store.search(query.strip('"') if table == "messages_fts_trigram" else query)
    expected = fts5_answer(head_store, table, query)
    assert expected, query  # the comparison is not vacuous
    # Hits the search statement snippets itself, and longer ones (a cheap FTS5 snippet
    # has at most EXACT_INSTANCES tokens of two bytes) whose FTS5 snippet comes after.
    assert any(len(_text(hit_id).encode()) > 2 * EXACT_INSTANCES for hit_id, _ in expected)
    assert [(hit["id"], hit["snippet"]) for hit in hits] == expected


# -- huge and dense messages: the documented bounded snippet ---------------------------------


def test_a_huge_message_holding_the_term_once_gets_fts5s_own_snippet(store_url: str) -> None:
    # Within the first 131,072 characters: what PostgreSQL word-indexes of a huge message.
    big = words(100 * KB, 8) + " hugemarker " + words(MB, 9)
    with Store.open(store_url) as store:
        big_id, small_id = fill(store, [big, ("user", "small hugemarker")])
        hits = store.search("hugemarker")
    assert sorted(hit["id"] for hit in hits) == [big_id, small_id]
    snippet = next(hit["snippet"] for hit in hits if hit["id"] == big_id)
    assert snippet == fts5(big, "hugemarker") == documented(big, "hugemarker")


@pytest.mark.parametrize("size", [64 * KB, MB])
def test_a_message_full_of_the_term_gets_the_documented_bounded_snippet(
    store_url: str, size: int
) -> None:
    full = words(3 * KB, 10) + " " + dense(size)
    with Store.open(store_url) as store:
        full_id, small_id = fill(store, [full, ("user", "one error")])
        hits = store.search("error")
    assert sorted(hit["id"] for hit in hits) == [full_id, small_id]
    snippet = next(hit["snippet"] for hit in hits if hit["id"] == full_id)
    assert snippet == documented(full, "error")
    assert snippet.startswith("...")
    assert snippet.endswith("...")
    assert snippet.count(">>>error<<<") > 5


def test_a_huge_message_shows_the_window_of_its_first_instance(store_url: str) -> None:
    """Where the bounded snippet differs from FTS5's: FTS5 would show the later passage
    that holds both words; the window of the first instance holds one."""
    big = "error " + words(120 * KB, 13) + " error docker " + words(300 * KB, 14)
    with Store.open(store_url) as store:
        (big_id,) = fill(store, [big])
        hits = store.search("error OR docker")
    assert [hit["id"] for hit in hits] == [big_id]
    assert hits[0]["snippet"] == documented(big, "error", "docker")
    assert hits[0]["snippet"].startswith(">>>error<<< ")
    assert hits[0]["snippet"] != fts5(big, "error OR docker")


def test_a_ten_megabyte_message_is_searched_with_bounded_snippets(store_url: str) -> None:
    huge = dense(10 * MB)
    marked = words(64 * KB, 11) + " hugemarker " + words(10 * MB, 12)
    cjk = ("数据库连接错误信息 " * (MB // 10))[:MB]
    with Store.open(store_url) as store:
        huge_id, marked_id, cjk_id, small_id = fill(
            store, [huge, marked, cjk, ("user", "small error hugemarker 数据库连接")]
        )
        answers = {
            query: store.search(query)
            for query in [
                "error",
                "e*",
                "a* OR b* OR c* OR d* OR e* OR f* OR g* OR h*",
                '"error docker"',
                "hugemarker",
                "数据库连接",
                "数据",  # two CJK characters: the LIKE scan
            ]
        }
    expected = {
        "error": {huge_id, small_id},
        "e*": {huge_id, marked_id, small_id},
        "a* OR b* OR c* OR d* OR e* OR f* OR g* OR h*": {huge_id, marked_id, small_id},
        '"error docker"': {huge_id},
        "hugemarker": {marked_id, small_id},
        "数据库连接": {cjk_id, small_id},
        "数据": {cjk_id, small_id},
    }
    assert {query: {hit["id"] for hit in hits} for query, hits in answers.items()} == expected
    for query, hits in answers.items():
        for hit in hits:
            assert 0 < len(hit["snippet"]) < 2000, (query, hit["id"])
            assert all(len(entry["content"]) <= 200 for entry in hit["context"])
    by_id = {hit["id"]: hit["snippet"] for hit in answers["error"]}
    assert by_id[huge_id] == documented(huge, "error")
    assert ">>>hugemarker<<<" in {h["id"]: h["snippet"] for h in answers["hugemarker"]}[marked_id]
    assert ">>>数据库连接<<<" in {h["id"]: h["snippet"] for h in answers["数据库连接"]}[cjk_id]


@pytest.mark.parametrize(
    "content",
    [
        "ctxmarker " + "\ufffe\uffff\ufdd0" * 100,  # three characters each on PostgreSQL
        "ctxmarker " + "x" * 150 + "\x00" + "y" * 100,  # SQLite's substr() stops at a NUL
        "ctxmarker " + "数据" * 5000,
    ],
)
def test_context_cut_in_sql_is_the_first_200_characters(store_url: str, content: str) -> None:
    with Store.open(store_url) as store:
        fill(store, [("user", content)])
        hits = store.search("ctxmarker")
    assert [hit["context"][0]["content"] for hit in hits] == [content[:200]]


def test_a_search_leaves_the_sessions_planner_settings_as_they_were(pg_url: str) -> None:
    migrate.upgrade(pg_url)
    with Store.open(pg_url) as store:
        fill(store, [("user", "error one"), ("user", "error two")])
        with store.engine.connect() as conn:
            before = conn.execute(text("SHOW enable_seqscan")).scalar_one()
            assert len(search_messages(conn, "e*")) == 2
            assert conn.execute(text("SHOW enable_seqscan")).scalar_one() == before == "on"
            assert conn.execute(text("SHOW enable_indexscan")).scalar_one() == "on"


# -- the pieces: where instances are, and the window's snippet --------------------------------

SETTINGS = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PIECES = ["a", "ab", "abc", "B", "error", "Érror", "e\u0301rror", "x", "\u4e2d\u6587", "ß", "2"]
SEPARATORS = [" ", " ", ". ", "-", "\u0301", "\x00", "€"]


@st.composite
def texts(draw: st.DrawFn) -> str:
    pairs = st.tuples(st.sampled_from(PIECES), st.sampled_from(SEPARATORS))
    parts = draw(st.lists(pairs, max_size=200))
    return "".join(word + separator for word, separator in parts)


@st.composite
def word_phrases(draw: st.DrawFn) -> list[list[tuple[str, bool]]]:
    terms = st.tuples(
        st.sampled_from(["a", "ab", "error", "b", "e", "ÉRROR", "2", "ß"]), st.booleans()
    )
    return draw(st.lists(st.lists(terms, min_size=1, max_size=3), min_size=1, max_size=3))


@SETTINGS
@given(text_=texts(), phrases=word_phrases(), limit=st.integers(0, 6))
def test_instances_are_counted_and_found_as_the_tokenizer_finds_them(
    text_: str, phrases: list[list[tuple[str, bool]]], limit: int
) -> None:
    doc = _word_tokens(text_)
    lists = [_positions([token.text for token in doc], _word_pattern(p)) for p in phrases]
    finder = _Finder(text_, phrases, False)
    assert finder.more_than(limit) == (sum(map(len, lists)) > limit)
    first = min((pos for positions in lists for pos in positions), default=None)
    found = finder.first(range(len(phrases)))
    if first is None:
        assert found is None
    else:  # the match may take the diacritics before the token with it
        token = len(text_.encode("utf-8", "surrogatepass")[: doc[first].start].decode("utf-8"))
        assert found is not None
        assert text_[found:token].strip("\u0301") == ""


@SETTINGS
@given(
    text_=texts(), subs=st.lists(st.sampled_from(["abc", "Ab ", "中文a", "rro", "ÉRR"]), min_size=1)
)
def test_trigram_instances_are_counted_and_found_as_the_tokenizer_finds_them(
    text_: str, subs: list[str]
) -> None:
    doc = _trigram_tokens(text_)
    grams = [token.text for token in doc]
    lists = [_positions(grams, [(t.text, False) for t in _trigram_tokens(sub)]) for sub in subs]
    finder = _Finder(text_, subs, True)
    assert finder.more_than(2) == (sum(map(len, lists)) > 2)
    first = min((pos for positions in lists for pos in positions), default=None)
    found = finder.first(range(len(subs)))
    if first is None:
        assert found is None
    else:
        data = text_.encode("utf-8", "surrogatepass")
        assert found == len(data[: doc[first].start].decode("utf-8"))


@SETTINGS
@given(text_=texts(), phrases=word_phrases())
def test_a_bounded_snippet_of_a_text_its_window_holds_is_fts5s(
    text_: str, phrases: list[list[tuple[str, bool]]]
) -> None:
    """Within the window the algorithm is FTS5's own (the same as word_snippet, which
    tests/test_fts5_snippet.py holds equal to FTS5)."""
    assert len(text_) <= WINDOW_BEFORE  # the window holds it whatever its first instance
    assert bounded_word_snippet(text_, phrases) == word_snippet(text_, phrases)


def test_the_limits_are_documented() -> None:
    contract = (Path(__file__).resolve().parent.parent / "docs" / "search.md").read_text()
    section = contract.split("\n## Bounds\n", 1)[1].split("\n## ", 1)[0]
    for figure in (
        f"{sqlite.SNIPPET_EXACT_BYTES // KB} KiB",
        f"{postgresql.SNIPPET_EXACT_BYTES // KB} KiB",
        f"{fts5_snippet.EXACT_INSTANCES:,}",
        f"{WINDOW_CHARS:,}",
        f"{WINDOW_BEFORE:,}",
    ):
        assert figure in section, figure
