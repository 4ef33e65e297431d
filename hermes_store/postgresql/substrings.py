"""The trigram path's and the LIKE scan's tests on PostgreSQL: substrings of the text.

The statements that use them are in :mod:`hermes_store.postgresql.search`. A trigram
token is an ``ILIKE`` over the indexed text (served by the trigram index), a ``LIKE``
where the token has no case; the LIKE scan's token a ``strpos`` or, with ASCII letters,
a regular expression, as SQLite's LIKE folds ASCII case only. Each reads a text up to its
first NUL (stored as U+FFFE), as SQLite's LIKE and trigram tokenizer do, where it holds one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Float,
    Integer,
    String,
    and_,
    cast,
    func,
    literal,
    not_,
    or_,
    type_coerce,
)

from hermes_store.models import SERVER_NUL, to_server_text
from hermes_store.search.query import (
    And,
    Node,
    Not,
    Or,
    Phrase,
    contains_cjk,
    escape_like,
    reduced,
)
from hermes_store.search.schema import M

#: A statement's bound parameter for a value (search.Binds).
Bind = Callable[[str], ColumnElement[str]]

_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"


def like_pattern(text: str) -> str:
    """A contains-pattern for ``text`` as stored on the server (NUL as U+FFFE)."""
    return f"%{escape_like(to_server_text(text))}%"


def caseless(token: str) -> bool:
    """Whether ILIKE finds exactly what LIKE finds for ``token``: every character is CJK
    (no case in those scripts) or ASCII but no letter, so no character folds to one of the
    token's, in any locale."""
    return all(contains_cjk(char) or (char.isascii() and not char.isalpha()) for char in token)


def trigram_condition(
    node: Node,
    patterns: Sequence[ColumnElement[str]],
    document: ColumnElement[str],
    *,
    before_nul_only: bool = True,
) -> ColumnElement[bool]:
    """A simplified trigram query tree as ILIKE tests over the indexed text (LIKE for a
    caseless token: the same rows, without lower-casing each candidate's whole text).
    ``patterns``: the bound LIKE patterns of the tree's tokens, in phrase_tokens' order.

    Without ``before_nul_only``, a wider condition that the trigram index answers alone:
    each token found anywhere in the text, a NUL's (U+FFFE's) or not, and no NOT's
    exclusion. :func:`trigram_residue` is what a row it selects must then pass."""
    if isinstance(node, Phrase):  # one quoted token: a substring of 3+ characters
        found = _contains(node, patterns[0], document)
        if not before_nul_only:
            return found
        # The trigram index serves the first test; the second is FTS5's trigram tokenizer,
        # which stops at a text's first NUL (stored here as U+FFFE), tested only in a text
        # that holds one.
        return and_(found, _before_nul_holds(node, patterns[0], document))
    parts = _operands(node, patterns)
    if isinstance(node, And):
        return and_(
            *(trigram_condition(o, p, document, before_nul_only=before_nul_only) for o, p in parts)
        )
    if isinstance(node, Or):
        return or_(
            *(trigram_condition(o, p, document, before_nul_only=before_nul_only) for o, p in parts)
        )
    if isinstance(node, Not):
        (positive, kept), (negative, excluded) = parts
        wanted = trigram_condition(positive, kept, document, before_nul_only=before_nul_only)
        if not before_nul_only:
            return wanted
        return and_(wanted, not_(trigram_condition(negative, excluded, document)))
    raise TypeError(f"no trigram condition for {type(node).__name__}")


def trigram_residue(
    node: Node, patterns: Sequence[ColumnElement[str]], document: ColumnElement[str]
) -> ColumnElement[bool]:
    """What a row the wider condition (trigram_condition without ``before_nul_only``)
    selects must pass to match ``node``: for a token, and each token of an AND, only that
    it is found before the text's first NUL, which a text without one passes at once;
    anything else tested whole."""
    if isinstance(node, Phrase):
        return _before_nul_holds(node, patterns[0], document)
    if isinstance(node, And):
        return and_(*(trigram_residue(o, p, document) for o, p in _operands(node, patterns)))
    return trigram_condition(node, patterns, document)


def _contains(
    node: Phrase, pattern: ColumnElement[str], value: ColumnElement[str]
) -> ColumnElement[bool]:
    token = node.tokens[0][0]
    return value.like(pattern) if caseless(token) else value.ilike(pattern)


def _before_nul_holds(
    node: Phrase, pattern: ColumnElement[str], document: ColumnElement[str]
) -> ColumnElement[bool]:
    """The text holds no NUL, or the token is found before its first."""
    before = _contains(node, pattern, before_nul(document))
    return or_(func.strpos(document, SERVER_NUL) == 0, before)


def _operands(
    node: Node, patterns: Sequence[ColumnElement[str]]
) -> list[tuple[Node, Sequence[ColumnElement[str]]]]:
    """Each operand of an AND, OR or NOT (positive, then negative), with its patterns."""
    if isinstance(node, Not):
        operands = [node.positive, node.negative]
    elif isinstance(node, (And, Or)):
        operands = list(node.operands)
    else:
        raise TypeError(f"no operands in {type(node).__name__}")
    parts: list[tuple[Node, Sequence[ColumnElement[str]]]] = []
    start = 0
    for operand in operands:
        count = len(phrase_tokens(operand))
        parts.append((operand, patterns[start : start + count]))
        start += count
    return parts


def before_nul(value: ColumnElement[Any]) -> ColumnElement[str]:
    """``value`` up to its first NUL (U+FFFE on the server), where SQLite's LIKE and the
    trigram tokenizer stop reading a text."""
    return func.split_part(value, SERVER_NUL, 1, type_=String)


def _ascii_folded(value: ColumnElement[Any]) -> ColumnElement[str]:
    """``value`` with ASCII letters lower-cased and nothing else: SQLite LIKE's folding."""
    return func.translate(value, _UPPER, _LOWER, type_=String)


def ascii_caseless(token: str) -> str:
    """A regular expression (ARE) finding ``token`` with ASCII letters in either case and
    every other character as written: what SQLite's LIKE '%token%' finds."""
    pieces = []
    for char in token:
        if char.isascii() and char.isalpha():
            pieces.append(f"[{char.lower()}{char.upper()}]")
        elif char.isalnum():
            pieces.append(char)
        else:  # a backslash before a character that is not a letter or digit: itself
            pieces.append("\\" + char)
    return "".join(pieces)


def like_condition(tokens: Sequence[str], binds: Bind) -> ColumnElement[bool]:
    """The LIKE scan's test: any token in content, tool_name or tool_calls, ASCII case
    folded as SQLite's LIKE folds it, each text read up to its first NUL as LIKE reads it.

    A token without ASCII letters is a plain substring test (strpos: nothing to fold, and
    faster than LIKE's matcher); one with letters a regular expression with each letter in
    both cases (ILIKE would fold every script, and translate() to ASCII lower case costs 30
    times as much). Each is tried on the whole text first, and up to its first NUL only
    where it matched: no copy of the text (split_part) for the rows it does not match.
    """
    columns = (M.c.content, M.c.tool_name, M.c.tool_calls)
    conditions: list[ColumnElement[bool]] = []
    for token in reduced(tokens):
        if "\x00" in token:  # compared whole, as on SQLite (stored NULs are U+FFFE here)
            needle = _ascii_folded(binds(to_server_text(token)))
            tests = [func.strpos(_ascii_folded(column), needle) > 0 for column in columns]
        elif any(char.isascii() and char.isalpha() for char in token):
            regex = binds(ascii_caseless(to_server_text(token)))
            tests = [
                and_(
                    column.op("~", return_type=Boolean)(regex),
                    or_(
                        func.strpos(column, SERVER_NUL) == 0,
                        before_nul(column).op("~", return_type=Boolean)(regex),
                    ),
                )
                for column in columns
            ]
        else:  # the token holds no NUL: its first instance is before the text's first NUL
            needle = binds(to_server_text(token))
            tests = [
                and_(
                    func.strpos(column, needle) > 0,
                    or_(
                        func.strpos(column, SERVER_NUL) == 0,
                        func.strpos(column, needle) < func.strpos(column, SERVER_NUL),
                    ),
                )
                for column in columns
            ]
        conditions.append(or_(*tests))
    return or_(*conditions)


def shape(node: Node) -> tuple[Any, ...]:
    """What of a trigram tree its statement depends on: the operators, and which tokens
    have case (ILIKE or LIKE), not the tokens."""
    if isinstance(node, Phrase):
        return ("phrase", caseless(node.tokens[0][0]))
    if isinstance(node, Not):
        return ("not", shape(node.positive), shape(node.negative))
    if isinstance(node, (And, Or)):
        return (type(node).__name__, *(shape(operand) for operand in node.operands))
    raise TypeError(f"no trigram shape for {type(node).__name__}")


def phrase_tokens(node: Node) -> list[str]:
    """The tokens of a trigram tree in the order of trigram_condition's patterns."""
    if isinstance(node, Phrase):
        return [node.tokens[0][0]]
    if isinstance(node, Not):
        return phrase_tokens(node.positive) + phrase_tokens(node.negative)
    if isinstance(node, (And, Or)):
        return [token for operand in node.operands for token in phrase_tokens(operand)]
    raise TypeError(f"no trigram tokens for {type(node).__name__}")


def found_tokens(node: Node) -> list[str]:
    """The tokens of a trigram tree a hit can hold: all but those after a NOT, once each."""
    if isinstance(node, Phrase):
        return [node.tokens[0][0]]
    if isinstance(node, Not):
        return found_tokens(node.positive)
    if isinstance(node, (And, Or)):
        found = [token for operand in node.operands for token in found_tokens(operand)]
        return list(dict.fromkeys(found))
    raise TypeError(f"no trigram tokens for {type(node).__name__}")


def coverage(
    document: ColumnElement[str], tokens: Sequence[tuple[ColumnElement[str], bool]]
) -> ColumnElement[float]:
    """The trigram path's rank: the share of the text's bytes that are the query's tokens
    (the text less every instance of each, against the whole), so more instances in a
    shorter text rank higher, as BM25 ranks them. One replace() a token, over the text
    lower-cased when a token has case: pg_trgm's similarity() would build and sort the
    trigrams of the whole text, ten times the cost. Bytes, not characters: a text's bytes
    are in its header, its characters counted one by one (the five CJK searches at
    50,000 messages: 18.0 ms with characters, 16.3 with bytes, through Store.search).
    The whole is the text's bytes as stored, not lower-cased again (lower-casing changes
    the bytes of a few characters only). The text holds its two separators, so it is
    never empty."""
    text = document if all(without_case for _, without_case in tokens) else func.lower(document)
    left = text
    for token, without_case in tokens:
        left = func.replace(left, token if without_case else func.lower(token), "")
    size = func.octet_length(document, type_=Integer)
    share = literal(1.0, Float) - (
        cast(func.octet_length(left, type_=Integer), Float) / cast(size, Float)
    )
    return type_coerce(share, Float(asdecimal=False))
