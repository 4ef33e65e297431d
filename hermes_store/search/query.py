"""The query language shared by both databases: sanitising, CJK routing, term bounds."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hermes_store.errors import QueryTooComplex

MAX_QUERY_CHARS = 2048
#: At most this many terms (words of phrases included, repeats removed first) go to an FTS5
#: index: FTS5's cost per matching row grows with the square of the term count (`the`
#: repeated 200 times took 19 s at 50k messages). 32 distinct terms OR-ed answer in 0.2 s
#: there; the LIKE route of short CJK tokens is not capped (its tokens are reduced instead).
MAX_SEARCH_TERMS = 32
WORD_INDEX = "messages_fts"
TRIGRAM_INDEX = "messages_fts_trigram"

_OPERATORS = frozenset({"AND", "OR", "NOT"})
_CJK_RANGES = (
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0x3400, 0x4DBF),  # CJK Extension A
    (0x20000, 0x2A6DF),  # CJK Extension B
    (0x3000, 0x303F),  # CJK Symbols and Punctuation
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0xAC00, 0xD7AF),  # Hangul Syllables
)
# Each kept phrase is replaced by one private-use character absent from the query, so a
# placeholder can never collide with user text and is neither a word character, whitespace,
# nor one of the characters the later steps rewrite.
_PLACEHOLDER_CODEPOINTS = range(0xE000, 0xF900)
_FTS_SPECIAL = re.compile(r'[+{}():"^]')
_STAR_RUN = re.compile(r"\*+")
_BARE_STAR = re.compile(r"(^|\s)\*")
_LEADING_OPERATOR = re.compile(r"^(AND|OR|NOT)\b\s*", re.IGNORECASE)
_TRAILING_OPERATOR = re.compile(r"\s+(AND|OR|NOT)\s*$", re.IGNORECASE)
_JOINED_TERM = re.compile(r"\b(\w+(?:[._-]\w+)+)\b")


@dataclass(frozen=True)
class _Route:
    """Where a sanitised query is answered: an FTS index (``index``) or the LIKE scan (None)."""

    index: str | None
    match: str
    like_tokens: tuple[str, ...]


def _is_cjk(char: str) -> bool:
    """Tell whether one character is in the contract's CJK ranges."""
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK_RANGES)


def contains_cjk(text: str) -> bool:
    """Tell whether ``text`` has at least one CJK character (the contract's ranges)."""
    return any(_is_cjk(char) for char in text)


def count_cjk(text: str) -> int:
    """Count the CJK characters of ``text``."""
    return sum(1 for char in text if _is_cjk(char))


def _free_placeholders(text: str) -> Iterator[str]:
    """Yield private-use characters that do not occur in ``text``."""
    used = set(text)
    return (chr(code) for code in _PLACEHOLDER_CODEPOINTS if chr(code) not in used)


def _set_phrases_aside(query: str) -> tuple[str, dict[str, str]]:
    """Replace balanced ``"..."`` phrases by placeholders and unmatched quotes by spaces."""
    placeholders = _free_placeholders(query)
    phrases: dict[str, str] = {}
    pieces: list[str] = []
    position = 0
    while (start := query.find('"', position)) != -1:
        pieces.append(query[position:start])
        end = query.find('"', start + 1)
        if end == -1:  # unmatched: no quote can follow, the rest is plain text
            pieces.append(" ")
            position = start + 1
            break
        placeholder = next(placeholders)
        phrases[placeholder] = query[start : end + 1]
        pieces.append(placeholder)
        position = end + 1
    pieces.append(query[position:])
    return "".join(pieces), phrases


def sanitize_query(query: str) -> str:
    """Turn user input into a safe FTS5 query, steps 1 to 7 of the contract, in order."""
    text, phrases = _set_phrases_aside(query[:MAX_QUERY_CHARS])
    text = _FTS_SPECIAL.sub(" ", text)
    text = _BARE_STAR.sub(r"\1", _STAR_RUN.sub("*", text))
    text = _LEADING_OPERATOR.sub("", text.strip())
    text = _TRAILING_OPERATOR.sub("", text.strip())
    text = _JOINED_TERM.sub(r'"\1"', text)
    if phrases:
        text = text.translate({ord(placeholder): phrase for placeholder, phrase in phrases.items()})
    return text.strip()


_TOKEN = re.compile(r'"(?:[^"]|"")*"|[^ ]+')


def _term_key(token: str) -> str:
    """Tokens with equal keys match the same rows: ASCII case folded (as unicode61 and the
    trigram tokenizer fold it), anything else compared as written."""
    return token.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def without_repeats(sanitized: str) -> str:
    """The sanitised query with repeated terms removed where that cannot change the hits.

    Without NOT, a query is OR-ed groups of AND-ed terms (explicit AND is the implicit
    one): a term repeated within a group, or a group repeated, adds nothing to the hit set
    but costs FTS5 work that grows with the square of the term count. Queries with NOT are
    left as written. BM25 counts each repeat, so the rank of a query with repeats may differ
    from the legacy application's; the rows do not.
    """
    if any(char != " " and (char.isspace() or not char.isprintable()) for char in sanitized):
        return sanitized  # FTS5 and Python disagree on what separates such tokens
    tokens = _TOKEN.findall(sanitized)
    if "NOT" in tokens:
        return sanitized
    joins = [index for index, word in enumerate(tokens) if word in ("AND", "OR")]
    if any(i in (0, len(tokens) - 1) or tokens[i + 1] in ("AND", "OR") for i in joins):
        return sanitized  # "a AND AND b": FTS5's syntax error is the contract's answer
    groups: list[list[str]] = [[]]
    for word in tokens:
        if word == "OR":
            groups.append([])
        elif word != "AND":
            groups[-1].append(word)
    kept: dict[tuple[str, ...], str] = {}
    for group in groups:
        terms = {_term_key(term): term for term in reversed(group)}  # first spelling kept
        keys = tuple(dict.fromkeys(_term_key(term) for term in group))
        kept.setdefault(tuple(sorted(keys)), " ".join(terms[key] for key in keys))
    return " OR ".join(kept.values())


def _count_terms(match: str) -> int:
    """Terms FTS5 evaluates in a MATCH expression: every word of every phrase, no operators."""
    count = 0
    for token in _TOKEN.findall(match):
        if token in _OPERATORS:
            continue
        count += max(1, len(token.strip('"').split())) if token.startswith('"') else 1
    return count


def _check_bounded(route: _Route) -> None:
    if route.index is not None and (terms := _count_terms(route.match)) > MAX_SEARCH_TERMS:
        raise QueryTooComplex(
            f"the search query has {terms} distinct terms; at most {MAX_SEARCH_TERMS} are "
            "searched at once (each one multiplies the index's work on every matching "
            "message): keep the words that matter"
        )


def _quote_token(token: str) -> str:
    """Quote one token as an FTS5 string, doubling inner quotes."""
    return '"' + token.replace('"', '""') + '"'


def _route(sanitized: str, *, trigram: bool) -> _Route:
    """Pick the index (or the LIKE scan) that answers a sanitised query."""
    if not contains_cjk(sanitized):
        return _Route(WORD_INDEX, sanitized, ())
    raw = sanitized.strip('"').strip()
    tokens = raw.split()
    terms = tuple(token for token in tokens if token.upper() not in _OPERATORS)
    like_tokens = terms or (raw,)
    long_enough = count_cjk(raw) >= 3 and all(
        count_cjk(term) >= 3 for term in terms if contains_cjk(term)
    )
    if trigram and long_enough:
        match = " ".join(
            token if token.upper() in _OPERATORS else _quote_token(token) for token in tokens
        )
        return _Route(TRIGRAM_INDEX, match, like_tokens)
    return _Route(None, "", like_tokens)


def _escape_like(token: str) -> str:
    """Escape ``\\``, ``%`` and ``_`` for a LIKE pattern with ``\\`` as the escape character."""
    return token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _reduced(tokens: Sequence[str]) -> list[str]:
    """The LIKE route's tokens without those that add nothing to its OR: repeats, and any
    token containing another one (a row with "数据" has "数"). LIKE folds ASCII case only."""
    unique = list({_term_key(token): token for token in reversed(tokens)}.values())[::-1]
    keys = {token: _term_key(token) for token in unique if "\x00" not in token}
    return [
        token
        for token in unique
        if token not in keys
        or not any(other != token and keys[other] in keys[token] for other in keys)
    ]


#: Up to this many tokens (NUL-free) the LIKE scan runs SQL LIKE conditions, one per


def _normalise_sort(sort: object) -> str | None:
    """Return ``"newest"`` or ``"oldest"`` (case-insensitive, trimmed), else None (rank)."""
    if isinstance(sort, str) and sort.strip().lower() in ("newest", "oldest"):
        return sort.strip().lower()
    return None
