"""A parsed query of the word path as a tsquery, normalised by the documents' functions.

The query tree (:mod:`hermes_store.search.query`) becomes a tsquery expression whose words
the server normalises with the functions revision fts1 defines for the documents:
``phraseto_tsquery('simple', hermes_search_lexemes(:text))`` for a phrase segment,
``to_tsquery`` with ``:*`` for a prefix, joined with ``&&``, ``||``, ``!!`` and ``<->`` /
``<N>``. Values are bound parameters (:class:`Binds`), never spliced into the SQL.

:func:`coarse_tsquery_of` is a wider tsquery without positions (each phrase of several
words as the AND of its words, NEAR as the AND of its phrases): a GIN index answers it
exactly, with no row's words read again, so the statement tests the exact one only on the
few rows it needs (hermes_store.postgresql.search, "the newest matches").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Integer, String, bindparam, func, literal, select
from sqlalchemy.dialects.postgresql import REGCONFIG, TSQUERY

from hermes_store.search.query import And, Near, Node, Not, Or, Phrase, word_tokens

#: Up to this NEAR distance a two-phrase NEAR group is translated exactly (an OR of the
#: ``<N>`` distances, both orders); beyond, and for three phrases or more, as the AND of
#: its phrases, a superset (see docs/search.md, "PostgreSQL").
NEAR_EXACT_DISTANCE = 32


class Binds:
    """Numbered bound parameters of one statement, and their values."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def __call__(self, value: str) -> ColumnElement[str]:
        name = f"q{len(self.values)}"
        self.values[name] = value
        return bindparam(name, type_=String)


_SIMPLE = literal("simple", REGCONFIG)


def _segment(binds: Binds, text: str, prefix: bool, *, coarse: bool = False) -> ColumnElement[Any]:
    """One written segment of a phrase as a tsquery, normalised by the documents' functions
    (``coarse``: its words joined by ``&``, not ``<->``)."""
    lexemes = func.hermes_search_lexemes(binds(text), type_=String)
    if not prefix:
        if coarse:
            return func.plainto_tsquery(_SIMPLE, lexemes, type_=TSQUERY)
        return func.phraseto_tsquery(_SIMPLE, lexemes, type_=TSQUERY)
    # 'w1 <-> w2 <-> w3:*': the lexemes are letters and digits only, nothing to quote.
    joint = " & " if coarse else " <-> "
    words = func.regexp_replace(func.btrim(lexemes), " +", joint, "g", type_=String)
    return func.to_tsquery(_SIMPLE, words.concat(":*"), type_=TSQUERY)


def _phrase(binds: Binds, phrase: Phrase, *, coarse: bool = False) -> ColumnElement[Any]:
    """A phrase's segments (``a + "b c"*``) joined by ``<->`` (``coarse``: by ``&``); a
    segment without tokens adds none, as in FTS5."""
    written = [(text, prefix) for text, prefix in phrase.text if word_tokens(text)]
    segments = [
        _segment(binds, text, prefix, coarse=coarse and _positional(phrase))
        for text, prefix in written
    ]
    join = "tsquery_and" if coarse else "tsquery_phrase"
    query = segments[0]
    for segment in segments[1:]:
        query = getattr(func, join)(query, segment, type_=TSQUERY)
    return query


def _positional(phrase: Phrase) -> bool:
    """Whether the phrase is of several words (its tsquery tests positions). One word is
    left as it is in the coarse tsquery, even where the server makes several lexemes of
    it (the coarse tsquery is then only less cheap, never narrower)."""
    return sum(len(word_tokens(text)) for text, _ in phrase.text) > 1


def positional(node: Node) -> bool:
    """Whether the tree's tsquery tests positions: its coarse tsquery is wider."""
    if isinstance(node, Phrase):
        return _positional(node)
    if isinstance(node, Near):
        return True
    if isinstance(node, (And, Or)):
        return any(positional(operand) for operand in node.operands)
    if isinstance(node, Not):
        return positional(node.positive) or positional(node.negative)
    return False


def coarse_tsquery_of(node: Node, binds: Binds) -> ColumnElement[Any]:
    """A tsquery every match of ``tsquery_of(node)`` matches, without positions where the
    tree has them: a phrase of several words as the AND of its words, NEAR as the AND of
    its phrases, and ``a NOT b`` as ``a`` alone where ``b`` tests positions (the AND of
    ``b``'s words is no narrower than ``b``, so its negation would be narrower)."""
    if isinstance(node, Phrase):
        return _phrase(binds, node, coarse=True)
    if isinstance(node, Near):
        return _combine("tsquery_and", [_phrase(binds, p, coarse=True) for p in node.phrases])
    if isinstance(node, And):
        return _combine("tsquery_and", [coarse_tsquery_of(o, binds) for o in node.operands])
    if isinstance(node, Or):
        return _combine("tsquery_or", [coarse_tsquery_of(o, binds) for o in node.operands])
    if isinstance(node, Not):
        positive = coarse_tsquery_of(node.positive, binds)
        if positional(node.negative):
            return positive
        negative = func.tsquery_not(tsquery_of(node.negative, binds), type_=TSQUERY)
        return func.tsquery_and(positive, negative, type_=TSQUERY)
    raise TypeError(f"no tsquery for {type(node).__name__}")


def _near(binds: Binds, near: Near) -> ColumnElement[Any]:
    phrases = [_phrase(binds, phrase) for phrase in near.phrases]
    every = _combine("tsquery_and", phrases)
    if len(phrases) != 2 or near.distance > NEAR_EXACT_DISTANCE:
        return every
    first, second = phrases
    # FTS5: the later phrase starts at most `distance` tokens after the earlier one ends;
    # tsquery_phrase(a, b, n): b starts exactly n positions after a's last word.
    return _combine(
        "tsquery_or",
        [
            func.tsquery_phrase(left, right, literal(gap, Integer), type_=TSQUERY)
            for gap in range(1, near.distance + 2)
            for left, right in ((first, second), (second, first))
        ],
    )


def _combine(function: str, queries: Sequence[ColumnElement[Any]]) -> ColumnElement[Any]:
    """Queries joined by ``tsquery_and`` (``&&``), ``tsquery_or`` (``||``)..., left to right."""
    combined = queries[0]
    for query in queries[1:]:
        combined = getattr(func, function)(combined, query, type_=TSQUERY)
    return combined


def computed_once(tsquery: ColumnElement[Any]) -> ColumnElement[Any]:
    """The tsquery as a scalar subquery: computed once as the statement starts (an
    InitPlan), where a generic plan (postgresql.reads._PLANNER) would otherwise normalise
    the query's words again for every row it tests or ranks ("import os" at 50,000
    messages: 11.8 ms against 8.0 with the tsquery folded into a constant by a custom
    plan)."""
    return select(tsquery).scalar_subquery()


def tsquery_of(node: Node, binds: Binds) -> ColumnElement[Any]:
    """A simplified query tree (no Nothing in it) as a tsquery expression."""
    if isinstance(node, Phrase):
        return _phrase(binds, node)
    if isinstance(node, Near):
        return _near(binds, node)
    if isinstance(node, And):
        return _combine("tsquery_and", [tsquery_of(operand, binds) for operand in node.operands])
    if isinstance(node, Or):
        return _combine("tsquery_or", [tsquery_of(operand, binds) for operand in node.operands])
    if isinstance(node, Not):  # FTS5's binary NOT: positive && !!negative
        positive = tsquery_of(node.positive, binds)
        negative = func.tsquery_not(tsquery_of(node.negative, binds), type_=TSQUERY)
        return func.tsquery_and(positive, negative, type_=TSQUERY)
    raise TypeError(f"no tsquery for {type(node).__name__}")


def tsquery_shape(node: Node) -> tuple[Any, ...]:
    """What of a simplified tree the SQL of :func:`tsquery_of` and :func:`coarse_tsquery_of`
    depends on, not its words: two trees of one shape make the same SQL, their binds'
    values (:func:`tsquery_texts`, :func:`coarse_tsquery_texts`) apart. A phrase's shape
    holds its segments' prefixes and whether it has several words (the coarse tsquery
    joins those by ``&``)."""
    if isinstance(node, Phrase):
        prefixes = tuple(prefix for text, prefix in node.text if word_tokens(text))
        return ("phrase", prefixes, _positional(node))
    if isinstance(node, Near):
        exact = len(node.phrases) == 2 and node.distance <= NEAR_EXACT_DISTANCE
        phrases = tuple(tsquery_shape(phrase) for phrase in node.phrases)
        return ("near", node.distance if exact else None, phrases)
    if isinstance(node, (And, Or)):
        return (type(node).__name__, *(tsquery_shape(operand) for operand in node.operands))
    if isinstance(node, Not):
        return ("not", tsquery_shape(node.positive), tsquery_shape(node.negative))
    raise TypeError(f"no tsquery for {type(node).__name__}")


def tsquery_texts(node: Node) -> list[str]:
    """The values of :func:`tsquery_of`'s binds for ``node``, in the order it makes them
    (q0, q1...)."""
    if isinstance(node, Phrase):
        return [text for text, _prefix in node.text if word_tokens(text)]
    if isinstance(node, Near):
        return [text for phrase in node.phrases for text in tsquery_texts(phrase)]
    if isinstance(node, (And, Or)):
        return [text for operand in node.operands for text in tsquery_texts(operand)]
    if isinstance(node, Not):
        return tsquery_texts(node.positive) + tsquery_texts(node.negative)
    raise TypeError(f"no tsquery for {type(node).__name__}")


def coarse_tsquery_texts(node: Node) -> list[str]:
    """The values of :func:`coarse_tsquery_of`'s binds for ``node``, in the order it makes
    them (after those of any tsquery made before it with the same Binds)."""
    if isinstance(node, (Phrase, Near)):
        return tsquery_texts(node)
    if isinstance(node, (And, Or)):
        return [text for operand in node.operands for text in coarse_tsquery_texts(operand)]
    if isinstance(node, Not):
        negative = [] if positional(node.negative) else tsquery_texts(node.negative)
        return coarse_tsquery_texts(node.positive) + negative
    raise TypeError(f"no tsquery for {type(node).__name__}")


__all__ = [
    "NEAR_EXACT_DISTANCE",
    "Binds",
    "coarse_tsquery_of",
    "coarse_tsquery_texts",
    "positional",
    "tsquery_of",
    "tsquery_shape",
    "tsquery_texts",
]
