"""The tables a search reads, the contract's filters, and the result columns, as Core."""

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

_messages = table(
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
_sessions = table(
    "sessions",
    column("id", String),
    column("source", String),
    column("model", String),
    column("started_at", Float),
)
_m = _messages.alias("m")
_s = _sessions.alias("s")


@dataclass(frozen=True)
class _Filters:
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


def _filter_criteria(given: tuple[bool, bool, bool, bool]) -> list[ColumnElement[bool]]:
    """The WHERE terms of the filters given (see _Filters.given), values left as parameters."""
    visible_only, sources, excluded, roles = given
    criteria: list[ColumnElement[bool]] = []
    if visible_only:
        one = literal_column("1", Integer)
        criteria.append(or_(_m.c.active == one, _m.c.compacted == one))
    if sources:
        criteria.append(_s.c.source.in_(bindparam("sources", expanding=True)))
    if excluded:
        criteria.append(_s.c.source.not_in(bindparam("excluded", expanding=True)))
    if roles:
        criteria.append(_m.c.role.in_(bindparam("roles", expanding=True)))
    return criteria


_RESULT_COLUMNS = (
    _m.c.session_id,
    _m.c.role,
    _m.c.timestamp,
    _m.c.tool_name,
    _s.c.source,
    _s.c.model,
    _s.c.started_at.label("session_started"),
)
_RESULT_KEYS = (
    "session_id",
    "role",
    "timestamp",
    "tool_name",
    "source",
    "model",
    "session_started",
)
