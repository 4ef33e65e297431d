"""The FTS5 query parser (hermes_store.search.query) against SQLite FTS5 itself.

Random queries over a small vocabulary, random documents likewise: evaluating the parsed
tree over the documents in Python selects exactly the rows FTS5 MATCH selects, and the
parser rejects exactly the queries FTS5 rejects.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_store.search.query import (
    NOTHING,
    And,
    Near,
    Not,
    Or,
    Phrase,
    QuerySyntaxError,
    highlight_of,
    matches,
    parse_query,
    sanitize_query,
    simplify,
    trigram_tokens,
    word_tokens,
)

WORDS = ["a", "b", "c", "ab", "Abc", "café", "cafe", "x1", "NEAR", "near", "and"]
DOC_WORDS = [*WORDS, "bc", "ca", "CAFÉ", "abcd"]
SEPARATORS = [" ", " ", "  ", ", ", "-", "_", ".", "\n"]
ATOMS = [
    *WORDS,
    "a*",
    "ab*",
    "ca*",
    '"a b"',
    '"b a"*',
    '"a, c"',
    '""',
    '"!"',
    '"x""y"',
    "AND",
    "OR",
    "NOT",
    "(",
    ")",
    "NEAR(",
    ",",
    "2",
    "0",
    "+",
    "*",
    "!",
    "-",
]

documents = st.lists(
    st.lists(
        st.tuples(st.sampled_from(DOC_WORDS), st.sampled_from(SEPARATORS)), min_size=1, max_size=8
    ).map(lambda pairs: "".join(word + sep for word, sep in pairs)),
    min_size=1,
    max_size=12,
    unique=True,
).map(lambda texts: [text.strip() for text in texts])
near_groups = st.builds(
    lambda phrases, distance: f"NEAR({' '.join(phrases)}{distance})",
    st.lists(st.sampled_from([*WORDS[:6], "a*", '"a b"', '""', '"c a"']), min_size=1, max_size=3),
    st.sampled_from(["", ", 0", ", 1", ",2", ", 3", ", 10"]),
)
queries = st.lists(
    st.sampled_from(ATOMS) | near_groups | st.just("\x00"), min_size=1, max_size=9
).map(" ".join)
glued = st.lists(st.sampled_from(ATOMS), min_size=1, max_size=6).map("".join)


@contextlib.contextmanager
def fts5(texts: list[str], tokenize: str = "") -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:")
    try:
        db.execute(f"CREATE VIRTUAL TABLE t USING fts5(content{tokenize})")
        db.executemany("INSERT INTO t(rowid, content) VALUES (?, ?)", enumerate(texts))
        yield db
    finally:
        db.close()


def fts5_rows(db: sqlite3.Connection, query: str) -> set[int] | None:
    try:
        return {row[0] for row in db.execute("SELECT rowid FROM t WHERE t MATCH ?", (query,))}
    except sqlite3.OperationalError:
        return None


def parsed_rows(query: str, texts: list[str]) -> set[int] | None:
    try:
        tree = parse_query(query)
    except QuerySyntaxError:
        return None
    assert matches(simplify(tree), ["x"]) == matches(tree, ["x"])
    return {i for i, text in enumerate(texts) if matches(tree, word_tokens(text))}


SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(documents, st.one_of(queries, glued))
def test_the_parsed_tree_selects_what_fts5_selects(texts: list[str], query: str) -> None:
    with fts5(texts) as db:
        assert parsed_rows(query, texts) == fts5_rows(db, query), query


@SETTINGS
@given(documents, st.lists(st.sampled_from([*WORDS, "a*", '"a b', "(c)", "b:", "-", "^a"])))
def test_sanitised_queries_parse_as_fts5_reads_them(texts: list[str], words: list[str]) -> None:
    query = sanitize_query(" ".join(words))
    if not query:
        return
    with fts5(texts) as db:
        assert parsed_rows(query, texts) == fts5_rows(db, query), query


TRIGRAM_ATOMS = ['"数据库"', '"据库连"', '"abc"', '"AbC"', '"ab"', "OR", "AND", "NOT", "and", "Or"]


@SETTINGS
@given(
    st.lists(
        st.sampled_from(["数据库连接", "数据", "abcd", "xabc", "ABX", "库连", "and"]), max_size=4
    )
    .map(" ".join)
    .flatmap(lambda first: st.lists(st.just(first) | st.text("数据库连接abcABX ", max_size=9))),
    st.lists(st.sampled_from(TRIGRAM_ATOMS), min_size=1, max_size=7).map(" ".join),
)
def test_trigram_queries_parse_as_fts5_reads_them(texts: list[str], query: str) -> None:
    texts = list(dict.fromkeys(texts)) or ["x"]
    with fts5(texts, ", tokenize='trigram'") as db:
        expected = fts5_rows(db, query)
    try:
        tree = parse_query(query, trigram=True)
    except QuerySyntaxError:
        assert expected is None, query
        return
    assert expected is not None, query
    found = {i for i, text in enumerate(texts) if _trigram_matches(tree, text)}
    assert found == expected, query


def _trigram_matches(tree: object, text: str) -> bool:
    folded = text.lower()
    if isinstance(tree, Phrase):
        return tree.tokens[0][0].lower() in folded
    if isinstance(tree, And):
        return all(_trigram_matches(o, text) for o in tree.operands)
    if isinstance(tree, Or):
        return any(_trigram_matches(o, text) for o in tree.operands)
    if isinstance(tree, Not):
        return _trigram_matches(tree.positive, text) and not _trigram_matches(tree.negative, text)
    return False


@pytest.mark.parametrize(
    ("query", "tree"),
    [
        (
            "a OR b c",
            Or(
                (
                    Phrase((("a", False),), (("a", False),)),
                    And(
                        (
                            Phrase((("b", False),), (("b", False),)),
                            Phrase((("c", False),), (("c", False),)),
                        )
                    ),
                )
            ),
        ),
        ('a ""', Phrase((("a", False),), (("a", False),))),
        ('a AND ""', And((Phrase((("a", False),), (("a", False),)), NOTHING))),
        ("NEAR", Phrase((("near", False),), (("NEAR", False),))),
    ],
)
def test_precedence_and_empty_phrases(query: str, tree: object) -> None:
    assert parse_query(query) == tree


def test_highlight_lists_phrases_in_query_order_with_near_groups() -> None:
    found = highlight_of(parse_query('x NOT "import os"* OR NEAR(a b, 3)'))
    assert found.phrases == (
        (("x", False),),
        (("import os", True),),
        (("a", False),),
        (("b", False),),
    )
    assert found.near == (((2, 3), 3),)
    assert found.groups == ((((0,),), ((1,),)), (((2, 3),), ()))
    assert highlight_of(parse_query("(a OR b) AND c")).groups is None


def test_tokenizers() -> None:
    assert word_tokens("Café e\u0301x a_b ﬁx") == ["cafe", "ex", "a", "b", "ﬁx"]
    assert trigram_tokens("ab") == []
    assert isinstance(parse_query("NEAR(a b, 2)"), Near)
    assert simplify(parse_query('"" NOT a')) == NOTHING
