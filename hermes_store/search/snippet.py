"""SQLite FTS5's ``snippet()`` reproduced in pure Python, for databases without FTS5, and
snippets of bounded cost for texts too large or too dense for it.

The search contract (docs/search.md) returns, for each hit,
``snippet(messages_fts, 0, '>>>', '<<<', '...', 40)`` on the word path and
``snippet(messages_fts_trigram, 0, '>>>', '<<<', '...', 40)`` on the trigram path. A
database without FTS5 (PostgreSQL) fetches the indexed text of each hit on the page and
builds the same string here: byte for byte what SQLite 3.40's FTS5 returns for the same
text and query, standard library only, no database access.

API
---
``Term = tuple[str, bool]``
    One query token as written in the query (not folded: this module folds it the way the
    tokenizer folds the document), and whether it is a prefix (``tok*``). A term whose text
    the tokenizer splits (``foo_bar``, ``don't``) stands for its tokens in a row. As in
    FTS5, a term's prefix flag is set on the last token of the phrase so far, even when
    the term itself brings no token (``"e"* + "-"`` is the exact token ``e``).
``Phrase = Sequence[Term]``
    A bare word is a one-term phrase; ``"a b c"`` is a three-term phrase; ``"a b"*`` makes
    the last term a prefix.
``word_snippet(text, phrases, *, near=(), groups=None, tokens=40, start=">>>",
end="<<<", ellipsis="...") -> str``
    The ``unicode61`` tokenizer with its default options. ``phrases`` are the query's
    phrases in the order they appear in it (FTS5 numbers them so, and the number breaks ties
    between instances at one position). ``near`` lists the NEAR groups as ``(indexes into
    phrases, distance)``: their phrases keep only the instances that take part in a match of
    the group (FTS5's own trimming), none at all when the group does not match; except
    that, as in FTS5, when every token of a failed group occurs in the row, the phrases
    tested before the first one that does not occur as a phrase keep all their instances
    and show when the group is an OR branch of its own.
    ``groups``, when given, tells which phrases count on this row: FTS5 highlights a phrase
    only where the part of the query that holds it matched the row. The contract's
    sanitised queries have no parentheses, and FTS5 binds juxtaposition tightest, then
    ``NOT``, then ``AND``, then ``OR``: a query is an OR of groups, and each group is
    ``(operands, negated)``, both lists of operands, an operand being the indexes of the
    phrases written side by side (a NEAR group's phrases included). ``operands`` are the
    group's operands joined by ``AND`` (each the left side of its ``NOT`` chain),
    ``negated`` the right sides of its ``NOT`` operators. A group matches when every phrase
    of its operands occurs (after NEAR trimming) and no negated operand has all of its
    phrases occurring; only the phrases of ``operands`` of matching groups count. A phrase
    that folds to no token at all (``"..."``) is dropped from its operand, and an operand
    left empty matches nothing, as in FTS5. ``None`` counts every phrase that occurs, which
    is exact for queries without ``NOT`` whose groups all matched (a plain AND query, or
    an OR of single phrases).

    The one case this cannot follow: FTS5 moves the phrases after a ``NOT`` only while the
    NOT's left side has rows left in the table; once it has none, those phrases stay on
    the row where they were and are highlighted there if that row comes back through
    another OR branch. Likewise, when a NEAR group fails on a row holding all of its
    tokens, the phrases after the first one that does not occur as a phrase are not
    tested on that row, and FTS5 may report the positions they had on the last row where
    they were. Both depend on the table's other rows; this module never highlights phrases
    after ``NOT``, nor the untested phrases of a NEAR group. And where SQLite 3.40 itself
    is not stable (its NEAR trimming can read a buffer it has just grown, losing the last
    instances of a NEAR group on long texts from one run to the next), this module gives
    every instance that takes part in a match.
``trigram_snippet(text, substrings, *, groups=None, tokens=40, start=">>>", end="<<<",
ellipsis="...") -> str``
    The ``trigram`` tokenizer (``case_sensitive=0``); each substring is one quoted token of
    the trigram MATCH, 3 characters or more (shorter ones match nothing); ``groups`` as
    above, over the substrings.
``exact_is_bounded(text, phrases, *, trigram=False) -> bool``
    Whether FTS5's snippet of ``text`` stays cheap: its time grows with the square of the
    phrases' instances in the row, and this says whether there are at most
    ``EXACT_INSTANCES`` (found by regular expressions, not by the tokenizer, which in
    Python takes about a second a megabyte).
``bounded_word_snippet(...)``, ``bounded_trigram_snippet(...)``
    The same arguments as above; a snippet of bounded cost for any text: the algorithm
    above applied to a window of ``WINDOW_CHARS`` characters that starts ``WINDOW_BEFORE``
    characters before the first instance of a marked phrase (the phrases of the groups'
    operands; every phrase without ``groups``), less a word token an edge of the window
    cuts, each marked phrase marked wherever it occurs in it, with the ellipsis where the
    window cuts the text. Search uses them past its size and instance limits (docs/search.md,
    "Bounds").

What it reproduces
------------------
- unicode61: token characters and folding as FTS5's own tables have them, not
  ``unicodedata``'s (:mod:`hermes_store.search.tokenizer_tables` says what they hold).
- trigram: every run of three characters is a token, folded to lower case without removing
  diacritics; a NUL character ends the text.
- the snippet: FTS5 scores a window of ``tokens`` tokens at each phrase instance (1000 for
  each phrase seen first in it, 1 for a repeat) and at the start of the sentence holding it
  (a token after ``.`` or ``:`` and white space; 120 extra at the start of the text, 100
  elsewhere), keeps the first best, centres it on its hits, then copies the window's text
  with overlapping instances merged into one highlight. Positions are tokens, offsets UTF-8
  bytes, as in FTS5, including its quirks: ``tokens=1`` (and less) copies the whole text
  up to the last highlight; when a highlight starts inside the bytes of the previous one
  (trigram: ``"abc" OR "cde"`` on ``abcde``), FTS5 copies the rest of the text before
  opening it; a NUL byte cuts each piece of copied text.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from typing import NamedTuple

from hermes_store.search.tokenizer_tables import (
    DIACRITICS,
    TOKEN_CHARS,
    TRIGRAM_FOLDS,
    TRIGRAM_SOURCES,
    WORD_FOLDS,
    WORD_SOURCES,
)

__all__ = [
    "EXACT_INSTANCES",
    "WINDOW_BEFORE",
    "WINDOW_CHARS",
    "Group",
    "Near",
    "Phrase",
    "Term",
    "bounded_trigram_snippet",
    "bounded_word_snippet",
    "exact_is_bounded",
    "trigram_snippet",
    "word_snippet",
]

Term = tuple[str, bool]
Phrase = Sequence[Term]
Near = tuple[Sequence[int], int]
Group = tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]


def _fold_trigram(ch: str) -> str:
    if ch < "\x80":
        return ch.lower()
    return TRIGRAM_FOLDS.get(ord(ch), ch)


def _utf8_len(ch: str) -> int:
    code = ord(ch)
    return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4


class _Token(NamedTuple):
    text: str
    start: int  # UTF-8 byte offset of its first byte
    end: int  # UTF-8 byte offset just past its last byte


#: A token: a token character, then token characters or diacritics (which start none).
_WORD_TOKEN = re.compile(f"[{TOKEN_CHARS}][{TOKEN_CHARS}{DIACRITICS}]*")
_ASCII_TOKEN = re.compile("[0-9A-Za-z]+")


def _word_tokens(text: str) -> list[_Token]:
    """Tokenize like unicode61 (remove_diacritics=1, no tokenchars or separators)."""
    if text.isascii():  # offsets in characters are offsets in bytes
        return [
            _Token(match.group().lower(), match.start(), match.end())
            for match in _ASCII_TOKEN.finditer(text)
        ]
    tokens: list[_Token] = []
    chars = offset = 0  # the last token's end, in characters and in UTF-8 bytes
    for match in _WORD_TOKEN.finditer(text):
        begin, end = match.span()
        start = offset + _utf8_size(text[chars:begin])
        offset = start + _utf8_size(match.group())
        chars = end
        tokens.append(_Token(match.group().translate(WORD_FOLDS), start, offset))
    return tokens


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _trigram_tokens(text: str) -> list[_Token]:
    """Tokenize like trigram (case_sensitive=0): one token per run of three characters."""
    cut = text.find("\x00")
    if cut >= 0:
        text = text[:cut]
    folded = [_fold_trigram(ch) for ch in text]
    offsets = [0]
    for ch in text:
        offsets.append(offsets[-1] + _utf8_len(ch))
    return [
        _Token("".join(folded[i : i + 3]), offsets[i], offsets[i + 3]) for i in range(len(text) - 2)
    ]


# --- phrase instances -------------------------------------------------------------------

_Pattern = list[tuple[str, bool]]  # folded tokens of a phrase, each with its prefix flag


def _word_pattern(phrase: Phrase) -> _Pattern:
    pattern: _Pattern = []
    for text, prefix in phrase:
        pattern.extend((token.text, False) for token in _word_tokens(text))
        # FTS5 sets (or clears) the prefix flag of the phrase's last token so far, even
        # when this string brought no token of its own.
        if pattern:
            pattern[-1] = (pattern[-1][0], prefix)
    return pattern


def _positions(doc: list[str], pattern: _Pattern) -> list[int]:
    """Every position where the phrase's tokens follow one another in the document."""
    if not pattern:
        return []
    size = len(pattern)
    found = []
    for pos in range(len(doc) - size + 1):
        for k, (want, prefix) in enumerate(pattern):
            have = doc[pos + k]
            if not (have.startswith(want) if prefix else have == want):
                break
        else:
            found.append(pos)
    return found


def _trim_near(lists: list[list[int]], sizes: list[int], distance: int) -> list[list[int]]:
    """Keep the instances of each phrase of a NEAR group that take part in a match.

    The same sweep as FTS5: a cursor per phrase; find a set of current instances that all
    lie within ``distance`` tokens (plus the phrase's own length) of the latest one, record
    them, then step the cursor whose next instance comes first.
    """
    count = len(lists)
    if count < 2:
        return lists
    kept: list[list[int]] = [[] for _ in lists]
    if any(not positions for positions in lists):
        return kept
    cursor = [0] * count

    def ahead(i: int) -> float:
        nxt = cursor[i] + 1
        return lists[i][nxt] if nxt < len(lists[i]) else float("inf")

    while True:
        latest = lists[0][cursor[0]]
        settled = False
        while not settled:
            settled = True
            for i in range(count):
                lowest = latest - sizes[i] - distance
                here = lists[i][cursor[i]]
                if here < lowest or here > latest:
                    settled = False
                    while lists[i][cursor[i]] < lowest:
                        cursor[i] += 1
                        if cursor[i] == len(lists[i]):
                            return kept
                    latest = max(latest, lists[i][cursor[i]])
        for i in range(count):
            here = lists[i][cursor[i]]
            if not kept[i] or kept[i][-1] != here:
                kept[i].append(here)
        step = 0
        for i in range(1, count):
            if ahead(i) < ahead(step):
                step = i
        cursor[step] += 1
        if cursor[step] == len(lists[step]):
            return kept


_Partial = dict[frozenset[int], dict[int, list[int]]]


def _counting(
    lists: list[list[int]],
    sizes: list[int],
    groups: Sequence[Group] | None,
    partial: _Partial | None = None,
) -> list[list[int]]:
    """Empty the instance lists of the phrases that do not count on this row.

    A phrase with no token (a quoted string of separators) is dropped by FTS5 from its
    operand; an operand left with none matches nothing. ``partial`` holds, for each NEAR
    group left half-tested on this row, the instances FTS5 still reports (see
    ``_half_tested``): they count when the group is an operand of its own, an OR branch or
    the right side of a NOT (no AND above it clears them).
    """
    if groups is None:
        return lists
    counted: dict[int, list[int]] = {}
    for required, forbidden in groups:
        operands = [[i for i in operand if sizes[i]] for operand in required]
        if not operands or not all(operands):
            continue  # an operand left without tokens matches nothing
        negated = [[i for i in operand if sizes[i]] for operand in forbidden]
        if any(operand and all(lists[i] for i in operand) for operand in negated):
            continue
        if all(lists[i] for operand in operands for i in operand):
            counted.update((i, lists[i]) for operand in operands for i in operand)
            # A half-tested NEAR group that is a NOT operand of its own stays on the row.
            for operand in negated:
                counted.update((partial or {}).get(frozenset(operand), {}))
        elif partial and len(operands) == 1 and frozenset(operands[0]) in partial:
            counted.update(partial[frozenset(operands[0])])
    return [counted.get(i, []) for i in range(len(lists))]


def _half_tested(
    words: list[str], patterns: list[_Pattern], lists: list[list[int]], members: list[int]
) -> dict[int, list[int]]:
    """What FTS5 still reports of a NEAR group that did not match the row.

    When every token of the group occurs in the row, FTS5 tests its phrases in order and
    stops at the first one that does not occur as a phrase; those tested before keep all
    of their instances. Unless an AND above it clears them, they show in the snippet.
    """
    vocabulary = set(words)

    def present(token: str, prefix: bool) -> bool:
        if not prefix:
            return token in vocabulary
        return any(word.startswith(token) for word in vocabulary)

    if not all(present(*term) for i in members for term in patterns[i]):
        return {}
    for j, i in enumerate(members):
        if not lists[i]:
            return {k: lists[k] for k in members[:j]}
    return {}


# --- the snippet ------------------------------------------------------------------------


class _Instance(NamedTuple):
    pos: int
    phrase: int
    size: int


def _instances(lists: list[list[int]], sizes: list[int]) -> list[_Instance]:
    """All instances in FTS5's xInst order: by position, then by phrase number."""
    return sorted(
        _Instance(pos, phrase, sizes[phrase])
        for phrase, positions in enumerate(lists)
        for pos in positions
    )


def _cdiv2(value: int) -> int:
    """``value / 2`` rounded toward zero, as C divides."""
    return value // 2 if value >= 0 else -((-value) // 2)


def _window_score(
    insts: list[_Instance],
    starts: list[int],
    phrases: list[list[int]],
    first: int,
    tokens: int,
    doc_size: int,
) -> tuple[int, int]:
    """Score the window of ``tokens`` tokens from ``first``, and where to centre it.

    ``starts`` are the instances' positions and ``phrases`` each phrase's own, to find the
    window's instances by bisection (FTS5 scans them all: 1000 for each phrase seen first
    in the window, 1 for each repeat, the same sum).
    """
    low = bisect.bisect_left(starts, first)
    high = bisect.bisect_left(starts, first + tokens) if tokens > 0 else low
    if high - low <= len(phrases):
        seen = len({inst.phrase for inst in insts[low:high]})
    else:
        seen = sum(
            bisect.bisect_left(own, first) < bisect.bisect_left(own, first + tokens)
            for own in phrases
        )
    score = 1000 * seen + (high - low - seen)
    lead, last = -1, 0  # no instance in the window: FTS5's initial values
    if low < high:
        lead = starts[low]
        last = insts[high - 1].pos + insts[high - 1].size
    centred = lead - _cdiv2(tokens - (last - lead))
    if centred + tokens > doc_size:
        centred = doc_size - tokens
    return score, max(centred, 0)


def _sentence_starts(data: bytes, doc: list[_Token]) -> list[int]:
    starts: list[int] = []
    for pos, token in enumerate(doc):
        if pos == 0:
            starts.append(0)
            continue
        i = token.start - 1
        while i >= 0 and data[i] in b" \t\n\r":
            i -= 1
        if i != token.start - 1 and i >= 0 and data[i] in b".:":
            starts.append(pos)
    return starts


def _best_start(data: bytes, doc: list[_Token], insts: list[_Instance], tokens: int) -> int:
    doc_size = len(doc)
    starts = _sentence_starts(data, doc)
    best_score = 0
    best_start = 0
    positions = [inst.pos for inst in insts]
    phrases: dict[int, list[int]] = {}
    for inst in insts:
        phrases.setdefault(inst.phrase, []).append(inst.pos)
    own = list(phrases.values())
    previous = -1
    for inst in insts:
        if inst.pos == previous:  # the same windows as the instance before: no better score
            continue
        previous = inst.pos
        score, centred = _window_score(insts, positions, own, inst.pos, tokens, doc_size)
        if score > best_score:
            best_score, best_start = score, centred
        if starts and doc_size > tokens:
            sentence = starts[bisect.bisect_right(starts, inst.pos) - 1]
            if sentence < inst.pos:
                score, _ = _window_score(insts, positions, own, sentence, tokens, doc_size)
                score += 120 if sentence == 0 else 100
                if score > best_score:
                    best_score, best_start = score, sentence
    return best_start


def _merged(insts: list[_Instance]) -> list[tuple[int, int]]:
    """Instances merged where they share tokens: (first token, last token) of each."""
    merged: list[tuple[int, int]] = []
    for inst in insts:
        last = inst.pos + inst.size - 1
        if merged and inst.pos <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((inst.pos, last))
    return merged


class _Output:
    """The result as FTS5 builds it: C strings, so a piece stops at its first NUL byte."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.parts: list[bytes] = []

    def add(self, piece: bytes) -> None:
        self.parts.append(piece.split(b"\x00", 1)[0])

    def copy(self, begin: int, end: int) -> None:
        # A negative length makes FTS5 copy everything up to the end of the text.
        self.add(self.data[begin:end] if end >= begin else self.data[begin:])


def _render(
    data: bytes,
    doc: list[_Token],
    insts: list[_Instance],
    tokens: int,
    marks: tuple[bytes, bytes, bytes],
    cut: tuple[bool, bool] = (False, False),
) -> str:
    """FTS5's snippet of ``data``; ``cut`` says whether the text went on before and after
    ``data`` (a bounded snippet's window, cut at tokens): an ellipsis stands for that text,
    as FTS5 writes one for the tokens it leaves out."""
    start_mark, end_mark, ellipsis = marks
    cut_before, cut_after = cut
    best = _best_start(data, doc, insts, tokens)
    range_start, range_end = best, best + tokens - 1
    merged = [span for span in _merged(insts) if span[0] >= best]
    out = _Output(data)
    if best > 0 or cut_before:
        out.add(ellipsis)
    k = 0
    span = merged[0] if merged else (-1, -1)
    offset = 0
    for pos, token in enumerate(doc):
        if range_end > 0:
            if pos < range_start or pos > range_end:
                continue
            if (range_start or cut_before) and pos == range_start:
                offset = token.start
        if pos == span[0]:
            out.copy(offset, token.start)
            out.add(start_mark)
            offset = token.start
        if pos == span[1]:
            if range_end and span[0] < range_start:
                out.add(start_mark)
            out.copy(offset, token.end)
            out.add(end_mark)
            offset = token.end
            k += 1
            span = merged[k] if k < len(merged) else (-1, -1)
        if range_end > 0 and pos == range_end:
            out.copy(offset, token.end)
            offset = token.end
            if span[0] <= pos < span[1]:
                out.add(end_mark)
    if range_end < len(doc) - 1:
        out.add(ellipsis)
    elif cut_after:
        if doc and doc[-1].end > offset:
            out.copy(offset, doc[-1].end)
        out.add(ellipsis)
    else:
        out.copy(offset, len(data))
    return b"".join(out.parts).decode("utf-8", "replace")


def _snippet(
    text: str,
    doc: list[_Token],
    lists: list[list[int]],
    sizes: list[int],
    tokens: int,
    marks: tuple[str, str, str],
    cut: tuple[bool, bool] = (False, False),
) -> str:
    data = text.encode("utf-8", "surrogatepass")
    encoded = (marks[0].encode(), marks[1].encode(), marks[2].encode())
    return _render(data, doc, _instances(lists, sizes), tokens, encoded, cut)


def _word_instances(
    text: str, phrases: Sequence[Phrase], near: Sequence[Near]
) -> tuple[list[_Token], list[list[int]], list[int], _Partial]:
    """The document's tokens, each phrase's instances after NEAR trimming, each phrase's
    size in tokens, and what half-tested NEAR groups still report."""
    doc = _word_tokens(text)
    words = [token.text for token in doc]
    patterns = [_word_pattern(phrase) for phrase in phrases]
    sizes = [len(pattern) for pattern in patterns]
    lists = [_positions(words, pattern) for pattern in patterns]
    partial: _Partial = {}
    for group, distance in near:
        members = [i for i in group if sizes[i]]
        trimmed = _trim_near([lists[i] for i in members], [sizes[i] for i in members], distance)
        if len(members) > 1 and not any(trimmed):
            partial[frozenset(members)] = _half_tested(words, patterns, lists, members)
        for i, positions in zip(members, trimmed, strict=True):
            lists[i] = positions
    return doc, lists, sizes, partial


def word_snippet(
    text: str,
    phrases: Sequence[Phrase],
    *,
    near: Sequence[Near] = (),
    groups: Sequence[Group] | None = None,
    tokens: int = 40,
    start: str = ">>>",
    end: str = "<<<",
    ellipsis: str = "...",
) -> str:
    """What ``snippet(fts, 0, start, end, ellipsis, tokens)`` returns on a unicode61 index.

    ``text`` is the indexed text of the row; ``phrases``, ``near`` and ``groups`` describe
    the query (see the module docstring).
    """
    doc, lists, sizes, partial = _word_instances(text, phrases, near)
    lists = _counting(lists, sizes, groups, partial)
    return _snippet(text, doc, lists, sizes, tokens, (start, end, ellipsis))


def trigram_snippet(
    text: str,
    substrings: Sequence[str],
    *,
    groups: Sequence[Group] | None = None,
    tokens: int = 40,
    start: str = ">>>",
    end: str = "<<<",
    ellipsis: str = "...",
) -> str:
    """What ``snippet(fts, 0, start, end, ellipsis, tokens)`` returns on a trigram index.

    ``substrings`` are the quoted tokens of the MATCH expression, in query order; ``groups``
    as for :func:`word_snippet`, with indexes into ``substrings``.
    """
    doc = _trigram_tokens(text)
    grams = [token.text for token in doc]
    patterns: list[_Pattern] = [
        [(token.text, False) for token in _trigram_tokens(sub)] for sub in substrings
    ]
    sizes = [len(pattern) for pattern in patterns]
    lists = _counting([_positions(grams, pattern) for pattern in patterns], sizes, groups)
    return _snippet(text, doc, lists, sizes, tokens, (start, end, ellipsis))


# --- bounded snippets -------------------------------------------------------------------
# FTS5 scores a window at every instance of the query's phrases against every other
# instance: its time grows with the square of the instances in the row (a 1 MB text full
# of the term took 5 s, 10 MB over 10 minutes). Search asks for FTS5's own snippet only
# where that stays small, and makes the others here, from a window of the text.

#: The most instances of a query's phrases a text may hold for its snippet to be FTS5's
#: own (FTS5's time for 1,000: about 10 ms).
EXACT_INSTANCES = 1000
#: A bounded snippet's window, in characters of the indexed text: it starts WINDOW_BEFORE
#: characters before the first instance of a marked phrase (or at the text's start).
WINDOW_CHARS = 16384
WINDOW_BEFORE = 2048

_WORDISH = f"{TOKEN_CHARS}{DIACRITICS}"
_WORDISH_CHAR = re.compile(f"[{_WORDISH}]")
_WORDISH_RUN = re.compile(f"[{_WORDISH}]*")
_WORDISH_TAIL = re.compile(f"[{_WORDISH}]+\\Z")


def _either(folded: str, sources: dict[str, str]) -> str:
    """A regular expression class of the characters that fold to ``folded``."""
    return "[" + "".join(re.escape(ch) for ch in sources.get(folded, folded)) + "]"


def _word_regex(pattern: _Pattern, ascii_text: bool) -> str | None:
    """A regular expression finding where the phrase's instances start in a text, as
    unicode61 tokenises and folds it (in an ASCII text lower-cased: ASCII classes only);
    None when the phrase cannot occur in such a text."""
    if ascii_text:
        if not all(_ASCII_TOKEN.fullmatch(text) for text, _prefix in pattern):
            return None
        words = [re.escape(text) for text, _prefix in pattern]
        separators, wordish = "[^0-9a-z]+", "[0-9a-z]"
        # The first token as a literal (a fast search), then that it starts a token.
        first = f"{words[0]}(?<!{wordish}{words[0]})"
    else:
        diacritics = f"[{DIACRITICS}]*"
        words = [
            "".join(_either(ch, WORD_SOURCES) + diacritics for ch in text)
            for text, _prefix in pattern
        ]
        # Between two tokens: a separator, then anything but a token character (a
        # diacritic after a separator separates).
        separators, wordish = f"[^{_WORDISH}][^{TOKEN_CHARS}]*", f"[{_WORDISH}]"
        head = _either(pattern[0][0][0], WORD_SOURCES)
        # A token starts after a character that is neither a token character nor a
        # diacritic (which continues a token), and after any diacritics that follow it.
        start = f"(?:{head}(?<!{wordish}.)|[{DIACRITICS}](?<!{wordish}.){diacritics}{head})"
        first = start + words[0][len(head) :]
    last = len(pattern) - 1
    # A whole token ends before a token character; a prefix goes on to its token's end,
    # unless it is the phrase's last.
    ends = [
        "" if prefix and k == last else f"{wordish}*" if prefix else f"(?!{wordish})"
        for k, (_text, prefix) in enumerate(pattern)
    ]
    rest = "".join(separators + words[k] + ends[k] for k in range(1, len(pattern)))
    return first + ends[0] + rest


def _trigram_regex(substring: str, ascii_text: bool) -> str | None:
    """A regular expression finding a quoted trigram token in a text, folded as the trigram
    tokenizer folds (in an ASCII text lower-cased)."""
    folded = "".join(_fold_trigram(ch) for ch in substring)
    if len(folded) < 3:
        return None
    if ascii_text:
        return re.escape(folded) if folded.isascii() else None
    return "".join(
        re.escape(ch) if TRIGRAM_SOURCES.get(ch, ch) == ch else _either(ch, TRIGRAM_SOURCES)
        for ch in folded
    )


_compiled = functools.lru_cache(maxsize=256)(re.compile)


class _Finder:
    """Where a query's phrases occur in one text, by regular expressions (the tokenizer in
    Python takes about a second a megabyte)."""

    def __init__(self, text: str, phrases: Sequence[Phrase] | Sequence[str], trigram: bool):
        ascii_text = text.isascii()
        if trigram:
            cut = text.find("\x00")  # the trigram tokenizer stops at a NUL
            text = text if cut < 0 else text[:cut]
            regexes = [_trigram_regex(str(sub), ascii_text) for sub in phrases]
        else:
            patterns = [_word_pattern(phrase) for phrase in phrases]  # type: ignore[arg-type]
            regexes = [_word_regex(p, ascii_text) if p else None for p in patterns]
        self.text = text.lower() if ascii_text else text
        self.finders = [_compiled(regex) if regex else None for regex in regexes]

    def first(self, marked: Sequence[int]) -> int | None:
        """The character offset of the first instance of a marked phrase, if any."""
        found = [
            match.start()
            for i in marked
            if (finder := self.finders[i]) is not None
            and (match := finder.search(self.text)) is not None
        ]
        return min(found, default=None)

    def more_than(self, limit: int) -> bool:
        """Whether the phrases have more than ``limit`` instances in all."""
        count = 0
        for finder in self.finders:
            if finder is None:
                continue
            match = finder.search(self.text)
            while match is not None:
                count += 1
                if count > limit:
                    return True
                match = finder.search(self.text, match.start() + 1)
        return False


def _marked(count: int, groups: Sequence[Group] | None) -> list[int]:
    """The phrases a bounded snippet marks: all of them, or those of a group's operands
    (never the right side of a NOT)."""
    if groups is None:
        return list(range(count))
    return sorted({i for operands, _negated in groups for operand in operands for i in operand})


def _window(text: str, anchor: int | None, *, words: bool) -> tuple[int, int]:
    """A bounded snippet's window (character offsets): WINDOW_CHARS from WINDOW_BEFORE before
    the anchor, less a word token that an edge cuts."""
    begin = 0 if anchor is None else max(anchor - WINDOW_BEFORE, 0)
    finish = min(begin + WINDOW_CHARS, len(text))
    if words:
        wordish = _WORDISH_CHAR
        if begin > 0 and wordish.match(text, begin - 1) and wordish.match(text, begin):
            begin = _WORDISH_RUN.match(text, begin).end()  # type: ignore[union-attr]
        if finish < len(text) and wordish.match(text, finish - 1) and wordish.match(text, finish):
            tail = _WORDISH_TAIL.search(text, begin, finish)
            finish = tail.start() if tail is not None else begin
    return begin, finish


def exact_is_bounded(
    text: str, phrases: Sequence[Phrase] | Sequence[str], *, trigram: bool = False
) -> bool:
    """Whether FTS5's own snippet of ``text`` for these phrases (word phrases, or a
    trigram query's quoted tokens) stays bounded: at most EXACT_INSTANCES instances."""
    return not _Finder(text, phrases, trigram).more_than(EXACT_INSTANCES)


def bounded_word_snippet(
    text: str,
    phrases: Sequence[Phrase],
    *,
    near: Sequence[Near] = (),
    groups: Sequence[Group] | None = None,
    tokens: int = 40,
    start: str = ">>>",
    end: str = "<<<",
    ellipsis: str = "...",
) -> str:
    """A snippet of bounded cost for any text: FTS5's snippet of a window of it.

    The window is WINDOW_CHARS characters of ``text`` from WINDOW_BEFORE before the first
    instance of a marked phrase (every phrase, or with ``groups`` those of the groups'
    operands; without any instance, from the start), less a token an edge cuts. It is
    snippeted as if it were the whole text, each marked phrase marked wherever it occurs
    in it (NEAR groups trimmed within it), with ``ellipsis`` where it cuts the text.
    """
    marked = _marked(len(phrases), groups)
    begin, finish = _window(text, _Finder(text, phrases, False).first(marked), words=True)
    window = text[begin:finish]
    doc, lists, sizes, _partial = _word_instances(window, phrases, near)
    lists = [positions if i in marked else [] for i, positions in enumerate(lists)]
    cut = (begin > 0, finish < len(text))
    return _snippet(window, doc, lists, sizes, tokens, (start, end, ellipsis), cut)


def bounded_trigram_snippet(
    text: str,
    substrings: Sequence[str],
    *,
    groups: Sequence[Group] | None = None,
    tokens: int = 40,
    start: str = ">>>",
    end: str = "<<<",
    ellipsis: str = "...",
) -> str:
    """:func:`bounded_word_snippet` for a trigram query (a window of characters: every
    trigram in it is whole)."""
    marked = _marked(len(substrings), groups)
    begin, finish = _window(text, _Finder(text, substrings, True).first(marked), words=False)
    window = text[begin:finish]
    doc = _trigram_tokens(window)
    grams = [token.text for token in doc]
    lists = [
        _positions(grams, [(token.text, False) for token in _trigram_tokens(sub)])
        if i in marked
        else []
        for i, sub in enumerate(substrings)
    ]
    sizes = [len(_trigram_tokens(sub)) for sub in substrings]
    cut = (begin > 0, finish < len(text))
    return _snippet(window, doc, lists, sizes, tokens, (start, end, ellipsis), cut)
