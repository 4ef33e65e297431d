"""Deterministic, realistic Hermes agent transcripts for the demo, benchmarks and tests.

The code is here and in `content` (what the messages say); every phrase, name and table
it draws from is data, in `vocabulary.json` beside this module.
"""

from __future__ import annotations

import gc
import operator
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from hermes_store.demo import vocabulary as vocabulary_mod
from hermes_store.demo.content import EPOCH, MULTIMODAL_PREFIX, Ctx, Peer, Writer, dumps, tokens
from hermes_store.demo.sampling import below, one, quantile
from hermes_store.demo.vocabulary import SOURCES, Vocabulary

__all__ = [
    "MESSAGE_COLUMNS",
    "MULTIMODAL_PREFIX",
    "SESSION_COLUMNS",
    "SOURCES",
    "Corpus",
    "Row",
    "Transcript",
    "Value",
    "Vocabulary",
    "generate",
    "iter_transcripts",
    "populate",
]

Value: TypeAlias = str | int | float | None
"""A value of one column, as the stdlib sqlite3 driver binds it."""

Row: TypeAlias = dict[str, Value]
"""One row, keyed by column name."""

SESSION_COLUMNS: Final[tuple[str, ...]] = (
    "id",
    "source",
    "user_id",
    "session_key",
    "chat_id",
    "chat_type",
    "thread_id",
    "model",
    "model_config",
    "system_prompt",
    "parent_session_id",
    "started_at",
    "ended_at",
    "end_reason",
    "message_count",
    "tool_call_count",
    "api_call_count",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cwd",
    "git_branch",
    "git_repo_root",
    "billing_provider",
    "billing_base_url",
    "billing_mode",
    "estimated_cost_usd",
    "actual_cost_usd",
    "cost_status",
    "cost_source",
    "pricing_version",
    "title",
    "rewind_count",
    "archived",
)
"""The `sessions` columns a corpus fills: all exist in every store at schema 17 or later."""

MESSAGE_COLUMNS: Final[tuple[str, ...]] = (
    "session_id",
    "role",
    "content",
    "tool_call_id",
    "tool_calls",
    "tool_name",
    "timestamp",
    "token_count",
    "finish_reason",
    "reasoning",
    "platform_message_id",
    "observed",
    "active",
    "compacted",
)
"""The `messages` columns a corpus fills (never `id`: AUTOINCREMENT assigns it)."""


# Shares, tuned so that a 10k corpus has ~3 % rewound, ~3 % compacted, ~6 % CJK messages.
# Besides chance, every 9th session (the 2nd, 11th, ...) is in Chinese, Japanese or Korean
# in turn, and the first occasion of each rare feature is always taken (see `generate`).
# The share of English user messages that end in a CJK phrase is in `content`.
_CJK_EVERY: Final = 9
_P_CJK_SESSION: Final = 0.01
_P_REWIND_PER_TURN: Final = 0.035
_P_COMPACT_SESSION: Final = 0.1
_P_COMPRESSION_SPLIT: Final = 0.7
_P_DELEGATION: Final = 0.03
_P_OPEN_SESSION: Final = 0.015
_P_SYSTEM_NOTE: Final = 0.012
_P_ARCHIVED: Final = 0.03


@dataclass(frozen=True, repr=False)
class Transcript:
    """One session row and its message rows, in insertion order."""

    session: Row
    messages: list[Row]

    def __repr__(self) -> str:
        """Summarise without content (message text is never printed)."""
        return f"Transcript(session={self.session['id']!r}, messages={len(self.messages)})"


@dataclass(frozen=True, repr=False)
class Corpus:
    """A generated store: session rows, then message rows in id order (parents first)."""

    sessions: list[Row]
    messages: list[Row]

    def __repr__(self) -> str:
        """Summarise without content (message text is never printed)."""
        return f"Corpus(sessions={len(self.sessions)}, messages={len(self.messages)})"

    @property
    def content_bytes(self) -> int:
        """Total UTF-8 size of `messages.content`, `tool_calls` and `reasoning`."""
        total = 0
        for m in self.messages:
            for key in ("content", "tool_calls", "reasoning"):
                value = m[key]
                if isinstance(value, str):
                    total += len(value.encode("utf-8"))
        return total


# --------------------------------------------------------------------------------------
# The generator: sessions, their rows, and the structure that ties them together.
# --------------------------------------------------------------------------------------


class _Generator(Writer):
    """Builds transcripts from one seeded `random.Random`."""

    def __init__(self, seed: int, vocab: Vocabulary) -> None:
        super().__init__(seed, vocab)
        self.titles: set[str] = set()
        self.ids: set[str] = set()
        self.recent: list[str] = []
        self.calls = 0  # tool calls made in the session being built
        self.sessions = 0  # sessions started (compression children not counted)
        self.user_messages = 0
        self.rewinds = 0
        self.compactions = 0
        self.splits = 0
        self.peers = {src: [self._peer(src) for _ in range(5)] for src in SOURCES[1:]}

    def _peer(self, source: str) -> Peer:
        rng = self.rng
        chat_type = one(rng, self.vocab.sources.chat_types[source])
        if source == "telegram":
            user = self._digits(10)
            chat = user if chat_type == "dm" else "-100" + self._digits(10)
        elif source == "discord":
            user = self._digits(18)
            chat = self._digits(19)
        elif source == "slack":
            user = "U07" + self._hex(8).upper()
            chat = ("D07" if chat_type == "dm" else "C07") + self._hex(8).upper()
        else:
            user = "49" + self._digits(11) + "@s.whatsapp.net"
            chat = user if chat_type == "dm" else "12036" + self._digits(13) + "@g.us"
        return Peer(user, chat, chat_type)

    def _context(self) -> Ctx:
        rng = self.rng
        source = self.vocab.sources.weights.pick(rng)
        model = self.vocab.models.pick(rng)
        lang = self.vocab.languages.pick(rng) if rng.random() < _P_CJK_SESSION else "en"
        if self.sessions % _CJK_EVERY == 1:
            languages = tuple(self.vocab.cjk)
            lang = languages[(self.sessions // _CJK_EVERY) % len(languages)]
        self.sessions += 1
        en = self.en
        topic = (one(rng, en.paths), one(rng, en.paths), one(rng, en.idents), one(rng, en.idents))
        if source == "cli":
            cwd, root = self.vocab.projects[below(rng, len(self.vocab.projects))]
            branch = one(rng, self.en.branches) if root else None
            return Ctx(
                source,
                lang,
                model,
                None,
                None,
                cwd,
                root,
                branch,
                self.vocab.tools.cli,
                0.75,
                topic,
            )
        peer = self.peers[source][below(rng, 5)]
        thread = None
        if peer.chat_type == "thread" or (peer.chat_type == "channel" and rng.random() < 0.5):
            if source == "discord":
                thread = self._digits(19)
            else:
                thread = f"17{self._digits(8)}.{self._digits(6)}"
        return Ctx(
            source,
            lang,
            model,
            peer,
            thread,
            None,
            None,
            None,
            self.vocab.tools.gateway,
            0.45,
            topic,
        )

    def _new_id(self, t: float) -> str:
        stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime(int(t)))
        while True:
            sid = f"{stamp}_{self._hex(6)}"
            if sid not in self.ids:
                self.ids.add(sid)
                return sid

    def _title(self, ctx: Ctx, base: str | None) -> str | None:
        rng = self.rng
        if base is None:
            if rng.random() < 0.25:
                return None
            if ctx.lang != "en":
                base = self._fill(one(rng, self.vocab.cjk[ctx.lang].phrases), self._slots(ctx))[:24]
            else:
                base = self._fill(one(rng, self.en.titles), self._slots(ctx))
        title, n = base, 2
        while title in self.titles:
            title = f"{base} #{n}"
            n += 1
        self.titles.add(title)
        return title

    def run(self, n_messages: int) -> Iterator[Transcript]:
        """Yield transcripts until exactly n_messages message rows were produced."""
        rng = self.rng
        remaining = n_messages
        clock = EPOCH
        while remaining > 0:
            clock += quantile(rng, self.dist.session_gap_s)
            ctx = self._context()
            size = min(remaining, int(quantile(rng, self.dist.session_messages)))
            chunks = [size]
            if size > 160 and (not self.splits or rng.random() < _P_COMPRESSION_SPLIT):
                self.splits += 1
                chunks = []
                left = size
                while left > 0:
                    take = min(left, 80 + below(rng, 80))
                    if left - take < 10:
                        take = left
                    chunks.append(take)
                    left -= take
            parent: str | None = None
            delegated = False
            if self.recent and ctx.source == "cli" and rng.random() < _P_DELEGATION:
                parent = self.recent[below(rng, len(self.recent))]
                delegated = True
            root_title: str | None = None
            start = clock
            for i, chunk in enumerate(chunks):
                last_chunk = i == len(chunks) - 1
                is_final = last_chunk and chunk == remaining
                open_ = is_final or (last_chunk and rng.random() < _P_OPEN_SESSION)
                end = (
                    None
                    if open_
                    else (
                        "compression"
                        if not last_chunk
                        else ("delegation_complete" if delegated else None)
                    )
                )
                tr = self._session(
                    ctx, chunk, start, parent, i > 0, end, open_, root_title, delegated, i + 1
                )
                yield tr
                remaining -= chunk
                sid = str(tr.session["id"])
                parent = sid
                if i == 0 and isinstance(tr.session["title"], str):
                    root_title = tr.session["title"]
                ended = tr.session["ended_at"]
                start = (ended if isinstance(ended, float) else start) + 0.5 + rng.random() * 2
                self.recent.append(sid)
                if len(self.recent) > 20:
                    del self.recent[0]

    def _session(
        self,
        ctx: Ctx,
        size: int,
        start: float,
        parent: str | None,
        continued: bool,
        end_reason: str | None,
        open_: bool,
        parent_title: str | None,
        delegated: bool,
        part: int,
    ) -> Transcript:
        rng = self.rng
        sid = self._new_id(start)
        rows, t, rewinds = self._messages(ctx, sid, size, start, continued)
        if delegated:
            title = None
        elif continued:
            title = self._title(ctx, f"{parent_title} #{part}") if parent_title else None
        else:
            title = self._title(ctx, None)
        if end_reason is None and not open_:
            kind = "cli" if ctx.source == "cli" else "gateway"
            end_reason = self.vocab.sources.end_reasons[kind].pick(rng)
        session = self._session_row(
            ctx,
            sid,
            rows,
            start,
            None if open_ else t + 1 + rng.random() * 30,
            end_reason,
            parent,
            title,
            rewinds,
        )
        return Transcript(session, rows)

    def _session_row(
        self,
        ctx: Ctx,
        sid: str,
        rows: list[Row],
        start: float,
        ended: float | None,
        end_reason: str | None,
        parent: str | None,
        title: str | None,
        rewinds: int,
    ) -> Row:
        rng = self.rng
        system_prompt = self._system_prompt(ctx)
        context = tokens(system_prompt)
        input_tokens = output_tokens = reasoning_tokens = api_calls = 0
        for m in rows:
            tok = m["token_count"]
            assert isinstance(tok, int)
            if m["role"] == "assistant":
                api_calls += 1
                input_tokens += min(context, 180_000)
                output_tokens += tok
                reasoning = m["reasoning"]
                if isinstance(reasoning, str):
                    reasoning_tokens += tokens(reasoning)
            context += tok
        model = ctx.model
        cached = model.provider in ("anthropic", "openrouter", "openai")
        cache_read = input_tokens * (50 + below(rng, 40)) // 100 if cached else 0
        cache_write = input_tokens * below(rng, 10) // 100 if cached else 0
        cost = (input_tokens * model.price_in + output_tokens * model.price_out) / 1_000_000
        known = model.name is not None and model.provider != "custom"
        peer = ctx.peer
        session_key = None
        if peer is not None:
            session_key = f"agent:main:{ctx.source}:{peer.chat_type}:{peer.chat_id}"
            if ctx.thread_id:
                session_key += f":{ctx.thread_id}"
        config = (
            dumps({"temperature": round(rng.random(), 2), "max_tokens": 8192})
            if rng.random() < 0.6
            else None
        )
        return {
            "id": sid,
            "source": ctx.source,
            "user_id": peer.user_id if peer else None,
            "session_key": session_key,
            "chat_id": peer.chat_id if peer else None,
            "chat_type": peer.chat_type if peer else None,
            "thread_id": ctx.thread_id,
            "model": model.name,
            "model_config": config,
            "system_prompt": system_prompt,
            "parent_session_id": parent,
            "started_at": round(start, 6),
            "ended_at": round(ended, 6) if ended is not None else None,
            "end_reason": end_reason,
            "message_count": len(rows),
            "tool_call_count": self.calls,
            "api_call_count": api_calls,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_tokens": cache_read,
            "cache_write_tokens": cache_write,
            "reasoning_tokens": reasoning_tokens,
            "cwd": ctx.cwd,
            "git_branch": ctx.branch,
            "git_repo_root": ctx.repo_root,
            "billing_provider": model.provider,
            "billing_base_url": model.base_url,
            "billing_mode": "api" if model.provider else None,
            "estimated_cost_usd": round(cost, 6) if known else None,
            "actual_cost_usd": round(cost, 6) if model.provider == "openrouter" else None,
            "cost_status": "estimated" if known else "unknown",
            "cost_source": "pricing_table" if known else None,
            "pricing_version": "2025-06-01" if known else None,
            "title": title,
            "rewind_count": rewinds,
            "archived": 1 if rng.random() < _P_ARCHIVED else 0,
        }

    def _row(
        self,
        ctx: Ctx,
        sid: str,
        role: str,
        content: str | None,
        t: float,
        *,
        tool_call_id: str | None = None,
        tool_calls: str | None = None,
        tool_name: str | None = None,
        finish_reason: str | None = None,
        reasoning: str | None = None,
        observed: int = 0,
    ) -> Row:
        platform_id: str | None = None
        if ctx.peer is not None and role in ("user", "assistant") and tool_calls is None:
            platform_id = self._digits(12 if ctx.source != "discord" else 19)
        counted = content if content is not None else (tool_calls or "")
        return {
            "session_id": sid,
            "role": role,
            "content": content,
            "tool_call_id": tool_call_id,
            "tool_calls": tool_calls,
            "tool_name": tool_name,
            "timestamp": round(t, 6),
            "token_count": tokens(counted),
            "finish_reason": finish_reason,
            "reasoning": reasoning,
            "platform_message_id": platform_id,
            "observed": observed,
            "active": 1,
            "compacted": 0,
        }

    def _messages(
        self, ctx: Ctx, sid: str, size: int, start: float, continued: bool
    ) -> tuple[list[Row], float, int]:
        rng = self.rng
        rows: list[Row] = []
        t = start + 0.2 + rng.random()
        rewinds = 0
        compact_at = -1
        self.calls = 0
        if size >= 40 and (not self.compactions or rng.random() < _P_COMPACT_SESSION):
            compact_at = size * (20 + below(rng, 25)) // 100
        if continued:
            rows.append(self._row(ctx, sid, "user", self._summary(ctx), t))
        while len(rows) < size:
            first = len(rows)
            t = self._turn(ctx, sid, rows, size, t)
            if (
                len(rows) < size - 1
                and len(rows) - first >= 2
                and ((not self.rewinds and first > 0) or rng.random() < _P_REWIND_PER_TURN)
            ):
                for m in rows[first:]:
                    m["active"] = 0
                rewinds += 1
                self.rewinds += 1
            elif 0 <= compact_at <= len(rows) < size:
                self.compactions += 1
                for m in rows:
                    if m["active"] == 1:
                        m["active"] = 0
                        m["compacted"] = 1
                t += 0.5 + rng.random() * 5
                rows.append(self._row(ctx, sid, "user", self._summary(ctx), t))
                compact_at = -1
        return rows, t, rewinds

    def _turn(self, ctx: Ctx, sid: str, rows: list[Row], size: int, t: float) -> float:
        """Append one user turn (and the agent's work on it); never exceed size rows."""
        rng = self.rng
        t += quantile(rng, self.dist.user_think_s)
        if ctx.peer is not None and ctx.peer.chat_type != "dm" and rng.random() < 0.2:
            rows.append(
                self._row(ctx, sid, "user", one(rng, self.en.observed_chatter), t, observed=1)
            )
            t += 1 + rng.random() * 60
            if len(rows) >= size:
                return t
        if rng.random() < _P_SYSTEM_NOTE:
            note = self._fill(one(rng, self.en.system_notes), self._slots(ctx))
            rows.append(self._row(ctx, sid, "system", note, t))
            t += 0.01 + rng.random()
            if len(rows) >= size:
                return t
        p_multi = 0.002 if ctx.source == "cli" else 0.02
        self.user_messages += 1
        multi = self.user_messages == 3 or rng.random() < p_multi
        text = self._multimodal(ctx) if multi else self._user_text(ctx)
        rows.append(self._row(ctx, sid, "user", text, t))
        rounds = self.dist.tool_rounds_per_turn.pick(rng) if rng.random() < ctx.tool_turn_p else 0
        for _ in range(rounds):
            if len(rows) >= size:
                return t
            t += quantile(rng, self.dist.model_latency_s)
            calls: list[dict[str, object]] = []
            outputs: list[tuple[str, str, str]] = []
            for _ in range(self.dist.tool_calls_per_round.pick(rng)):
                name = ctx.tools.pick(rng)
                args, output = self._tool(name, ctx)
                digits = 22 if ctx.model.call_prefix == "toolu_01" else 24
                call_id = ctx.model.call_prefix + self._hex(digits)
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": dumps(args)},
                    }
                )
                outputs.append((call_id, name, output))
            self.calls += len(calls)
            preface: str | None = None
            if rng.random() < 0.25:
                slots = self._slots(ctx)
                preface = (
                    self._cjk(ctx.lang, 1, slots)
                    if ctx.lang != "en"
                    else self._fill(one(rng, self.en.prefaces), slots)
                )
            rows.append(
                self._row(
                    ctx,
                    sid,
                    "assistant",
                    preface,
                    t,
                    tool_calls=dumps(calls),
                    finish_reason="tool_calls",
                    reasoning=self._reasoning(ctx),
                )
            )
            for call_id, name, output in outputs:
                if len(rows) >= size:
                    return t
                t += quantile(rng, self.dist.tool_latency_s)
                rows.append(
                    self._row(ctx, sid, "tool", output, t, tool_call_id=call_id, tool_name=name)
                )
        if len(rows) < size:
            t += quantile(rng, self.dist.model_latency_s)
            finish = "length" if rng.random() < 0.03 else "stop"
            rows.append(
                self._row(
                    ctx,
                    sid,
                    "assistant",
                    self._assistant_text(ctx),
                    t,
                    finish_reason=finish,
                    reasoning=self._reasoning(ctx),
                )
            )
        return t


# Public API.
# --------------------------------------------------------------------------------------


def iter_transcripts(
    n_messages: int, seed: int = 0, *, vocabulary: Vocabulary | None = None
) -> Iterator[Transcript]:
    """Yield sessions with their messages, exactly `n_messages` messages in all.

    Parents come before their compression or delegation children, so inserting the
    transcripts in order satisfies `parent_session_id`. Only one session is held at a
    time, which keeps memory flat for very large corpora. `vocabulary` defaults to the
    package's `vocabulary.json` (see `generate`).
    """
    if n_messages < 0:
        raise ValueError(f"n_messages must be >= 0, got {n_messages}")
    return _Generator(seed, vocabulary or vocabulary_mod.load()).run(n_messages)


def generate(n_messages: int, seed: int = 0, *, vocabulary: Vocabulary | None = None) -> Corpus:
    """Generate a corpus of exactly `n_messages` messages, identical for the same seed.

    Same seed and size, same rows, on every run and machine with the same CPython version.
    The structure (sessions, ids, roles, tools, flags, timestamps) depends only on the seed
    and the size; the text cut from the standard library, and the token counts and costs
    derived from its length, also depend on the Python version.

    Whatever the seed, the first occasion of each rare feature is taken, so that even a
    few hundred messages hold a multimodal message (the 3rd user message), a rewound
    turn, CJK text (the 2nd session), and, once sessions are long enough, a compacted
    range (first session of 40+ messages) and a compression child (first of 160+).

    Every phrase, name and table comes from `vocabulary`: by default the package's
    `vocabulary.json` (read once per process), or an edited copy
    (`vocabulary.parse(json.loads(...))`, or `dataclasses.replace` of `vocabulary.load()`).
    """
    sessions: list[Row] = []
    messages: list[Row] = []
    collecting = gc.isenabled()
    gc.disable()  # the rows make no cycles; rescanning the growing heap cost ~30 % here
    try:
        for transcript in iter_transcripts(n_messages, seed, vocabulary=vocabulary):
            sessions.append(transcript.session)
            messages.extend(transcript.messages)
    finally:
        if collecting:
            gc.enable()
    return Corpus(sessions, messages)


def _insert_sql(table: str, columns: Sequence[str]) -> str:
    """Return a parameterised INSERT for the given columns."""
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"


_SESSION_VALUES: Final = operator.itemgetter(*SESSION_COLUMNS)
_MESSAGE_VALUES: Final = operator.itemgetter(*MESSAGE_COLUMNS)
_SAVEPOINT: Final = "hermes_corpus_populate"


def populate(conn: sqlite3.Connection, corpus: Corpus | Iterable[Transcript]) -> None:
    """Insert a corpus into an existing store in one transaction, messages in id order.

    `corpus` is a `Corpus` or an iterable of `Transcript` (for example
    `iter_transcripts(1_000_000)`, streamed without holding it all in memory). The rows
    are written with parameterised `executemany` INSERTs inside a SAVEPOINT: it commits
    when the connection had no transaction open, and otherwise becomes part of the
    caller's transaction. On error everything written is rolled back. The store's own
    triggers (the FTS ones included) index the messages as they are inserted.
    """
    session_sql = _insert_sql("sessions", SESSION_COLUMNS)
    message_sql = _insert_sql("messages", MESSAGE_COLUMNS)
    conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        if isinstance(corpus, Corpus):
            conn.executemany(session_sql, map(_SESSION_VALUES, corpus.sessions))
            conn.executemany(message_sql, map(_MESSAGE_VALUES, corpus.messages))
        else:
            for transcript in corpus:
                conn.execute(session_sql, _SESSION_VALUES(transcript.session))
                conn.executemany(message_sql, map(_MESSAGE_VALUES, transcript.messages))
    except BaseException:
        conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
        conn.execute(f"RELEASE {_SAVEPOINT}")
        raise
    conn.execute(f"RELEASE {_SAVEPOINT}")
