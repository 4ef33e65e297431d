"""The word path's statements kept by shape (PostgreSQL): a kept statement is the one
built for the query, its values those the query's own build binds, the coarse tsquery's
(ranked, over the stored words) included."""

from __future__ import annotations

from typing import Any

import pytest
from parity_queries import PARITY_QUERIES
from sqlalchemy.dialects import postgresql

from hermes_store.postgresql import search
from hermes_store.postgresql.tsquery import (
    Binds,
    coarse_tsquery_of,
    coarse_tsquery_texts,
    positional,
    tsquery_of,
    tsquery_shape,
    tsquery_texts,
)
from hermes_store.search.pipeline import index_query
from hermes_store.search.query import (
    WORD_INDEX,
    Nothing,
    QuerySyntaxError,
    parse_query,
    route_query,
    simplify,
)
from hermes_store.search.schema import SearchOptions

EXTRA = [
    "NEAR(error file, 3)",
    'NEAR("import os" exit, 40)',
    "NEAR(a b c)",
    "error NOT exception",
    "(def OR class) AND NOT test*",
    'a + "b c"* d',
    '"import os" error',
    '"import os"* OR error',
    'error NOT "file not found"',
    'NEAR(error file, 3) NOT "stack trace"',
    '"one two" AND (three OR "four five six")',
]


def _word_trees() -> list[tuple[str, Any]]:
    trees = []
    for query in [str(entry["query"]) for entry in PARITY_QUERIES] + EXTRA:
        sanitized = index_query(query)
        if not sanitized:
            continue
        route = route_query(sanitized, trigram=True)
        if route.index != WORD_INDEX:
            continue
        try:
            tree = simplify(parse_query(route.match))
        except QuerySyntaxError:
            continue
        if not isinstance(tree, Nothing):
            trees.append((query, tree))
    return trees


TREES = _word_trees()


def _sql(statement: Any) -> str:
    return str(statement.compile(dialect=postgresql.psycopg.dialect()))


def test_there_are_word_queries() -> None:
    assert len(TREES) > 20


@pytest.mark.parametrize(("query", "tree"), TREES, ids=[q for q, _ in TREES])
def test_texts_are_the_binds_in_order(query: str, tree: Any) -> None:
    binds = Binds()
    tsquery_of(tree, binds)
    assert list(binds.values.values()) == tsquery_texts(tree)
    assert list(binds.values) == [f"q{n}" for n in range(len(binds.values))]


@pytest.mark.parametrize(("query", "tree"), TREES, ids=[q for q, _ in TREES])
def test_coarse_texts_are_the_binds_in_order(query: str, tree: Any) -> None:
    binds = Binds()
    tsquery_of(tree, binds)
    before = len(binds.values)
    coarse_tsquery_of(tree, binds)
    assert list(binds.values.values())[before:] == coarse_tsquery_texts(tree)


def test_there_are_positional_word_queries() -> None:
    assert sum(positional(tree) for _, tree in TREES) > 5


@pytest.mark.parametrize("stored", [True, False])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"sort": "newest"},
        {"sort": "oldest", "limit": -1},
        {"source_filter": ["cli"]},
        {"role_filter": ["user"], "include_inactive": True},
    ],
    ids=["rank", "newest", "oldest-unlimited", "sources", "roles-inactive"],
)
def test_a_kept_statement_is_the_one_built(options: dict[str, Any], stored: bool) -> None:
    search._WORD_STATEMENTS.clear()
    by_shape: dict[Any, str] = {}
    for query, tree in TREES:
        chosen = SearchOptions(query, **options)
        kept, values = search.word_statement(tree, chosen, stored=stored)
        built, binds = search._word_statement(tree, chosen, stored=stored)
        assert _sql(kept) == _sql(built), query
        by_shape.setdefault(tsquery_shape(tree), _sql(built))
        assert by_shape[tsquery_shape(tree)] == _sql(built), query
        assert {k: v for k, v in values.items() if k.startswith("q")} == binds, query
        assert set(binds) <= set(_compiled_params(built)), query


def test_a_kept_statement_is_found_again() -> None:
    search._WORD_STATEMENTS.clear()
    first = SearchOptions("error file")
    tree = simplify(parse_query("error file"))
    other = simplify(parse_query("warning disk"))
    kept, _ = search.word_statement(tree, first)
    again, values = search.word_statement(other, first)
    assert again is kept
    assert (values["q0"], values["q1"]) == ("warning", "disk")
    phrase = simplify(parse_query('"warning disk"'))
    word = simplify(parse_query("warning"))
    assert tsquery_shape(phrase) != tsquery_shape(word)  # the coarse tsquery differs


def _compiled_params(statement: Any) -> dict[str, Any]:
    return dict(statement.compile(dialect=postgresql.psycopg.dialect()).params)
