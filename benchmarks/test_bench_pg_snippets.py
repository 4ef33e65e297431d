"""PostgreSQL's snippets: the pure-Python reproduction against FTS5's own in memory (issue 26).

The same page of hits for both: the first 20 messages of a generated corpus (3,000
messages, ``hermes_store.demo.corpus``) that each query's route matches, their indexed text
as PostgreSQL gives it. One side makes their snippets as PostgreSQL did before, in pure
Python (``hermes_store.postgresql.snippets.pure_snippet``), the other as it does now, by the
sqlite3 module's FTS5 over just those hits (``memory_page_snippets``). No database server is
needed: both sides start from the hits' text, which is what ``snippets()`` gets.

pytest-benchmark times the in-memory side; ``extra_info`` holds the median of
interleaved rounds of both sides in milliseconds per page (``pure_ms``, ``memory_ms``) and
their ratio (``pure_over_memory``). Both sides give the same snippets (asserted); nothing
timed is asserted.

    pytest benchmarks/test_bench_pg_snippets.py --benchmark-only
"""

from __future__ import annotations

import functools
import sqlite3
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from hermes_store.declarations import SQLITE
from hermes_store.demo import corpus
from hermes_store.postgresql.snippets import memory_page_snippets, pure_snippet
from hermes_store.search.fts5_snippets import memory_indexes
from hermes_store.search.query import (
    TRIGRAM_INDEX,
    highlight_of,
    index_query,
    parse_query,
    route_query,
)

CORPUS_MESSAGES = 3000
HITS = 20
ROUNDS = 7
QUERIES = {
    "word": "error",
    "two words": "connection timeout",
    "phrase": '"return self"',
    "prefix": "conf*",
    "boolean": "def OR class OR import",
    "NOT": "error NOT docker",
    "trigram": "습니다",
}


@functools.cache
def _documents() -> dict[int, str]:
    """Every message's indexed text (the view's expression), by id from 1."""
    generated = corpus.generate(CORPUS_MESSAGES, 0)
    return {
        i: f"{m['content'] or ''} {m['tool_name'] or ''} {m['tool_calls'] or ''}"
        for i, m in enumerate(generated.messages, 1)
    }


def _page(route: Any) -> dict[int, str]:
    """The first HITS messages the route's MATCH selects, from a full in-memory index."""
    documents = _documents()
    index = SQLITE.index(route.index)
    db = sqlite3.connect(":memory:")
    try:
        db.execute(index.inline_sql)
        db.executemany(f"INSERT INTO {index.name}(rowid, content) VALUES (?, ?)", documents.items())
        ids = [
            rowid
            for (rowid,) in db.execute(
                f"SELECT rowid FROM {index.name} WHERE {index.name} MATCH ? ORDER BY rowid LIMIT ?",
                (route.match, HITS),
            )
        ]
    finally:
        db.close()
    return {i: documents[i] for i in ids}


def _median_ms(run: Callable[[], object], others: list[Callable[[], object]]) -> list[float]:
    """Median milliseconds of ``run`` and each of ``others``, rounds interleaved."""
    times: list[list[float]] = [[] for _ in range(1 + len(others))]
    for _ in range(ROUNDS):
        for k, side in enumerate([run, *others]):
            start = time.perf_counter()
            side()
            times[k].append((time.perf_counter() - start) * 1000)
    return [statistics.median(t) for t in times]


@pytest.mark.parametrize("query_class", list(QUERIES))
def test_pg_snippets_pure_against_memory(benchmark: Any, query_class: str) -> None:
    route = route_query(index_query(QUERIES[query_class]), trigram=True)
    assert route.index is not None
    if route.index not in memory_indexes():
        pytest.skip(f"the running sqlite3 has no {route.index} tokenizer")
    page = _page(route)
    assert page, query_class  # the comparison is not vacuous
    marks = highlight_of(parse_query(route.match, trigram=route.index == TRIGRAM_INDEX))

    def pure() -> dict[int, str]:
        return {i: pure_snippet(text, route, marks) for i, text in page.items()}

    def memory() -> dict[int, str]:
        return memory_page_snippets(route, page)

    assert memory() == pure()  # the same snippets, byte for byte
    pure_ms, memory_ms = _median_ms(pure, [memory])
    benchmark.extra_info.update(
        query=QUERIES[query_class],
        hits=len(page),
        pure_ms=round(pure_ms, 3),
        memory_ms=round(memory_ms, 3),
        pure_over_memory=round(pure_ms / memory_ms, 1) if memory_ms else None,
    )
    print(
        f"\n{query_class}: {len(page)} hits, pure {pure_ms:.2f} ms, in-memory FTS5 "
        f"{memory_ms:.2f} ms, ratio {pure_ms / memory_ms:.1f}x"
    )
    benchmark(memory)
