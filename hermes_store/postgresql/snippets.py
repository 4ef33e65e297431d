"""The word and trigram paths' snippets on PostgreSQL, from the indexed text of the page's
hits: FTS5's own snippet(), made by the sqlite3 module's FTS5 over those texts in memory
(:mod:`hermes_store.search.fts5_snippets`), by SQLite's rules for huge messages; where
the running sqlite3 has no FTS5 (or no trigram tokenizer), the pure-Python reproduction
(:mod:`hermes_store.search.snippet`), bounded past SNIPPET_EXACT_BYTES or EXACT_INSTANCES.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hermes_store.search.fts5_snippets import memory_snippets, snippets_of
from hermes_store.search.query import TRIGRAM_INDEX, Highlight, Route
from hermes_store.search.snippet import (
    bounded_trigram_snippet,
    bounded_word_snippet,
    exact_is_bounded,
    trigram_snippet,
    word_snippet,
)

SNIPPET_TOKENS = 40
SNIPPET_MARKS = {"start": ">>>", "end": "<<<", "ellipsis": "..."}
#: Without FTS5 in the running sqlite3, a hit's snippet is FTS5's (reproduced in Python)
#: when its indexed text is at most this many bytes and holds at most
#: fts5_snippet.EXACT_INSTANCES instances of the query's phrases; otherwise bounded, as on
#: SQLite past its own (larger) limit: the Python tokenizer costs about 1 ms per 4 KB,
#: FTS5's C nothing like it. With FTS5 the limit is SQLite's (fts5_snippets).
SNIPPET_EXACT_BYTES = 64 * 1024


def _exact(text: str, phrases: Sequence[Any], *, trigram: bool) -> bool:
    """Whether a hit's snippet is FTS5's own (SNIPPET_EXACT_BYTES), not a bounded one."""
    size = (
        len(text) if len(text) > SNIPPET_EXACT_BYTES else len(text.encode("utf-8", "surrogatepass"))
    )
    return size <= SNIPPET_EXACT_BYTES and (exact_is_bounded(text, phrases, trigram=trigram))


def memory_page_snippets(route: Route, documents: dict[int, str]) -> dict[int, str]:
    """The hits' snippets by SQLite's rules (fts5_snippets.snippets_of): FTS5's own, made in
    memory, or bounded. A hit the MATCH does not select in memory (PostgreSQL's answer is
    a superset of FTS5's for some queries: docs/search.md) has none here."""
    assert route.index is not None
    texts = {hit_id: text.encode("utf-8") for hit_id, text in documents.items()}

    def fts5(ids: list[int]) -> Iterable[tuple[int, str]]:
        chosen = {hit_id: documents[hit_id] for hit_id in ids}
        return memory_snippets(str(route.index), route.match, chosen).items()

    return snippets_of(route, texts, fts5)


def pure_snippet(text: str, route: Route, marks: Highlight) -> str:
    """A hit's snippet in pure Python: FTS5's reproduced up to SNIPPET_EXACT_BYTES, bounded
    past it."""
    if route.index == TRIGRAM_INDEX:
        substrings = [phrase[0][0] for phrase in marks.phrases]
        exact = _exact(text, substrings, trigram=True)
        return (trigram_snippet if exact else bounded_trigram_snippet)(
            text, substrings, groups=marks.groups, tokens=SNIPPET_TOKENS, **SNIPPET_MARKS
        )
    exact = _exact(text, marks.phrases, trigram=False)
    return (word_snippet if exact else bounded_word_snippet)(
        text,
        marks.phrases,
        near=marks.near,
        groups=marks.groups,
        tokens=SNIPPET_TOKENS,
        **SNIPPET_MARKS,
    )
