"""The query language shared by both databases: sanitising, CJK routing, term bounds."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
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
class Route:
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


def index_query(query: str) -> str:
    """The query as the contract sends it to an index; empty when there is nothing to search
    (an empty or all-whitespace query, or nothing left after sanitising)."""
    if not query or not query.strip():
        return ""
    return without_repeats(sanitize_query(query))


_TOKEN = re.compile(r'"(?:[^"]|"")*"|[^ ]+')


def _term_key(token: str) -> str:
    """Tokens with equal keys match the same rows: ASCII case folded (as unicode61 and the
    trigram tokenizer fold it), anything else compared as written."""
    return token.translate(ASCII_LOWER)


ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


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


def check_bounded(route: Route) -> None:
    if route.index is not None and (terms := _count_terms(route.match)) > MAX_SEARCH_TERMS:
        raise QueryTooComplex(
            f"the search query has {terms} distinct terms; at most {MAX_SEARCH_TERMS} are "
            "searched at once (each one multiplies the index's work on every matching "
            "message): keep the words that matter"
        )


def _quote_token(token: str) -> str:
    """Quote one token as an FTS5 string, doubling inner quotes."""
    return '"' + token.replace('"', '""') + '"'


def route_query(sanitized: str, *, trigram: bool) -> Route:
    """Pick the index (or the LIKE scan) that answers a sanitised query."""
    if not contains_cjk(sanitized):
        return Route(WORD_INDEX, sanitized, ())
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
        return Route(TRIGRAM_INDEX, match, like_tokens)
    return Route(None, "", like_tokens)


def escape_like(token: str) -> str:
    """Escape ``\\``, ``%`` and ``_`` for a LIKE pattern with ``\\`` as the escape character."""
    return token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def reduced(tokens: Sequence[str]) -> list[str]:
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


def normalise_sort(sort: object) -> str | None:
    """Return ``"newest"`` or ``"oldest"`` (case-insensitive, trimmed), else None (rank)."""
    if isinstance(sort, str) and sort.strip().lower() in ("newest", "oldest"):
        return sort.strip().lower()
    return None


# -- the FTS5 query language as a tree ------------------------------------------------------
# What a sanitised query means, so that a database without FTS5 can answer it: the grammar
# of SQLite's fts5parse.y (3.40), checked against FTS5 itself by tests/test_search_parser.py.
# Binding, tightest first: a run of adjacent phrases / NEAR groups (implicit AND), NOT, AND,
# OR; all left-associative. Only phrases and NEAR groups join implicitly: `(a) b` is an
# error, as are `-`, `:`, `{`, `}` and `^` here (column filters and initial-token queries,
# which the sanitiser never lets through). A phrase without tokens (`"..."`) matches
# nothing, and is dropped where it is one of an implicit AND's operands; inside a NEAR
# group it is ignored.

#: FTS5's default NEAR distance.
NEAR_DISTANCE = 10


class QuerySyntaxError(ValueError):
    """FTS5 would reject this MATCH expression (the search then answers no rows)."""

    def __init__(self, message: str, near: str | None = None) -> None:
        super().__init__(message)
        #: The token (or character) FTS5 stops at; "" at the end of the query.
        self.near = near


@dataclass(frozen=True)
class Phrase:
    """Consecutive tokens; a token marked as prefix matches any token it starts.

    ``text`` is each written segment of the phrase (a bareword, or a string's contents),
    so a database can tokenise them itself; ``tokens`` is how FTS5 tokenised them.
    """

    tokens: tuple[tuple[str, bool], ...]
    text: tuple[tuple[str, bool], ...]


@dataclass(frozen=True)
class Near:
    """NEAR(p1 p2 ..., distance): every phrase, each ending at most ``distance`` tokens
    before the start of the last one to start."""

    phrases: tuple[Phrase, ...]
    distance: int


@dataclass(frozen=True)
class And:
    """Every operand matches."""

    operands: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    """At least one operand matches."""

    operands: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    """``positive`` matches and ``negative`` does not (FTS5's binary NOT)."""

    positive: Node
    negative: Node


@dataclass(frozen=True)
class Nothing:
    """Matches no row: what a phrase without tokens becomes (FTS5's EOF node)."""


Node = Phrase | Near | And | Or | Not | Nothing
NOTHING = Nothing()

_FTS5_SPACE = " \t\n\r"
_FTS5_PUNCTUATION = "(){}:,+*-^"


def _is_bareword(char: str) -> bool:
    """sqlite3Fts5IsBareword: non-ASCII, ASCII letters and digits, `_`, and 0x1A."""
    return char >= "\x80" or char.isalnum() or char in "_\x1a"


def _lex(expression: str) -> list[tuple[str, str]]:
    """FTS5's tokens of a MATCH expression: (kind, text); kind is the punctuation itself,
    "STRING" (bareword or quoted), "QUOTED", or an operator ("AND", "OR", "NOT")."""
    text = expression.split("\0", 1)[0]  # FTS5 reads the expression up to its first NUL
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char in _FTS5_SPACE:
            position += 1
        elif char in _FTS5_PUNCTUATION:
            tokens.append((char, char))
            position += 1
        elif char == '"':
            pieces, position = [], position + 1
            while True:
                end = text.find('"', position)
                if end == -1:
                    raise QuerySyntaxError("unterminated string", '"')
                pieces.append(text[position:end])
                if text.startswith('"', end + 1):  # "" inside a string is one quote
                    pieces.append('"')
                    position = end + 2
                else:
                    position = end + 1
                    break
            tokens.append(("QUOTED", "".join(pieces)))
        elif _is_bareword(char):
            start = position
            while position < len(text) and _is_bareword(text[position]):
                position += 1
            word = text[start:position]
            tokens.append((word if word in _OPERATORS else "STRING", word))
        else:
            raise QuerySyntaxError(f"syntax error near {char!r}", char)
    return tokens


def _is_token_char(char: str) -> bool:
    """unicode61's token characters (categories L*, N*, Co; marks are folded away)."""
    category = unicodedata.category(char)
    return category[0] in "LNM" or category == "Co"


def _fold_token(token: str) -> str:
    """unicode61's folding (remove_diacritics=1): lower case, without combining marks."""
    decomposed = unicodedata.normalize("NFD", token.lower())
    return unicodedata.normalize(
        "NFC", "".join(char for char in decomposed if not unicodedata.combining(char))
    )


def word_tokens(text: str) -> list[str]:
    """The tokens unicode61 makes of ``text`` (an approximation in Python, exact for the
    letters and digits of the Latin, Greek, Cyrillic and CJK scripts)."""
    tokens, current = [], []
    for char in text:
        if _is_token_char(char):
            current.append(char)
        elif current:
            tokens.append("".join(current))
            current = []
    if current:
        tokens.append("".join(current))
    return [folded for token in tokens if (folded := _fold_token(token))]


def trigram_tokens(text: str) -> list[str]:
    """The trigram tokenizer's view of a query string: the whole string, matched as a
    substring when it has at least 3 characters, else nothing."""
    return [text] if len(text) >= 3 else []


class _Parser:
    """Recursive descent over _lex's tokens, one method per rule of fts5parse.y."""

    def __init__(self, expression: str, tokenize: Callable[[str], list[str]]) -> None:
        self.tokens = _lex(expression)
        self.position = 0
        self.tokenize = tokenize

    def peek(self, offset: int = 0) -> str | None:
        index = self.position + offset
        return self.tokens[index][0] if index < len(self.tokens) else None

    def take(self, kind: str | None = None) -> tuple[str, str]:
        if self.position >= len(self.tokens):
            raise QuerySyntaxError("unexpected end of query", "")
        token = self.tokens[self.position]
        if kind is not None and token[0] != kind:
            raise QuerySyntaxError(f"syntax error near {token[1]!r}", token[1])
        self.position += 1
        return token

    def query(self) -> Node:
        node = self.binary(0)
        if self.position != len(self.tokens):
            near = self.tokens[self.position][1]
            raise QuerySyntaxError(f"syntax error near {near!r}", near)
        return node

    _LEVELS = ("OR", "AND", "NOT")

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        operator = self._LEVELS[level]
        node = self.binary(level + 1)
        while self.peek() == operator:
            self.take()
            right = self.binary(level + 1)
            node = Not(node, right) if operator == "NOT" else _join(operator, node, right)
        return node

    def unary(self) -> Node:
        if self.peek() == "(":
            self.take()
            node = self.binary(0)
            self.take(")")
            return node
        operands = [self.nearset()]
        while self.peek() in ("STRING", "QUOTED"):
            operands.append(self.nearset())
        kept = [node for node in operands if not isinstance(node, Nothing)]
        if not kept:
            return NOTHING
        return kept[0] if len(kept) == 1 else And(tuple(kept))

    def nearset(self) -> Node:
        if self.peek() == "STRING" and self.peek(1) == "(":
            word = self.take()[1]
            if word != "NEAR":
                raise QuerySyntaxError(f"syntax error near {word!r}", word)
            self.take("(")
            phrases = [self.phrase()]
            while self.peek() in ("STRING", "QUOTED"):
                phrases.append(self.phrase())
            distance = NEAR_DISTANCE
            if self.peek() == ",":
                self.take()
                number = self.take()[1]
                if not number.isascii() or not number.isdigit():
                    raise QuerySyntaxError(f"expected integer, got {number!r}", number)
                distance = int(number)
            self.take(")")
            kept = tuple(phrase for phrase in phrases if phrase.tokens)
            if not kept:
                return NOTHING
            return kept[0] if len(kept) == 1 else Near(kept, distance)
        phrase = self.phrase()
        return phrase if phrase.tokens else NOTHING

    def phrase(self) -> Phrase:
        tokens: list[tuple[str, bool]] = []
        texts: list[tuple[str, bool]] = []
        while True:
            kind, text = self.take()
            if kind not in ("STRING", "QUOTED"):
                raise QuerySyntaxError(f"syntax error near {text!r}", text)
            prefix = self.peek() == "*"
            if prefix:
                self.take()
            words = self.tokenize(text)
            tokens += [(word, prefix and i == len(words) - 1) for i, word in enumerate(words)]
            texts.append((text, prefix))
            if self.peek() != "+":
                return Phrase(tuple(tokens), tuple(texts))
            self.take()


def _join(operator: str, left: Node, right: Node) -> Node:
    """``left AND right`` or ``left OR right``, flattened."""
    kind = And if operator == "AND" else Or
    operands: list[Node] = []
    for node in (left, right):
        operands += node.operands if isinstance(node, kind) else [node]
    return kind(tuple(operands))


def parse_query(expression: str, *, trigram: bool = False) -> Node:
    """The tree of an FTS5 MATCH expression (a sanitised query; for the trigram index, the
    route's match string). Raises QuerySyntaxError where FTS5 reports an error."""
    return _Parser(expression, trigram_tokens if trigram else word_tokens).query()


_SYNTAX_HELP = "`hermes-store search --help` shows the syntax"
#: SearchResults.query_error of a query holding text no database can store.
UNSTORABLE_QUERY = (
    "the query was not understood: it holds text that is not valid UTF-8 (a lone surrogate; "
    "on the command line, bytes that are not UTF-8), which no message can contain, so "
    f"nothing matches it; {_SYNTAX_HELP}"
)


def storable(text: str) -> bool:
    """Whether a database can hold ``text`` (UTF-8 cannot encode a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def not_understood(match: str, *, trigram: bool = False) -> str:
    """Why FTS5 rejects a sanitised query, in one line a person can act on.

    It names the query's own characters only, never anything of a message.
    """
    try:
        parse_query(match, trigram=trigram)
        near = None
    except QuerySyntaxError as exc:
        near = exc.near
    if near == "" or near in _OPERATORS:
        why = (
            "AND, OR and NOT each go between two terms (`docker NOT compose` finds docker "
            "without compose; `docker AND NOT compose` is not understood)"
        )
    elif near == "-":
        why = (
            "`-` is no operator: write `docker NOT compose` to leave compose out, or put a "
            'word that starts with `-` in double quotes ("-docker")'
        )
    elif near is not None and len(near) == 1:
        shown = f"`{near}`" if near.isprintable() else f"U+{ord(near):04X}"
        why = (
            f"{shown} is not part of the query syntax: put the word that holds it in double "
            'quotes ("C#") or leave it out'
        )
    else:
        why = "the search index rejects it"
    return f"the query was not understood: {why}; {_SYNTAX_HELP}"


def simplify(node: Node) -> Node:
    """The same matches with Nothing propagated: an AND with Nothing, or a NOT whose left
    side is Nothing, is Nothing; Nothing leaves an OR and the right side of a NOT."""
    if isinstance(node, And):
        operands = [simplify(operand) for operand in node.operands]
        if any(isinstance(operand, Nothing) for operand in operands):
            return NOTHING
        return And(tuple(operands))
    if isinstance(node, Or):
        kept = [o for o in map(simplify, node.operands) if not isinstance(o, Nothing)]
        if not kept:
            return NOTHING
        return kept[0] if len(kept) == 1 else Or(tuple(kept))
    if isinstance(node, Not):
        positive, negative = simplify(node.positive), simplify(node.negative)
        if isinstance(positive, Nothing) or isinstance(negative, Nothing):
            return positive
        return Not(positive, negative)
    return node


def phrases_of(node: Node) -> list[Phrase]:
    """Every phrase of the tree with tokens, in query order (NEAR groups' included)."""
    if isinstance(node, Phrase):
        return [node]
    if isinstance(node, Near):
        return list(node.phrases)
    if isinstance(node, And | Or):
        return [phrase for operand in node.operands for phrase in phrases_of(operand)]
    if isinstance(node, Not):
        return phrases_of(node.positive) + phrases_of(node.negative)
    return []


#: One AND-ed part of an OR (see Highlight.groups): (operands, negated), each a list of
#: operands, an operand the indexes of the phrases written side by side.
Group = tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]


@dataclass(frozen=True)
class Highlight:
    """What a snippet marks (the arguments of hermes_store.search.snippet's functions).

    ``phrases``: each phrase as its written segments, (text, is_prefix), in query order.
    ``near``: each NEAR group as (indexes of its phrases, distance). ``groups``: the query
    as an OR of groups, each (operands joined by AND, the right sides of its NOT
    operators): FTS5 highlights a phrase only where the group holding it matched the row;
    None when the query has parentheses (no such shape).
    """

    phrases: tuple[tuple[tuple[str, bool], ...], ...]
    near: tuple[tuple[tuple[int, ...], int], ...]
    groups: tuple[Group, ...] | None


def highlight_of(node: Node) -> Highlight:
    """The phrases, NEAR groups and groups a snippet highlighter needs for a query tree
    (as parsed: a phrase without tokens stays an empty operand, as FTS5 keeps it)."""
    phrases: list[tuple[tuple[str, bool], ...]] = []
    near: list[tuple[tuple[int, ...], int]] = []
    indexes: dict[int, tuple[int, ...]] = {}

    def visit(item: Node) -> None:
        if isinstance(item, Phrase):
            indexes[id(item)] = (len(phrases),)
            phrases.append(item.text)
        elif isinstance(item, Near):
            first = len(phrases)
            phrases.extend(phrase.text for phrase in item.phrases)
            indexes[id(item)] = tuple(range(first, len(phrases)))
            near.append((indexes[id(item)], item.distance))
        elif isinstance(item, And | Or):
            for operand in item.operands:
                visit(operand)
        elif isinstance(item, Not):
            visit(item.positive)
            visit(item.negative)

    def run(item: Node) -> tuple[int, ...] | None:
        """The phrases of an operand written side by side; None for anything else."""
        if isinstance(item, Phrase | Near):
            return indexes[id(item)]
        if isinstance(item, Nothing):
            return ()
        if isinstance(item, And) and all(isinstance(o, Phrase | Near) for o in item.operands):
            return tuple(i for operand in item.operands for i in indexes[id(operand)])
        return None

    def groups_of(tree: Node) -> tuple[Group, ...] | None:
        groups: list[Group] = []
        for disjunct in tree.operands if isinstance(tree, Or) else (tree,):
            operands: list[tuple[int, ...]] = []
            negated: list[tuple[int, ...]] = []
            for conjunct in disjunct.operands if isinstance(disjunct, And) else (disjunct,):
                while isinstance(conjunct, Not):
                    right = run(conjunct.negative)
                    if right is None:
                        return None
                    negated.append(right)
                    conjunct = conjunct.positive
                left = run(conjunct)
                if left is None:
                    if isinstance(conjunct, And):  # a side-by-side run ANDed: its parts
                        parts = [run(operand) for operand in conjunct.operands]
                        if any(part is None for part in parts):
                            return None
                        operands.extend(part for part in parts if part is not None)
                        continue
                    return None
                operands.append(left)
            groups.append((tuple(operands), tuple(negated)))
        return tuple(groups)

    visit(node)
    return Highlight(tuple(phrases), tuple(near), groups_of(node))


def matches(node: Node, tokens: Sequence[str]) -> bool:
    """Whether a document of these (folded) tokens matches the tree, as FTS5 decides."""
    if isinstance(node, Phrase):
        return bool(_phrase_starts(node, tokens))
    if isinstance(node, Near):
        return _near_matches(node, tokens)
    if isinstance(node, And):
        return all(matches(operand, tokens) for operand in node.operands)
    if isinstance(node, Or):
        return any(matches(operand, tokens) for operand in node.operands)
    if isinstance(node, Not):
        return matches(node.positive, tokens) and not matches(node.negative, tokens)
    return False


def _phrase_starts(phrase: Phrase, tokens: Sequence[str]) -> list[int]:
    """The positions where ``phrase`` starts in ``tokens``."""
    size = len(phrase.tokens)

    def fits(start: int) -> bool:
        return all(
            tokens[start + i].startswith(word) if prefix else tokens[start + i] == word
            for i, (word, prefix) in enumerate(phrase.tokens)
        )

    return [start for start in range(len(tokens) - size + 1) if fits(start)]


def _near_matches(near: Near, tokens: Sequence[str]) -> bool:
    """fts5ExprNearIsMatch: one instance of each phrase such that every one ends at most
    ``distance`` tokens before the last instance starts."""
    starts = [_phrase_starts(phrase, tokens) for phrase in near.phrases]
    if not all(starts):
        return False
    for latest in {start for positions in starts for start in positions}:
        if all(
            any(
                start <= latest and latest - start - len(phrase.tokens) <= near.distance
                for start in positions
            )
            for phrase, positions in zip(near.phrases, starts, strict=True)
        ):
            return True
    return False
