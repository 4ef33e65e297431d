"""The tables a search reads, the contract's options and filters, the result columns (Core)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
    String,
    bindparam,
    column,
    literal_column,
    or_,
    table,
)

from hermes_store.search.query import normalise_sort

MESSAGES = table(
    "messages",
    column("id", Integer),
    column("session_id", String),
    column("role", String),
    column("content", String),
    column("tool_name", String),
    column("tool_calls", String),
    column("timestamp", Float),
    column("active", Integer),
    column("compacted", Integer),
)
SESSIONS = table(
    "sessions",
    column("id", String),
    column("source", String),
    column("model", String),
    column("started_at", Float),
)
M = MESSAGES.alias("m")
S = SESSIONS.alias("s")


@dataclass(frozen=True)
class Filters:
    """The caller's filters, as the contract applies them."""

    include_inactive: bool = False
    source_filter: Sequence[str] | None = None
    exclude_sources: Sequence[str] | None = None
    role_filter: Sequence[str] | None = None

    def given(self, *, visibility: bool) -> tuple[bool, bool, bool, bool]:
        """Which WHERE terms apply (visibility only where the path has it): the part of a
        statement's shape the filters decide."""
        return (
            visibility and not self.include_inactive,
            self.source_filter is not None,
            self.exclude_sources is not None,
            bool(self.role_filter),
        )

    def values(self) -> dict[str, Any]:
        """The values of the filter terms' parameters."""
        return {
            "sources": list(self.source_filter or ()),
            "excluded": list(self.exclude_sources or ()),
            "roles": list(self.role_filter or ()),
        }


@dataclass(frozen=True)
class SearchOptions:
    """One search's options, declared once: what search_messages, search_store and
    Store.search take as arguments, passed whole through the pipeline and the backends."""

    query: str
    source_filter: Sequence[str] | None = None
    exclude_sources: Sequence[str] | None = None
    role_filter: Sequence[str] | None = None
    limit: int = 20
    offset: int = 0
    sort: str | None = None
    include_inactive: bool = False

    @property
    def filters(self) -> Filters:
        """The WHERE part of the options."""
        return Filters(
            self.include_inactive, self.source_filter, self.exclude_sources, self.role_filter
        )

    @property
    def page(self) -> tuple[int, int]:
        """(limit, offset) as given: each database reads a negative one as SQLite does."""
        return self.limit, self.offset

    @property
    def order(self) -> str | None:
        """``"newest"``, ``"oldest"``, or None: by rank."""
        return normalise_sort(self.sort)


def filter_criteria(given: tuple[bool, bool, bool, bool]) -> list[ColumnElement[bool]]:
    """The WHERE terms of the filters given (see Filters.given), values left as parameters."""
    visible_only, sources, excluded, roles = given
    criteria: list[ColumnElement[bool]] = []
    if visible_only:
        one = literal_column("1", Integer)
        criteria.append(or_(M.c.active == one, M.c.compacted == one))
    if sources:
        criteria.append(S.c.source.in_(bindparam("sources", expanding=True)))
    if excluded:
        criteria.append(S.c.source.not_in(bindparam("excluded", expanding=True)))
    if roles:
        criteria.append(M.c.role.in_(bindparam("roles", expanding=True)))
    return criteria


RESULT_COLUMNS = (
    M.c.session_id,
    M.c.role,
    M.c.timestamp,
    M.c.tool_name,
    S.c.source,
    S.c.model,
    S.c.started_at.label("session_started"),
)
RESULT_KEYS = (
    "session_id",
    "role",
    "timestamp",
    "tool_name",
    "source",
    "model",
    "session_started",
)
