"""The plain values the Store API takes and returns: frozen dataclasses, never ORM objects.

A record is a copy of one row, taken inside the call's own transaction. It stays usable
after that transaction, the ORM session and the store are closed, and it can never load
anything lazily (no relationship to follow, nothing to expire). Changing a record changes
nothing in the store: writes go through :class:`~hermes_store.store.Store` methods, or
through the ORM models in ``Store.orm_writer()``.

Field names are the ORM attribute names (``hermes_store.models``), except that
``messages._compressed_summary`` is ``compressed_summary``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

R = TypeVar("R")
T = TypeVar("T", bound=type)


def _fields_in_a_base(cls: T) -> T:
    """The record class, its fields' slots moved to a base class of their own.

    Applied under ``@dataclass(frozen=True, slots=True)``, which then adds no slots of its
    own. :func:`row_reader` fills instances of a twin of that base and makes them records
    by changing their class: between two classes whose slots live in one shared base, that
    change is a check of the base, where two unrelated classes with the same slots had
    their slot lists compared (80 ns of the 470 ns a 26-field message record cost).
    """
    base = type(
        f"_{cls.__name__}Fields",
        (),
        {"__slots__": tuple(cls.__annotations__), "__module__": cls.__module__},
    )
    namespace = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    return type(cls.__name__, (base,), namespace)  # type: ignore[return-value]


@dataclass(frozen=True)
class NewMessage:
    """A message to append; ``content`` may be text or a list of multimodal parts."""

    role: str
    content: str | list[Any] | None = None
    tool_calls: str | list[dict[str, Any]] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    timestamp: float | None = None
    token_count: int | None = None
    finish_reason: str | None = None
    reasoning: str | None = None
    platform_message_id: str | None = None


@dataclass(frozen=True)
class SessionSummary:
    """A row of the session list: the session and its counters."""

    id: str
    source: str
    title: str | None
    model: str | None
    started_at: float
    ended_at: float | None
    message_count: int
    tool_call_count: int
    parent_session_id: str | None


@dataclass(frozen=True, slots=True)
@_fields_in_a_base
class AgentSessionRecord:
    """Every column of one agent session (a `sessions` row) as the store held it."""

    id: str
    source: str
    user_id: str | None
    session_key: str | None
    chat_id: str | None
    chat_type: str | None
    thread_id: str | None
    display_name: str | None
    origin_json: str | None
    expiry_finalized: int | None
    model: str | None
    model_config: str | None
    system_prompt: str | None
    parent_session_id: str | None
    started_at: float
    ended_at: float | None
    end_reason: str | None
    message_count: int | None
    tool_call_count: int | None
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    reasoning_tokens: int | None
    cwd: str | None
    git_branch: str | None
    git_repo_root: str | None
    billing_provider: str | None
    billing_base_url: str | None
    billing_mode: str | None
    estimated_cost_usd: float | None
    actual_cost_usd: float | None
    cost_status: str | None
    cost_source: str | None
    pricing_version: str | None
    title: str | None
    api_call_count: int | None
    handoff_state: str | None
    handoff_platform: str | None
    handoff_error: str | None
    compression_failure_cooldown_until: float | None
    compression_failure_error: str | None
    compression_fallback_streak: int
    rewind_count: int
    archived: int
    git_metadata_generation: int
    title_source: str | None
    last_activity_at: float | None
    last_activity_description: str | None
    last_activity_provenance: str | None
    compression_ineffective_count: int
    compression_recovery_deadline: float | None
    profile_name: str | None
    pinned: int
    hidden: int
    last_read_at: float | None
    tool_names: str | None
    system_prompt_hash: str | None
    created_source: str | None
    compression_overload_streak: int
    transport_profile: str | None

    def __repr__(self) -> str:
        return (
            f"AgentSessionRecord(id={self.id!r}, source={self.source!r}, "
            f"messages={self.message_count})"
        )


@dataclass(frozen=True, slots=True)
@_fields_in_a_base
class MessageRecord:
    """Every column of one message (a `messages` row) as the store held it.

    ``content`` is the stored text: multimodal content keeps the legacy prefix
    (``store.MULTIMODAL_PREFIX``) followed by the JSON list of parts.
    """

    id: int
    session_id: str
    role: str
    content: str | None
    tool_call_id: str | None
    tool_calls: str | None
    tool_name: str | None
    effect_disposition: str | None
    timestamp: float
    token_count: int | None
    finish_reason: str | None
    reasoning: str | None
    reasoning_content: str | None
    reasoning_details: str | None
    codex_reasoning_items: str | None
    codex_message_items: str | None
    platform_message_id: str | None
    observed: int | None
    active: int
    compacted: int
    compressed_summary: int
    api_content: str | None
    display_kind: str | None
    display_metadata: str | None
    display_identity: bytes | None
    display_order: int | None

    def __repr__(self) -> str:
        return f"MessageRecord(id={self.id!r}, session_id={self.session_id!r}, role={self.role!r})"


def row_reader(record: type[R]) -> Callable[[Iterable[Sequence[Any]]], list[R]]:
    """A function that turns rows (one value per field, in order) into ``record`` objects.

    The same records as ``record(*row)``, about eight times faster: the ``__init__`` of a
    frozen dataclass sets each field through ``object.__setattr__`` (1.7 us for the 26 of
    a message here, as much as SQLite takes to read the row). Each row instead fills an
    instance of a plain twin class with the same fields (and slots), whose ``__init__``
    unpacks the row into them (the rows are mapped to it in C), and each instance then
    becomes a ``record``: frozen, equal and hashed as any other. The twin of a record made
    with :func:`_fields_in_a_base` shares that base, which makes the last step cheaper.
    """
    targets = ", ".join(f"self.{f.name}" for f in fields(record))  # type: ignore[arg-type]
    namespace: dict[str, Any] = {}
    # One unpacking assignment, written out as the dataclass module writes its own
    # __init__ methods (the names are the record's own fields, nothing from outside).
    exec(f"def __init__(self, row):\n    {targets}, = row\n", namespace)  # noqa: S102
    body: dict[str, Any] = {"__init__": namespace["__init__"]}
    base = record.__mro__[1]
    if base.__dict__.get("__slots__") == tuple(f.name for f in fields(record)):  # type: ignore[arg-type]
        bases: tuple[type, ...] = (base,)
        body["__slots__"] = ()
    else:
        bases = ()
        if "__slots__" in record.__dict__:
            body["__slots__"] = record.__dict__["__slots__"]
    twin = type(f"_{record.__name__}Row", bases, body)

    def read(rows: Iterable[Sequence[Any]]) -> list[R]:
        made: list[Any] = list(map(twin, rows))
        for obj in made:
            obj.__class__ = record
        return made

    return read
