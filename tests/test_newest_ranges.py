"""A ranked word search on PostgreSQL reads its newest matches range by range, from the
newest ids down (hermes_store.postgresql.newest): its pages are those of reading every
match, wherever the ranges fall.

The ranges are placed by the store's newest id as the statement starts (``top``); any
value gives the same answer, since the ranges and the rest always cover every id. So each
page is asked with ``top`` swept across the store's ids and compared with the page read
from every match at once (no ``top``: the ranges empty, every match the rest). The window
is made small so that this corpus has ranges the first one does not fill; the sweep is
checked to reach each way the ranges can be read.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from test_search_postgresql import stores  # noqa: F401  (the module's stores, copied)
from test_word_statements import TREES  # every word query of the parity set, and more

from hermes_store.postgresql import newest, search
from hermes_store.postgresql.reads import rows_by_index
from hermes_store.search.schema import SearchOptions

#: The window here: pages of 3 and 5 rows need 4 to 8 matches, against ranges of 64-128
#: and 512-1,024 ids.
WINDOW = 4
PAGES = ((3, 0), (5, 3), (5, 0))


def _page(conn: Any, tree: Any, options: SearchOptions, top: int | None) -> list[int]:
    rows = rows_by_index(conn, lambda _read: search.word_statement(tree, options, top=top))
    assert rows is not None
    return [int(row["id"]) for row in rows]


def _ways(matches: list[int], top: int, need: int) -> str:
    """Which ranges a search whose matches are ``matches`` (ids) reads with ``top``."""
    values = newest.floors(top, need)
    floor0, floor1 = values["floor0"], values["floor1"]
    first = min(sum(1 for match in matches if match > floor0), need)
    if first >= need:
        return "first"
    if first * newest.SPAN_RATIO < need:
        return "first, rest"
    second = min(sum(1 for match in matches if floor1 < match <= floor0), need)
    return "first, second" if first + second >= need else "first, second, rest"


def test_every_page_is_the_one_read_from_every_match(
    stores: tuple[Engine, Engine],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(search, "RANK_WINDOW", WINDOW)
    _, server = stores
    ways: set[str] = set()
    compared = 0
    with server.connect() as conn:
        top_id = int(conn.execute(text("SELECT max(id) FROM messages")).scalar_one())
        tops = sorted({0, 40, 90, 150, 220, 300, 400, top_id // 2, top_id, top_id + 500})
        for query, tree in TREES:
            everything = SearchOptions(query, limit=-1)
            matches = _page(conn, tree, everything, None)
            for limit, offset in PAGES:
                options = SearchOptions(query, limit=limit, offset=offset)
                expected = _page(conn, tree, options, None)
                need = max(WINDOW, limit + offset)
                for top in tops:
                    assert _page(conn, tree, options, top) == expected, (query, limit, offset, top)
                    ways.add(_ways(matches, top, need))
                    compared += 1
    assert compared > 500
    assert ways == {"first", "first, rest", "first, second", "first, second, rest"}


def test_a_page_past_the_window_and_every_match_are_those_of_every_match(
    stores: tuple[Engine, Engine],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page that ends past the window needs that many matches; no limit reads them all."""
    monkeypatch.setattr(search, "RANK_WINDOW", WINDOW)
    _, server = stores
    query, tree = next((query, tree) for query, tree in TREES if query == "def")
    with server.connect() as conn:
        top_id = int(conn.execute(text("SELECT max(id) FROM messages")).scalar_one())
        for options in (SearchOptions(query, limit=10, offset=30), SearchOptions(query, limit=-1)):
            expected = _page(conn, tree, options, None)
            assert expected
            for top in (50, top_id // 3, top_id):
                assert _page(conn, tree, options, top) == expected
