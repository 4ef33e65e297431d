"""The context windows of a page's hits on PostgreSQL (hermes_store.search.context): the
rows around each hit, read in one statement for a chunk of hits."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, any_, bindparam, case, func
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from hermes_store.models import from_server_text, to_server_text
from hermes_store.search.context import CONTENT_JSON_PREFIX, CONTEXT_CHARS, windows_of

#: The context windows' rows (hermes_store.search.context.windows_of): a NUL is stored as
#: U+FFFE here and a character of its codes as three (hermes_store.models.to_server_text),
#: so the characters that hold the first CONTEXT_CHARS; content stored as JSON whole. The
#: hits' ids are one array (``= ANY``): one text of the statement whatever their number, so
#: no IN list is written out for each search.
CONTEXT_WINDOWS = windows_of(
    lambda content: case(
        (
            func.left(content, len(CONTENT_JSON_PREFIX)) == to_server_text(CONTENT_JSON_PREFIX),
            content,
        ),
        else_=func.substr(content, 1, 3 * CONTEXT_CHARS),
    ),
    lambda hit_id: hit_id == any_(bindparam("ids", type_=ARRAY(BigInteger))),
)


def context_rows(conn: Connection, chunk: list[int]) -> list[tuple[Any, ...]]:
    """CONTEXT_WINDOWS' rows for a chunk of hits, content as the data layer gives it."""
    return [
        (hit_id, role, from_server_text(content) if isinstance(content, str) else content)
        for hit_id, role, content in conn.execute(CONTEXT_WINDOWS, {"ids": chunk})
    ]
